"""What `--until-decided` costs and catches, measured by simulation through its own code.

`python -m studies.sequential_power --noise process=0.06,drift=0.6 --points 400`, or `--scores 12,14` to compare
the sign-flip scores; what it draws: docs/decision-rules.md#paired-designs-studiessequential_powerpy.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy import stats

from benches.pairing import Pairing, frame
from studies.simulated import Noise, SimulatedMachine, parse_noise
from benches.suite import Point
from decisions import sequential
from decisions.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from decisions.sequential import Design, decide
from decisions.verdicts import compare_values, judge_pair_point
from rlperf.arguments import DEFAULT_MAX_REPEATS
from rlperf.store import PointRecord, Store, utc_now

OLD_LOOKS = (8, 12, 17, 24, 34, 40)


def old_rule(ref: np.ndarray, new: np.ndarray, threshold: float, alpha: float) -> tuple[str, int]:
    """The rule --until-decided used before: unpaired, union-bound looks. (decision, pairs used)."""
    previous = 0
    for looked in OLD_LOOKS:
        if looked > len(ref):
            break
        share = alpha * (looked - previous) / OLD_LOOKS[-1]
        previous = looked
        decision = compare_values(ref[:looked], new[:looked], True, threshold, share).decision
        if decision != "undecided":
            return decision, looked
    return "undecided", min(len(ref), OLD_LOOKS[-1])


def rate(hits: int, trials: int) -> dict:
    low, high = stats.binomtest(hits, trials).proportion_ci(0.95)
    return {"rate": hits / trials, "low": low, "high": high, "hits": hits, "trials": trials}


def simulate(noise: Noise, slowdown: float, points: int, seed: int) -> dict:
    design = Design.plan(DEFAULT_MAX_REPEATS, DEFAULT_ALPHA, sides=2, threshold=DEFAULT_THRESHOLD)
    machine = SimulatedMachine(noise, np.random.default_rng(seed))
    pairing_rng = random.Random(seed)
    outcome = {kind: {"status": [], "pairs": [], "estimate": [], "naive": [], "old": [], "old_pairs": []}
               for kind in ("aa", "slowed")}
    disagreements = 0
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as scratch:
        with Store.open(Path(scratch) / "results.sqlite") as store:
            for index in range(points):
                kind = "slowed" if index % 2 else "aa"
                machine.new_night()
                point = Point(json.dumps({"i": index}), {"i": index}, {"i": index})
                machine.slowdowns = {("new", point.key): slowdown} if kind == "slowed" else {}
                sides = {side: machine.runner(side, Path(scratch)) for side in ("ref", "new")}
                records = {side: PointRecord(point.key, point.config, "ok", utc_now(), 0.0) for side in sides}
                verdict = Pairing(sides, design, lambda text: None, rng=pairing_rng).measure(
                    0, point, records, [], time.monotonic() + 1e9)
                # the report's judgement: the same pairs, stored and read back
                runs = {side: store.create_run("sim", "h", {}, "k") for side in sides}
                for side, run_id in runs.items():
                    store.record_point(run_id, records[side])
                stored = {side: store.samples(run_id) for side, run_id in runs.items()}
                again = judge_pair_point(stored["new"], stored["ref"], design, ended=True)
                disagreements += (again.status, round(again.sps.relative, 12)) != \
                    (verdict.status, round(verdict.sps.relative, 12))
                tally = outcome[kind]
                tally["status"].append(verdict.status)
                tally["pairs"].append(len(records["new"].samples))
                tally["estimate"].append(verdict.sps.relative)
                tally["naive"].append(verdict.decision.naive)
                # the old rule on more pairs of the same machine (it looked unpaired, with a fixed schedule)
                extra = {side: PointRecord(point.key, point.config, "ok", utc_now(), 0.0) for side in sides}
                Pairing(sides, Design((OLD_LOOKS[-1],), 0.5, 2, DEFAULT_THRESHOLD, OLD_LOOKS[-1] + 1),
                        lambda text: None, rng=pairing_rng).measure(0, point, extra, [], time.monotonic() + 1e9)
                quiet = {side: frame(extra[side]) for side in sides}
                flags = [quiet[side]["summary"].map(lambda s: s.interference["contended"]) for side in sides]
                keep = ~(flags[0].to_numpy() | flags[1].to_numpy())
                old, old_pairs = old_rule(quiet["ref"]["sps"].to_numpy()[keep], quiet["new"]["sps"].to_numpy()[keep],
                                          DEFAULT_THRESHOLD, DEFAULT_ALPHA)
                tally["old"].append(old)
                tally["old_pairs"].append(old_pairs)
    aa, slowed = outcome["aa"], outcome["slowed"]
    claimed = [status in ("regressed", "improved") for status in aa["status"]]
    caught = [status == "regressed" for status in slowed["status"]]
    caught_estimates = [e for e, hit in zip(slowed["estimate"], caught) if hit]
    caught_naive = [e for e, hit in zip(slowed["naive"], caught) if hit]
    return {
        "design": design.to_dict(),
        "aa claims": rate(sum(claimed), len(claimed)),
        "aa mean pairs": float(np.mean(aa["pairs"])),
        "aa statuses": {s: aa["status"].count(s) for s in set(aa["status"])},
        "slowed caught": rate(sum(caught), len(caught)),
        "slowed mean pairs": float(np.mean(slowed["pairs"])),
        "slowed median estimate when caught": float(np.median(caught_estimates)) if caught_estimates else None,
        "slowed median uncorrected estimate when caught": float(np.median(caught_naive)) if caught_naive else None,
        "old rule aa claims": rate(sum(d in ("down", "up") for d in aa["old"]), len(aa["old"])),
        "old rule aa mean pairs": float(np.mean(aa["old_pairs"])),
        "old rule slowed caught": rate(sum(d == "down" for d in slowed["old"]), len(slowed["old"])),
        "old rule slowed mean pairs": float(np.mean(slowed["old_pairs"])),
        "report disagreed with the terminal": disagreements,
    }


def quiet_pairs(machine: SimulatedMachine, point: Point, count: int, order: random.Random) -> np.ndarray:
    """`count` log ratios new over ref of pairs whose processes the monitor left quiet, each pair's order drawn."""
    ratios = []
    while len(ratios) < count:
        sides = order.sample(("ref", "new"), 2)
        drawn = dict(zip(sides, (machine.draw(side, point) for side in sides)))
        if not (drawn["ref"][1] or drawn["new"][1]):
            ratios.append(math.log(drawn["new"][0] / drawn["ref"][0]))
    return np.array(ratios)


