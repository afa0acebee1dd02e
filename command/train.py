"""`rlperf train`: one training, its per-phase table and SPS; the flags are the config's (reference_trainer/flags.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from reference_trainer.config import TrainConfig
from reference_trainer.flags import add_train_flags, config_from_args
from reference_trainer.progress import run_with_progress
from rlperf.errors import MachineFault, output_file, written_whole


def configure(parser: argparse.ArgumentParser) -> None:
    add_train_flags(parser)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    for path, field in ((args.json, "json"), (args.save_policy, "save_policy")):
        if path:  # checked before the run: a refusal at its end would throw the run away
            output_file(path, field)
    try:
        summary = trained(cfg, args)
    except RuntimeError as exc:
        shortage = out_of_memory(exc)
        if shortage is None:
            raise
        raise MachineFault(f"out of memory: {shortage} (the sizes num_envs, horizon, hidden_size, num_actions "
                           f"and obs_shape set how much the run needs)") from None
    if summary is None:  # a non-zero rank: rank 0 reports
        return 0
    if args.json:
        with written_whole(args.json) as partial:
            partial.write_text(json.dumps(summary, indent=1))
    if not args.quiet:
        print_summary(summary)
    return 0


def out_of_memory(exc: RuntimeError) -> str | None:
    """What an allocation the device could not make asked for, in one line; None for any other error."""
    import torch

    text = str(exc)
    if "DefaultCPUAllocator: can't allocate memory: " in text:  # the CPU's, a plain RuntimeError
        return text.partition("can't allocate memory: ")[2].split(". Error code")[0]
    if isinstance(exc, torch.cuda.OutOfMemoryError):  # its first sentences: what was asked, what the GPU has
        return ". ".join(text.splitlines()[0].split(". ")[:3])
    return None


def trained(cfg: TrainConfig, args: argparse.Namespace) -> dict | None:
    """The run's summary; None on a rank other than 0 of several."""
    if cfg.world_size > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun's ranks must agree
        from reference_trainer.distributed import RankFailed, launch_or_join

        try:
            return launch_or_join(cfg, args.quiet, args.save_policy)
        except RankFailed as failure:  # the run failed, not its input: exit 1
            raise MachineFault(str(failure)) from None
    return run_with_progress(cfg, args.quiet, save_policy=args.save_policy)


def print_summary(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    steady = summary["steady_seconds"]
    table = Table(title=f"phases over {len(summary['epochs']) - summary['config']['warmup_epochs']} steady epochs")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    table.add_column("% of time", justify="right")
    for name, seconds in summary["phases"].items():
        table.add_row(name, f"{seconds:.3f}", f"{100 * seconds / steady:.1f}")
    coverage = summary["phase_coverage"]
    table.add_row("[dim]attributed[/dim]", f"{sum(summary['phases'].values()):.3f}",
                  "-" if coverage is None else f"{100 * coverage:.1f}", end_section=True)
    console = Console(file=sys.stdout)
    console.print(table)
    h2d = summary["h2d_bytes_per_step"]
    console.print(f"host->device copies {h2d:,} bytes per agent step, {h2d * summary['sps'] / 1e6:,.1f} MB/s at the "
                  f"steady SPS; policy of {summary['parameters']:,} parameters")
    overlap = summary["env_overlap"]
    if overlap is not None:
        busy, waited, policy = overlap["env_busy_seconds"], overlap["env_wait_seconds"], overlap["policy_seconds"]
        beside = max(0.0, busy - waited)  # the env's time the trainer spent on the policy instead
        policy_text = "" if policy is None else \
            f" (policy {policy:.3f} s, {100 * min(1.0, beside / policy) if policy else 0.0:.0f}% of it beside the env)"
        console.print(f"env busy {busy:.3f} s ({100 * busy / steady:.1f}% of the steady time), waited for {waited:.3f} s: "
                      f"{100 * beside / busy if busy else 0.0:.0f}% hidden behind the policy{policy_text}")
    ret = summary["mean_episode_return"]
    console.print(
        f"SPS {summary['sps']:,.0f} steady, {summary['sps_end_to_end']:,.0f} end to end; "
        f"warm-up {summary['warmup_seconds']:.2f} s (set-up "
        + ", ".join(f"{stage} {seconds:.2f}" + (f" (building {summary['env_build_seconds']:.2f})"
                                                   if stage == "envs" else "")
                    for stage, seconds in summary["setup_seconds"].items())
        + f"; compile/capture {summary['compile_seconds']:.2f} s); "
        f"wall {summary['wall_seconds']:.2f} s; mean episode return "
        f"{'-' if ret is None else f'{ret:.3f}'}; dtype {summary['dtype_used']}"
    )
