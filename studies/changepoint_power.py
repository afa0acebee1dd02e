"""How often do change points appear in histories where nothing changed, and how often is a real shift found
at its run? Measured by simulation through decisions/changepoints.find on synthetic histories.

`python -m studies.changepoint_power --noise 0.02 --offset 0.03 --runs 10 20 40 --histories 200`; what it draws:
docs/decision-rules.md#change-points-studieschangepoint_powerpy.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd
from scipy import stats

from decisions import changepoints
from decisions.rundata import RunData
from rlperf.summary import RunSummary

STEADY_STEPS = 1000
SHARES = {"env": 0.05, "eval_copy": 0.04, "eval_forward": 0.25, "eval_misc": 0.03, "train_misc": 0.06,
          "train_forward": 0.2, "learn": 0.35, "log": 0.02}


def synthetic_run(order: int, rng: np.random.Generator, repeats: int = 3, process_noise: float = 0.12,
                  run_offset: float = 0.0, slower: dict[str, float] | None = None, points: int = 1,
                  contended: bool = False, tail_df: float | None = None) -> RunData:
    """A run whose repeats have each phase's time drawn around a 1,000 SPS step: a run-wide offset (the
    night), a process-wide factor of `process_noise` (Student-t with `tail_df`, or normal), a little per
    phase; `slower` multiplies phases' times; SPS follows from their sum."""
    point_rows, sample_rows = [], []
    night = rng.normal(0, run_offset)
    for point in range(points):
        key = json.dumps({"num_envs": 16 * (point + 1)})
        point_rows.append({"point_key": key, "config": {"num_envs": 16 * (point + 1)}, "status": "ok", "reason": ""})
        for _ in range(repeats):
            luck = rng.standard_t(tail_df) * np.sqrt((tail_df - 2) / tail_df) if tail_df else rng.normal()
            process = np.exp(night + process_noise * luck)
            phases = {phase: share * STEADY_STEPS / 1000 * process * np.exp(rng.normal(0, 0.03))
                      * (slower or {}).get(phase, 1.0) for phase, share in SHARES.items()}
            summary = RunSummary.read({"steady_steps": STEADY_STEPS, "interference": {"contended": contended}})
            sample_rows.append({"point_key": key, "sps": STEADY_STEPS / sum(phases.values()), "phases": phases,
                                "summary": summary})
    info = {"suite": "synthetic", "status": "complete", "git_commit": f"{order:04d}abcdef{order:06d}",
            "git_dirty": False, "started_at": f"2026-01-{order % 28 + 1:02d}T00:00:00+00:00"}
    empty = pd.DataFrame()
    return RunData("synthetic.sqlite", f"run-{order}", info, {}, pd.DataFrame(point_rows), pd.DataFrame(sample_rows),
                   empty, empty, empty)


def history(rng: np.random.Generator, runs: int, shift_at: int | None = None, slower: dict[str, float] | None = None,
            **options) -> list[RunData]:
    return [synthetic_run(order, rng, slower=slower if shift_at is not None and order >= shift_at else None,
                          **options) for order in range(runs)]


def rate(hits: int, trials: int) -> dict:
    low, high = stats.binomtest(hits, trials).proportion_ci(0.95)
    return {"rate": hits / trials, "low": low, "high": high, "hits": hits, "trials": trials}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", type=float, default=0.02, help="log SD of one process's SPS")
    parser.add_argument("--offset", type=float, default=0.03, help="log SD of a run's offset (the night)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runs", type=int, nargs="+", default=[10, 20, 40])
    parser.add_argument("--shift", type=float, default=0.10, help="the slowdown planted in half the histories")
    parser.add_argument("--histories", type=int, default=200, help="per length, half of them shifted")
    parser.add_argument("--alpha", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    rng = np.random.default_rng(args.seed)
    started = time.monotonic()
    results = []
    slower = {phase: 1 / (1 - args.shift) for phase in SHARES}
    for length in args.runs:
        false = found = at_run = 0
        estimates = []
        for index in range(args.histories):
            options = {"repeats": args.repeats, "process_noise": args.noise, "run_offset": args.offset,
                       "tail_df": 4.0}
            if index % 2 == 0:
                runs = history(rng, length, **options)
                false += bool(changepoints.find(runs, threshold=0.05, alpha=args.alpha))
                continue
            shift_at = int(rng.integers(length // 4, length - length // 4))
            runs = history(rng, length, shift_at=shift_at, slower=slower, **options)
            changes = [c for c in changepoints.find(runs, threshold=0.05, alpha=args.alpha) if c.metric == "SPS"]
            found += bool(changes)
            hit = [c for c in changes if c.order == shift_at]
            at_run += bool(hit)
            estimates += [(c.shift.estimate, c.naive) for c in hit]
        half = args.histories // 2
        results.append({"runs": length, "false change points": rate(false, half), "shift found": rate(found, half),
                        "found at its run": rate(at_run, half),
                        "mean estimate at its run": float(np.mean([e for e, _ in estimates])) if estimates else None,
                        "mean uncorrected estimate": float(np.mean([n for _, n in estimates])) if estimates else None})
    print(json.dumps({"noise": args.noise, "offset": args.offset, "repeats": args.repeats, "shift": -args.shift,
                      "alpha": args.alpha, "seconds": time.monotonic() - started, "results": results}, indent=1))


if __name__ == "__main__":
    main()
