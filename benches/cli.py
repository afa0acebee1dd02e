"""`rlperf bench`: run a sweep suite, one fresh trainer process per repeat, every sample stored as it lands.

Importing this module stays cheap; torch is only ever imported by the processes it starts.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
from pathlib import Path

DEFAULT_OUT = "runs"
STORE_FILE = "results.sqlite"


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of 1 or more (got {text!r})")
    return int(text)


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of 0 or more (got {text!r})")
    return value


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a number above 0 (got {text!r})")
    return value


def device_choice(text: str) -> str:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"must be auto, cpu, cuda or cuda:N (got {text!r})")
    return text


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", default="smoke",
                        help="a suite in benches/suites (smoke, nightly, hardware) or a path to a .toml file")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"where the store ({STORE_FILE}), logs and reports go (default {DEFAULT_OUT}/)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the newest unfinished run of this suite in the store, skipping finished points")
    parser.add_argument("--repeats", type=positive_int, metavar="R",
                        help="fresh processes per point (default: the suite's `repeats`)")
    parser.add_argument("--device", type=device_choice,
                        help="run every point on this device instead of the suite's: cpu, cuda, cuda:N, or auto "
                             "(the first GPU when there is one)")
    parser.add_argument("--timeout", type=positive_float, metavar="S",
                        help="seconds one repeat may run before it is killed (default: the suite's `timeout_s`)")
    parser.add_argument("--sample-hz", type=non_negative_float, metavar="HZ",
                        help="utilization samples per second around each repeat, 0 for none "
                             "(default: the suite's `sample_hz`)")
    parser.add_argument("--label", help="a note stored with the run (e.g. the change being measured)")
    parser.add_argument("--export", metavar="PATH", type=Path,
                        help="also write the run's samples as a flat table: .csv, .parquet or .json")
    parser.add_argument("--baseline", metavar="RESULTS", default=os.environ.get("RLPERF_BASELINE") or None,
                        help="compare the report with this store (PATH or PATH::RUN_ID); exit 1 on a regression "
                             "(default: $RLPERF_BASELINE, else no comparison)")


def run(args: argparse.Namespace) -> int:
    from benches.sweep import Sweep, SweepOptions

    options = SweepOptions(suite=args.suite, out_dir=Path(args.out), resume=args.resume, repeats=args.repeats,
                           device=args.device, timeout_s=args.timeout, sample_hz=args.sample_hz, label=args.label,
                           export=args.export, baseline=args.baseline)
    # SIGTERM (a CI job cancelled, a `kill`) ends the sweep like Ctrl-C: the run is marked interrupted.
    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        return Sweep(options).run()
    finally:
        signal.signal(signal.SIGTERM, previous)


def raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
