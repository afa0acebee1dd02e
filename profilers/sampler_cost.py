"""What the utilization sampler costs the run it watches: steady SPS with it on and off.

    python -m profilers.sampler_cost --repeats 5 --sample-hz 20 -- --env synthetic --total-steps 16384

Runs alternate (off, on, off, on, ...) so drift on the machine lands on both sides equally; the answer is
the ratio of median SPS (on / off) with a Mann-Whitney U test of the two sets. On a busy machine that ratio
is lost in noise, so the sampler's own CPU time per second of sampling is reported too: this process
does nothing but wait for the trainer meanwhile, so its CPU time is the sampler's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from profilers.profile_run import run_gpu_uuids
from profilers.sampler import UtilizationSampler
from reference_trainer.flags import add_train_flags, config_from_args
from rlperf.processes import run_to_completion


def measure(train_args: list[str], repeats: int, sample_hz: float) -> tuple[dict[str, list[float]], float]:
    """SPS per mode, and the sampler's CPU seconds per wall second over the runs with it on, sampling the
    GPUs the run uses as `rlperf bench` does."""
    parser = argparse.ArgumentParser(prog="rlperf train")
    add_train_flags(parser)
    gpu_uuids = run_gpu_uuids(config_from_args(parser.parse_args(train_args)))
    sps: dict[str, list[float]] = {"off": [], "on": []}
    sampler_cpu_s = sampled_wall_s = 0.0
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(2 * repeats):
            mode = ("off", "on")[index % 2]
            summary_path = Path(scratch) / f"{index}.json"
            command = [sys.executable, "-m", "rlperf", "train", *train_args, "--json", str(summary_path), "--quiet"]
            sampler = UtilizationSampler(1.0 / sample_hz, gpu_uuids) if mode == "on" else None
            cpu_start, wall_start = time.process_time(), time.monotonic()
            if sampler is not None:
                sampler.start()
            returncode = run_to_completion(command)
            if sampler is not None:
                sampler.stop()
                sampler_cpu_s += time.process_time() - cpu_start
                sampled_wall_s += time.monotonic() - wall_start
            if returncode != 0:
                raise SystemExit(f"sampler_cost: the trainer failed (exit code {returncode})")
            sps[mode].append(json.loads(summary_path.read_text())["sps"])
    return sps, sampler_cpu_s / sampled_wall_s


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m profilers.sampler_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs with the sampler on, and as many off")
    parser.add_argument("--sample-hz", type=float, default=20.0)
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then `rlperf train` options")
    return parser


def main(argv: list[str] | None = None) -> int:
    import numpy as np
    from rich.console import Console
    from rich.table import Table
    from scipy.stats import mannwhitneyu

    args = build_parser().parse_args(argv)
    train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
    sps, cpu_share = measure(train_args, args.repeats, args.sample_hz)
    table = Table(title=f"steady SPS, sampler at {args.sample_hz:g} Hz, {args.repeats} runs each, alternating")
    for column in ("sampler", "median", "min", "max"):
        table.add_column(column, justify="right")
    for mode, values in sps.items():
        table.add_row(mode, f"{np.median(values):,.0f}", f"{min(values):,.0f}", f"{max(values):,.0f}")
    console = Console()
    console.print(table)
    ratio = np.median(sps["on"]) / np.median(sps["off"])
    p_value = mannwhitneyu(sps["on"], sps["off"]).pvalue
    console.print(f"SPS ratio on/off (medians): {ratio:.4f}; Mann-Whitney U p = {p_value:.3f}")
    console.print(f"sampler CPU time: {1000 * cpu_share:.2f} ms per second of sampling "
                  f"({100 * cpu_share:.3f}% of one core)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
