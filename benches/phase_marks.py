"""What a phase mark costs a user's loop (rlperf.phases): a tight loop of `with phases.phase("env"): pass`, timed
with the clock on (the harness asked for a summary), off (it did not), and the bare loop without the `with`.
Each `with` makes two marks. The median of several runs of each, interleaved, in this one process, on the host
clock (a CPU run; on CUDA a mark also records an event).

    python -m benches.phase_marks [--withs 100000] [--runs 9]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from rlperf import phases


def loop_seconds(withs: int, timed: bool | None) -> float:
    """Seconds of `withs` iterations: with the `with` and the clock on (True), off (False), or no `with` (None)."""
    manager = phases.phase("env")
    if timed:
        clock = phases.start("/dev/null", environ={})
    start = time.perf_counter()
    if timed is None:
        for _ in range(withs):
            pass
    else:
        for _ in range(withs):
            with manager:
                pass
    seconds = time.perf_counter() - start
    if timed:
        clock.marks.clear()  # a run of one epoch this long keeps its marks; they are not the measurement
        phases.stop()
    return seconds


def measure(withs: int, runs: int) -> dict:
    times: dict[str, list[float]] = {"on": [], "off": [], "bare": []}
    for _ in range(runs):
        for name, timed in (("on", True), ("off", False), ("bare", None)):
            times[name].append(loop_seconds(withs, timed))
    median = {name: statistics.median(values) for name, values in times.items()}
    return {
        "withs": withs, "runs": runs,
        "ns_per_mark_on": (median["on"] - median["bare"]) / (2 * withs) * 1e9,
        "ns_per_mark_off": (median["off"] - median["bare"]) / (2 * withs) * 1e9,
        "seconds": times,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benches.phase_marks", description=__doc__.splitlines()[0])
    parser.add_argument("--withs", type=int, default=100_000, help="phases entered and left per run (default 100000)")
    parser.add_argument("--runs", type=int, default=9, help="runs of each kind (default 9)")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    result = measure(args.withs, args.runs)
    print(json.dumps({key: value for key, value in result.items() if key != "seconds"}))
    print(f"a mark costs {result['ns_per_mark_on']:.0f} ns with the clock on, {result['ns_per_mark_off']:.0f} ns off "
          f"(median of {args.runs} runs of {args.withs:,} phases, two marks each)")


if __name__ == "__main__":
    main()
