"""How often do verdicts cry wolf, and how often do they catch a real slowdown? Measured on this machine.

`python -m studies.verdict_power --pairs 64 --slowed 40`; what it runs and draws:
docs/decision-rules.md#verdicts-on-real-processes-studiesverdict_powerpy.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from benches.runner import PointRunner, UtilizationProbe
from benches.suite import Point
from reference_trainer.config import TrainConfig
from decisions import intervals
from decisions.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from decisions.sequential import Design, decide
from decisions.verdicts import compare_values, is_contended
from rlperf.arguments import DEFAULT_MAX_REPEATS
from rlperf.store import PointRecord, utc_now
from rlperf.summary import RunSummary

POINT = {"env": "synthetic", "hidden_size": 128, "num_envs": 64, "horizon": 16, "total_steps": 32768}
DRAWS = 2000
WARM = 3  # plain processes that size the delay before the slowed ones begin


def run_processes(out: Path, pairs: int, slowed: int, slowdown: float, threads: int) -> dict[str, list[dict]]:
    base_config = {**TrainConfig().to_dict(), **POINT, "threads": threads}
    runner = PointRunner(out, 1, 600.0, UtilizationProbe(0))
    summaries: dict[str, list[RunSummary]] = {"plain": [], "slowed": []}

    def one(name: str, config: dict, index: int) -> RunSummary:
        record = PointRecord(name, config, "ok", utc_now(), 0.0)
        directory = out / name
        directory.mkdir(parents=True, exist_ok=True)
        status, reason, summary = runner.run_repeat(Point(name, {}, config), index, directory, [], record)
        if status != "ok":
            sys.exit(f"verdict_power: a {name} repeat {status}: {reason}")
        return summary

    # the delay is sized from plain repeats: SPS falls by `slowdown` when each epoch takes 1/(1 - slowdown) as long
    warm = [one("plain", base_config, i) for i in range(WARM)]
    summaries["plain"] += warm
    epoch = float(np.median([e["seconds"] for s in warm for e in s.epochs if not e["warmup"]]))
    delay_ms = round(1000 * epoch * slowdown / (1 - slowdown), 2)
    slowed_config = {**base_config, "inject_delay": {"learn": delay_ms}}
    print(f"epoch {epoch * 1000:.1f} ms; injecting {delay_ms} ms into learn per epoch", flush=True)
    for i in range(WARM, pairs):
        order = [("plain", base_config)] + ([("slowed", slowed_config)] if i - WARM < slowed else [])
        for name, config in (order if i % 2 else order[::-1]):
            summaries[name].append(one(name, config, i))
        print(f"{i + 1}/{pairs}: plain {summaries['plain'][-1].sps:,.0f}"
              + (f", slowed {summaries['slowed'][-1].sps:,.0f}" if summaries["slowed"] else ""), flush=True)
    return summaries


def fixed_rates(plain: np.ndarray, slowed: np.ndarray, n: int, rng: np.random.Generator) -> dict:
    false_alarms = catches = same = 0
    for _ in range(DRAWS):
        drawn = rng.choice(plain, 2 * n, replace=False)
        aa = compare_values(drawn[:n], drawn[n:], True, DEFAULT_THRESHOLD, DEFAULT_ALPHA)
        false_alarms += aa.decision in ("down", "up")
        same += aa.decision == "same"
        ab = compare_values(rng.choice(plain, n, replace=False), rng.choice(slowed, n, replace=False), True,
                            DEFAULT_THRESHOLD, DEFAULT_ALPHA)
        catches += ab.decision == "down"
    return {"n": n, "aa_false_alarm": false_alarms / DRAWS, "aa_unchanged": same / DRAWS, "caught": catches / DRAWS}


def sequential(pool: np.ndarray, design: Design, rng: np.random.Generator, flip: bool) -> tuple[str, int]:
    """The --until-decided design on pairs drawn from `pool` (log ratios new / ref), each drawn pair's order
    flipped at random when `flip` (A/A pairs have no side): (status, pairs used)."""
    drawn = rng.choice(pool, design.max_pairs) * (rng.choice((-1.0, 1.0), design.max_pairs) if flip else 1.0)
    decision = None
    for count in design.looks:
        decision = decide(design, drawn[:count], estimate=False)
        if decision.stopped:
            break
    return decision.status, decision.look


def pair_pools(summaries: dict[str, list[RunSummary]]) -> tuple[np.ndarray, np.ndarray]:
    """Log ratios of adjacent processes, a pair left out when either was contended: each slowed process
    against the plain one measured beside it (the slowed ones begin after WARM plain ones), and for A/A the
    plain processes two by two."""
    def log_ratios(pairs) -> np.ndarray:
        return np.array([np.log(new.sps / ref.sps) for ref, new in pairs
                         if not is_contended(ref) and not is_contended(new)])

    plain, slowed = summaries["plain"], summaries["slowed"]
    beside = zip(plain[WARM:], slowed)
    return log_ratios(zip(plain[0::2], plain[1::2])), log_ratios(beside)


def sequential_rates(aa_pool: np.ndarray, slowed_pool: np.ndarray, rng: np.random.Generator) -> dict:
    design = Design.plan(DEFAULT_MAX_REPEATS, DEFAULT_ALPHA, sides=2, threshold=DEFAULT_THRESHOLD)
    aa = [sequential(aa_pool, design, rng, flip=True) for _ in range(DRAWS // 4)]
    ab = [sequential(slowed_pool, design, rng, flip=False) for _ in range(DRAWS // 4)]
    return {"design": design.to_dict(), "pair_log_sd_aa": float(np.std(aa_pool, ddof=1)),
            "aa_false_alarm": float(np.mean([s in ("regressed", "improved") for s, _ in aa])),
            "aa_mean_pairs": float(np.mean([n for _, n in aa])),
            "caught": float(np.mean([s == "regressed" for s, _ in ab])),
            "slowed_mean_pairs": float(np.mean([n for _, n in ab])),
            "slowed_p90_pairs": float(np.percentile([n for _, n in ab], 90))}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=64, help="plain processes (default 64)")
    parser.add_argument("--slowed", type=int, default=40, help="slowed processes, interleaved (default 40)")
    parser.add_argument("--slowdown", type=float, default=0.10, help="SPS lost to the injected delay (default 0.10)")
    parser.add_argument("--threads", type=int, default=0, help="trainer threads per process (default: torch's)")
    parser.add_argument("--out", type=Path, default=Path("runs/verdict-power"), help="logs and results.json here")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    summaries = run_processes(args.out, args.pairs, args.slowed, args.slowdown, args.threads)
    seconds = time.monotonic() - started
    quiet = {name: np.array([s.sps for s in runs if not is_contended(s)]) for name, runs in summaries.items()}
    contended = {name: sum(is_contended(s) for s in runs) for name, runs in summaries.items()}
    plain, slowed = quiet["plain"], quiet["slowed"]
    spread = intervals.log_spread(plain)
    rng = np.random.default_rng(0)
    result = {
        "point": POINT, "processes": {k: len(v) for k, v in summaries.items()}, "contended": contended,
        "seconds": seconds, "seconds_per_process": seconds / sum(len(v) for v in summaries.values()),
        "plain_sps_median": float(np.median(plain)), "slowed_sps_median": float(np.median(slowed)),
        "true_slowdown": float(1 - np.median(slowed) / np.median(plain)), "process_cv": spread,
        "others_cores": [s.interference["others_cores"] for s in summaries["plain"]],
        "fixed": [fixed_rates(plain, slowed, n, rng) for n in (3, 5, 10, 20) if 2 * n <= len(plain)],
        "sequential": sequential_rates(*pair_pools(summaries), rng),
    }
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "others_cores"}, indent=1))


if __name__ == "__main__":
    main()
