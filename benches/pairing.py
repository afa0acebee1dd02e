"""One point measured on two sides, "ref" and "new" (two checkouts), in pairs of processes whose order is drawn at
random, judged after each pair by a paired sequential design: the machinery of `rlperf bench --against`, the gate,
bisect and confirm (and the simulations of studies/ that measure its error rates through this code)."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from benches import suite as suites
from benches.runner import PointRunner
from decisions.sequential import Design, pairs_to_decide
from decisions.verdicts import PointVerdict, fmt_interval, is_contended, judge_pair_point
from rlperf.store import PointRecord, point_label
from rlperf.summary import RunSummary

SIDES = ("ref", "new")


def frame(record: PointRecord) -> pd.DataFrame:
    """A point's samples shaped like `Store.samples()`, for judging before they are stored."""
    summaries = [(repeat, RunSummary.read(summary)) for repeat, summary in record.samples]
    return pd.DataFrame([{"point_key": record.point_key, "repeat": repeat, "sps": summary.sps,
                          "phases": summary.phases, "summary": summary} for repeat, summary in summaries],
                        columns=["point_key", "repeat", "sps", "phases", "summary"])


def frames(records: list[PointRecord]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Points and samples frames, shaped like the store's, of one side's records."""
    points = pd.DataFrame([{"point_key": r.point_key, "config": r.config, "status": r.status, "reason": r.reason}
                           for r in records], columns=["point_key", "config", "status", "reason"])
    samples = [frame(r) for r in records]
    return points, pd.concat(samples, ignore_index=True) if samples else frame(PointRecord("", {}, "ok", "", 0.0))


class Pairing:
    """One point measured on two sides, "ref" and "new" (two checkouts), in pairs of processes whose order is
    drawn at random. After each pair the point is judged by `design` (new against ref); a decision ends it, and
    so do the design's most pairs, the deadline (then the pairs there are make a final look), or a repeat
    that fails. `clock` tells the seconds the deadline is on: the monotonic clock, or a simulated machine's."""

    def __init__(self, sides: dict[str, PointRunner], design: Design | None, say: Callable[[str], None],
                 names: dict[str, str] | None = None, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic, budget_flag: str = "--budget-s"):
        self.sides = sides
        self.budget_flag = budget_flag  # the flag that sets the deadline, named when it looks too short
        self.clock = clock
        self.design = design
        self.say = say
        self.names = names or {side: side for side in sides}  # how the progress lines call each side
        self.rng = rng or random.Random()

    def fewest_decisive(self) -> float:
        """The fewest pairs at which the design could claim anything: inf when its last look cannot."""
        counts = [count for count in self.design.looks if 0.5 ** count <= self.design.side_alpha]
        return counts[0] if counts else math.inf

    def directories(self, index: int, point: suites.Point) -> dict[str, Path]:
        found = {side: runner.point_dir(index, point) for side, runner in self.sides.items()}
        for directory in found.values():
            directory.mkdir(parents=True, exist_ok=True)
        return found

    def run_pair(self, pair: int, point: suites.Point, records: dict[str, PointRecord],
                 directories: dict[str, Path], gpu_uuids: list[str]) -> PointVerdict | None:
        """One process of each side, in an order drawn at random and stored with both samples; a `failed`
        verdict naming the side when a process fails, else None."""
        order = ("ref", "new") if self.rng.random() < 0.5 else ("new", "ref")
        for side in order:
            record = records[side]
            t0 = self.clock()
            status, reason, summary = self.sides[side].run_repeat(point, pair, directories[side], gpu_uuids, record)
            record.seconds += self.clock() - t0
            if status != "ok":
                record.status, record.reason = status, f"repeat {pair + 1}: {reason}"
                failed = PointVerdict("", point.label, "failed",
                                      f"{self.names[side]}: {status}: {reason}".splitlines()[0])
                self.say(f"{point.label}: {failed.reason}")
                return failed
            summary.pair = {"index": pair, "first": order[0]}
            record.samples.append((pair, summary))
        return None

    def measure(self, index: int, point: suites.Point, records: dict[str, PointRecord], gpu_uuids: list[str],
                deadline: float) -> PointVerdict:
        directories = self.directories(index, point)
        pair_seconds: list[float] = []
        warned = False
        for pair in range(self.design.max_pairs):
            if pair_seconds and self.clock() + sum(pair_seconds) / len(pair_seconds) > deadline:
                verdict = self.judge(point, records, ended=True)
                verdict.reason = f"stopped at the time budget after {pair} pairs; " + verdict.reason
                return verdict
            pair_start = self.clock()
            failed = self.run_pair(pair, point, records, directories, gpu_uuids)
            if failed is not None:
                return failed
            pair_seconds.append(self.clock() - pair_start)
            verdict = self.judge(point, records, ended=False)
            self.say_pair(point, pair, records, verdict)
            if verdict.decision.stopped:
                return verdict
            if not warned and verdict.decision.pairs >= self.design.looks[0]:
                warned = self.warn_budget(point, verdict, deadline, sum(pair_seconds) / len(pair_seconds))
        return self.judge(point, records, ended=True)

    def judge(self, point: suites.Point, records: dict[str, PointRecord], ended: bool) -> PointVerdict:
        verdict = judge_pair_point(frame(records["new"]), frame(records["ref"]), self.design, ended=ended)
        verdict.point = point_label(point.key)
        return verdict

    def warn_budget(self, point: suites.Point, verdict: PointVerdict, deadline: float, pair_s: float) -> bool:
        """Says once, at the first look, when the budget is unlikely to reach a decision at the noise measured."""
        decision = verdict.decision
        needed = pairs_to_decide(decision.spread, math.log1p(decision.naive), self.design)
        left = deadline - self.clock()
        # pairs that took no time (a simulated machine without walls) leave the budget unbound
        affordable = decision.pairs + max(0, int(left / pair_s)) if pair_s > 0 else self.design.max_pairs
        if needed is None or needed <= min(affordable, self.design.max_pairs):
            return False
        self.say(f"{point.label}: at the pair spread measured ({decision.spread:.1%}) and a change of "
                 f"{decision.naive:+.1%}, deciding likely needs about {needed} quiet pairs (~{needed * pair_s:.0f} s "
                 f"at {pair_s:.0f} s a pair); the budget and --max-repeats allow {min(affordable, self.design.max_pairs)}: "
                 f"it will likely end inconclusive (raise {self.budget_flag} or --max-repeats, or the threshold)")
        return True

    def say_pair(self, point: suites.Point, pair: int, records: dict[str, PointRecord],
                 verdict: PointVerdict) -> None:
        ref_sps, new_sps = (records[side].samples[-1][1].sps for side in ("ref", "new"))
        first = records["new"].samples[-1][1].pair["first"]
        text = (f"{point.label} pair {pair + 1}: {self.names['ref']} {ref_sps:,.0f} SPS, "
                f"{self.names['new']} {new_sps:,.0f} SPS ({self.names[first]} first)")
        contended = pair_contention(records, -1, self.names)
        if contended:
            text += f"; {contended}, left out"
        decision = verdict.decision
        if decision.pairs in self.design.looks or decision.stopped:
            text += f"; look at {decision.pairs} quiet pairs: {verdict.status}"
            if verdict.sps is not None and decision.stopped:
                text += f", change {verdict.sps.relative:+.1%} {fmt_interval(verdict.sps)}"
        self.say(text)


def pair_contention(records: dict[str, PointRecord], pair: int, names: dict[str, str]) -> str:
    """`contended (NAME: why; ...)` for a pair (an index into both sides' samples) whose machine was busy, or ''."""
    whys = [f"{names[side]}: {summary.interference.get('why') or 'flagged by the interference monitor'}"
            for side, (_, summary) in ((side, records[side].samples[pair]) for side in SIDES)
            if is_contended(summary)]
    return f"contended ({'; '.join(whys)})" if whys else ""
