"""How often does a comparison of time to solve cry wolf, and how large a change can it see? Measured here.

`python -m studies.learning_power --seeds 40`; what it runs and draws:
docs/decision-rules.md#time-to-solve-on-real-runs-studieslearning_powerpy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from benches import suite as suites
from benches.runner import PointRunner, UtilizationProbe
from decisions.criteria import DEFAULT_ALPHA
from decisions.learning import LEARNING_THRESHOLD, Durations, SolveChange, compare_solve, durations, judge_all
from decisions.verdicts import is_contended
from rlperf.store import PointRecord, utc_now
from rlperf.summary import RunSummary

SIZES = (5, 8, 10)
FACTORS = (1.1, 1.25, 1.3, 1.4, 1.5, 2.0)


def run_seeds(point: suites.Point, seeds: int, out: Path, budget_s: float) -> list[RunSummary]:
    """The point's repeats 0 .. seeds-1 (seed + repeat each), reusing those already in `out`."""
    runner = PointRunner(out, seeds, 600.0, UtilizationProbe(0))
    directory = runner.point_dir(0, point)
    directory.mkdir(parents=True, exist_ok=True)
    record = PointRecord(point.key, point.config, "ok", utc_now(), 0.0)
    started, summaries = time.monotonic(), []
    for repeat in range(seeds):
        kept = directory / f"repeat-{repeat}.json"
        if kept.is_file() and (directory / f"repeat-{repeat}.interference.json").is_file():
            summary = RunSummary.read(json.loads(kept.read_text()))
            summary.interference = json.loads((directory / f"repeat-{repeat}.interference.json").read_text())
        elif time.monotonic() - started > budget_s:
            print(f"stopped at the time budget with {len(summaries)} of {seeds} seeds; run again to add more")
            break
        else:
            status, reason, summary = runner.run_repeat(point, repeat, directory, [], record)
            if status != "ok":
                sys.exit(f"learning_power: seed {repeat} {status}: {reason}")
            (directory / f"repeat-{repeat}.interference.json").write_text(json.dumps(summary.interference))
            solve = summary.time_to_solve
            print(f"seed {point.config['seed'] + repeat}: solved {solve['solved']} at {solve['steps']:,} steps, "
                  f"{solve['seconds']:.1f} s; SPS {summary.sps:,.0f}", flush=True)
        summaries.append(summary)
    return summaries


def samples_frame(summaries: list[RunSummary]) -> pd.DataFrame:
    return pd.DataFrame({"point_key": "{}", "summary": summaries, "sps": [s.sps for s in summaries],
                         "phases": [s.phases for s in summaries],
                         "mean_episode_return": [s.mean_episode_return for s in summaries]})


def stretched(times: np.ndarray, solved: np.ndarray, run_ends: np.ndarray, factor: float) -> Durations:
    """Times to solve `factor` times as long, censored where each run ended (its budget)."""
    longer = times * factor
    return Durations(np.minimum(longer, run_ends), solved & (longer <= run_ends))


