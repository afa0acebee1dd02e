"""`rlperf doctor`: is this GPU machine ready to be a benchmark runner? One command before its first night.

Runs, in order, each as a process of its own with its log kept under --out: the GPU tests (`pytest -m gpu`), the
GPU smoke (`rlperf bench --suite gpu-smoke`) with a check that its report's roofline is whole (every peak it
needs measured), a traced profile (`rlperf profile`), and a small real gate night (three nightly points, the
working tree against HEAD). Ends with one line per check, `ok` or what failed and its log, with each check's wall;
about 10 minutes on an H100 (docs/gpu-runner.md). Exit 0 when every check passed, 1 when one failed, 2 without a
GPU, before anything runs.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

from benches.readiness import run_checks, runner_checks
from rlperf.errors import BadInput, output_dir
from rlperf.lock import duration

DEFAULT_OUT = "runs/doctor"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"where each run of the doctor gets a folder of its own, with every check's log, the "
                             f"smoke's and the night's store and reports, and the profile (default {DEFAULT_OUT}/)")


def run(args: argparse.Namespace) -> int:
    from rlperf.machine import probe

    machine = probe()
    refusal = machine.skip_reason({"device": "cuda", "world_size": 1, "dtype": "fp32"})
    if refusal:
        raise BadInput(f"device: {refusal}; rlperf doctor checks a GPU runner and ran nothing")
    folder = output_dir(Path(args.out) / datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"), "out")
    checks = runner_checks(folder, sys.executable)
    say(f"doctor: {len(checks)} checks on {machine.gpus[0]['name']}, about 10 minutes on an H100; logs in {folder}")
    outcomes = run_checks(checks, folder, say)
    for outcome in outcomes:
        say(outcome.line())
    failed = sum(outcome.problem is not None for outcome in outcomes)
    total = duration(sum(outcome.wall_s for outcome in outcomes))
    say(f"doctor: {len(outcomes) - failed} of {len(outcomes)} checks passed in {total}"
        + ("" if not failed else "; docs/gpu-runner.md says what to do about each"))
    return 1 if failed else 0


def say(text: str) -> None:
    print(text, flush=True)