def compare_statistics(noise: Noise, slowdown: float, counts: list[int], draws: int, alpha: float,
                       seed: int) -> dict:
    """Each sign-flip statistic's claims on the same pairs, judged once at each count of pairs: the share of
    slowed points claimed and of unchanged ones."""
    machine = SimulatedMachine(noise, np.random.default_rng(seed))
    order = random.Random(seed)
    point = Point(json.dumps({"i": 0}), {"i": 0}, {"i": 0})
    out = {}
    for count in counts:
        for kind, slowed in (("slowed", slowdown), ("unchanged", 0.0)):
            machine.slowdowns = {("new", point.key): slowed}
            rows = []
            for _ in range(draws):
                machine.new_night()
                rows.append(quiet_pairs(machine, point, count, order))
            for statistic in sequential.STATISTICS:
                design = Design((count,), alpha, 1, DEFAULT_THRESHOLD, count + 1, statistic=statistic)
                claims = sum(decide(design, row, estimate=False).status == sequential.REGRESSED for row in rows)
                out[f"{count} pairs, {kind}, {statistic}"] = rate(claims, draws)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--noise", default="process=0.06,drift=0.6",
                        help="h100, gpu, or studies/simulated.Noise fields, e.g. process=0.12,drift=0.0,contended=0.02")
    parser.add_argument("--slowdown", type=float, default=0.10)
    parser.add_argument("--points", type=int, default=400, help="points simulated, half A/A and half slowed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scores", help="compare the sign-flip statistics at these counts of pairs, e.g. 12,14")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA / 2,
                        help="with --scores: the one-sided level (default 0.005, a confirmation of two suspects)")
    parser.add_argument("--json", type=Path)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    noise = parse_noise(args.noise)
    started = time.monotonic()
    if args.scores:
        counts = [int(count) for count in args.scores.split(",")]
        found = compare_statistics(noise, args.slowdown, counts, args.points, args.alpha, args.seed)
    else:
        found = simulate(noise, args.slowdown, args.points, args.seed)
    results = {"noise": noise.__dict__, "slowdown": -args.slowdown, **found, "seconds": time.monotonic() - started}
    text = json.dumps(results, indent=1, default=float)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