def per_point_rates(pool: Durations, run_ends: np.ndarray, n: int, draws: int, rng: np.random.Generator) -> dict:
    """A/A false alarms over `draws` draws of n against n seeds (and how often the log-rank test alone rejects,
    threshold aside), and catches of each slowdown factor over a fifth as many (each comparison asks the
    log-rank test once per gap, so rates cost seconds per hundred)."""
    def compare(base: np.ndarray, cand: Durations) -> SolveChange:
        return compare_solve(Durations(pool.times[base], pool.solved[base]), cand, LEARNING_THRESHOLD, DEFAULT_ALPHA)

    def draw() -> tuple[np.ndarray, np.ndarray]:
        order = rng.permutation(len(pool))
        return order[:n], order[n:2 * n]

    same = [compare(a, Durations(pool.times[b], pool.solved[b])) for a, b in (draw() for _ in range(draws))]
    rates = {"n": n, "draws": draws, "aa_false_alarm": float(np.mean([c.decision in ("up", "down") for c in same])),
             "aa_logrank_rejects": float(np.mean([c.p_value <= DEFAULT_ALPHA for c in same])),
             "aa_unchanged": float(np.mean([c.decision == "same" for c in same]))}
    for factor in FACTORS:
        slowed = [compare(a, stretched(pool.times[b], pool.solved[b], run_ends[b], factor))
                  for a, b in (draw() for _ in range(draws // 5))]
        rates[f"caught_{factor:g}x"] = float(np.mean([c.decision == "up" for c in slowed]))
    rates["detects"] = next((f"{factor:g}x" for factor in FACTORS if rates[f"caught_{factor:g}x"] >= 0.8), "none")
    return rates


def suite_false_alarms(samples: pd.DataFrame, points: int, n: int, draws: int, rng: np.random.Generator) -> dict:
    """Same-code comparisons of `points` points at n seeds a side, judged together as a report judges them."""
    keys = [json.dumps({"point": i}) for i in range(points)]
    frame = pd.DataFrame({"point_key": keys, "config": [{}] * points, "status": "ok"})
    runs_with_a_claim = 0
    for _ in range(draws):
        sides = {"a": [], "b": []}
        for key in keys:
            order = rng.permutation(len(samples))
            sides["a"].append(samples.iloc[order[:n]].assign(point_key=key))
            sides["b"].append(samples.iloc[order[n:2 * n]].assign(point_key=key))
        verdicts = judge_all(frame, pd.concat(sides["b"]), frame, pd.concat(sides["a"]), alpha=DEFAULT_ALPHA)
        runs_with_a_claim += any(v.status in ("regressed", "improved") for v in verdicts)
    return {"points": points, "n": n, "draws": draws, "runs_with_a_false_claim": runs_with_a_claim / draws}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="learning", help="suite whose point is measured (default learning)")
    parser.add_argument("--point", default=None, help="the point's key as stored (default: the suite's first)")
    parser.add_argument("--seeds", type=int, default=40, help="seeds (processes) to measure (default 40)")
    parser.add_argument("--budget-s", type=float, default=540.0,
                        help="stop starting new processes after this many seconds (default 540)")
    parser.add_argument("--draws", type=int, default=1000, help="resampled comparisons per rate (default 1000)")
    parser.add_argument("--out", type=Path, default=Path("runs/learning-power"), help="processes and results.json")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    suite = suites.load(args.suite)
    point = next((p for p in suite.points if args.point in (None, p.key)), None)
    if point is None or point.config["target_return"] is None:
        sys.exit(f"learning_power: no point {args.point!r} with a target_return in suite {suite.name}")
    summaries = run_seeds(point, args.seeds, args.out, args.budget_s)
    quiet = [s for s in summaries if not is_contended(s)]
    samples = samples_frame(quiet)
    pool = durations(samples)
    run_ends = np.array([s["epochs"][-1]["end_seconds"] for s in quiet])
    rng = np.random.default_rng(0)
    logs = np.log(pool.times[pool.solved])
    result = {
        "suite": suite.name, "point": point.key, "seeds": len(summaries), "contended": len(summaries) - len(quiet),
        "solved": int(pool.solved.sum()), "threshold": LEARNING_THRESHOLD, "alpha": DEFAULT_ALPHA,
        "seconds_median": float(np.median(pool.times)), "seconds_log_sd": float(np.std(logs, ddof=1)),
        "steps_log_sd": float(np.std(np.log(durations(samples, "steps").times), ddof=1)),
        "sps_log_sd": float(np.std(np.log(samples["sps"]), ddof=1)),
        "per_point": [per_point_rates(pool, run_ends, n, args.draws, rng) for n in SIZES if 2 * n <= len(pool)],
        "suite_false_alarms": [suite_false_alarms(samples, len(suite.points), n, args.draws // 4, rng)
                  for n in SIZES if 2 * n <= len(pool)],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
