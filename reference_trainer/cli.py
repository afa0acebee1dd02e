"""`rlperf train`: flags are generated from TrainConfig, so every knob has exactly one definition."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from reference_trainer.config import PHASES, TrainConfig, from_dict, parse_delay

FLAG_HELP = {
    "env": "memory, cartpole, synthetic or gym:<id>",
    "seed": "random seed of the environments and the policy",
    "total_steps": "agent steps to train for, rounded up to whole epochs of num_envs x horizon",
    "num_envs": "environments in all ranks together; batch = num_envs x horizon",
    "horizon": "environment steps per rollout, and the length of the training sequences",
    "minibatch_size": "agent steps per minibatch, a multiple of horizon x world_size",
    "update_epochs": "passes over the batch per epoch",
    "hidden_size": "width of the encoder and the LSTM, in units",
    "lstm": "use the LSTM core (--no-lstm: an MLP-only policy)",
    "learning_rate": "Adam's learning rate",
    "anneal_lr": "lower the learning rate linearly to 0 over the run",
    "gamma": "discount factor, 0 to 1",
    "gae_lambda": "GAE lambda, 0 to 1",
    "clip_coef": "PPO's ratio clip",
    "vf_coef": "weight of the value loss",
    "ent_coef": "weight of the entropy bonus",
    "max_grad_norm": "gradient norm clip",
    "obs_size": "observation width of env=synthetic, in floats",
    "num_actions": "actions of env=synthetic",
    "env_cost_us": "CPU microseconds env=synthetic spins per env per step, to model a costlier env",
    "device": "cpu, cuda or cuda:N (the first of world_size GPUs)",
    "threads": "torch CPU threads per process; 0 leaves torch's default (one per physical core), or each rank's "
               "share of the cores when world_size > 1",
    "dtype": "fp32, bf16 or fp16 (autocast around forward and loss)",
    "pinned": "stage host<->device copies in page-locked buffers (CUDA only)",
    "non_blocking": "asynchronous host<->device copies; needs --pinned (CUDA only)",
    "cuda_graphs": "capture and replay the rollout step and the update as CUDA graphs (CUDA only)",
    "copy_stream": "issue host->device copies on a second stream; needs --pinned --non-blocking (CUDA only)",
    "env_groups": "step the envs in this many groups, overlapping one group's env step with another's forward on a GPU",
    "compile": "torch.compile the rollout step and forward+loss (compile time reported apart)",
    "world_size": "ranks (processes), one GPU each on CUDA; num_envs is split among them",
    "rank_timeout": "seconds a rank may make no progress before the run fails with that rank named",
    "timers": "per-phase timers (--no-timers to measure their cost)",
    "warmup_epochs": "epochs left out of the steady SPS",
    "inject_delay": "PHASE=MS: sleep MS milliseconds inside PHASE once per epoch (repeatable; default none)",
    "trace_dir": "write a torch.profiler Chrome trace of steady epochs here (default: no trace)",
    "trace_epochs": "steady epochs to trace, at most the run's steady epochs",
}


def configure(parser: argparse.ArgumentParser, omit: tuple[str, ...] = ()) -> None:
    """One flag per TrainConfig field; fields in `omit` get no flag and keep their default."""
    defaults = TrainConfig()
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        help_text = FLAG_HELP.get(f.name, "")
        if f.name in omit:
            parser.set_defaults(**{f.name: [] if f.name == "inject_delay" else default})
        elif f.name == "inject_delay":
            parser.add_argument(flag, action="append", default=[], metavar="PHASE=MS", help=help_text)
        elif isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                help=f"{help_text} (default {'on' if default else 'off'})")
        elif f.name == "trace_dir":
            parser.add_argument(flag, default=default, metavar="DIR", help=help_text)
        else:
            parser.add_argument(flag, type=type(default), default=default, help=f"{help_text} (default {default})")
    parser.add_argument("--json", metavar="PATH",
                        help="write the run's summary here (docs/results-format.md; default: none)")
    parser.add_argument("--save-policy", metavar="PATH", default="",
                        help="save the trained policy's state_dict here (default: not saved)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar or table (default: shown)")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)}
    values["inject_delay"] = dict(parse_delay(text) for text in args.inject_delay)
    return from_dict(values)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if cfg.world_size > 1 or int(os.environ.get("WORLD_SIZE", "1")) > 1:  # torchrun's ranks must agree
        from reference_trainer.distributed import RankFailed, launch_or_join

        try:
            summary = launch_or_join(cfg, args.quiet, args.save_policy)
        except RankFailed as failure:  # the run failed, not its input: exit 1
            sys.stderr.write(f"rlperf train: error: {failure}\n")
            return 1
        if summary is None:  # a non-zero rank: rank 0 reports
            return 0
    else:
        summary = run_with_progress(cfg, args.quiet, save_policy=args.save_policy)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=1))
    if not args.quiet:
        print_summary(summary)
    return 0


def to_args(values: dict) -> list[str]:
    """The `rlperf train` flags that reproduce these TrainConfig values (defaults are left out)."""
    defaults = TrainConfig().to_dict()
    args = []
    for name, value in values.items():
        if value == defaults[name]:
            continue
        flag = "--" + name.replace("_", "-")
        if name == "inject_delay":
            args += [arg for phase, ms in value.items() for arg in (flag, f"{phase}={ms}")]
        elif isinstance(value, bool):
            args.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            args += [flag, str(value)]
    return args


def run_with_progress(cfg: TrainConfig, quiet: bool, rank=None, save_policy: str = "") -> dict:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from reference_trainer.train import train

    if quiet:
        return train(cfg, rank, save_policy=save_policy)
    columns = (TextColumn("epoch"), MofNCompleteColumn(), BarColumn(), TimeRemainingColumn(),
               TextColumn("{task.fields[sps]:>9} SPS  return {task.fields[ret]}"))
    with Progress(*columns, transient=True, console=_stderr_console()) as progress:
        task = progress.add_task("train", total=cfg.num_epochs, sps="-", ret="-")

        def on_epoch(record: dict) -> None:
            ret = record["mean_episode_return"]
            progress.update(task, advance=1, sps=f"{record['steps'] / record['seconds']:,.0f}",
                            ret="-" if ret is None else f"{ret:.3f}")

        return train(cfg, rank, on_epoch, save_policy)


def _stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def print_summary(summary: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    steady = summary["steady_seconds"]
    table = Table(title=f"phases over {len(summary['epochs']) - summary['config']['warmup_epochs']} steady epochs")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    table.add_column("% of time", justify="right")
    for name in PHASES:
        seconds = summary["phases"][name]
        table.add_row(name, f"{seconds:.3f}", f"{100 * seconds / steady:.1f}")
    coverage = summary["phase_coverage"]
    table.add_row("[dim]attributed[/dim]", f"{sum(summary['phases'].values()):.3f}",
                  "-" if coverage is None else f"{100 * coverage:.1f}", end_section=True)
    console = Console(file=sys.stdout)
    console.print(table)
    ret = summary["mean_episode_return"]
    console.print(
        f"SPS {summary['sps']:,.0f} steady, {summary['sps_end_to_end']:,.0f} end to end; "
        f"warm-up {summary['warmup_seconds']:.2f} s (compile/capture {summary['compile_seconds']:.2f} s); "
        f"wall {summary['wall_seconds']:.2f} s; mean episode return "
        f"{'-' if ret is None else f'{ret:.3f}'}; dtype {summary['dtype_used']}"
    )
