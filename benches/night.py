"""The gate's night: its two stages over a suite's points (decisions/screening.py's rules), a screen of every point
in a few pairs of processes and a sequential confirmation of the few strongest suspects, with whatever runs the
processes and keeps them: `rlperf gate` (benches/gate.py) gives it trainer processes and the store, the
simulations of studies/gate_power.py drawn ones."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from benches import suite as suites
from benches.options import ProcessOptions
from benches.pairing import SIDES, Pairing, frames, pair_contention
from benches.runner import PointRunner
from decisions import screening as rules
from decisions.verdicts import PointVerdict, is_contended
from rlperf.store import PointRecord, utc_now

SCREEN_PAIRS = 4
MAX_SUSPECTS = 2
MIN_QUIET = 2
# the screen weighs each point's evidence for a slowdown of this many thresholds against none
SCREEN_TOWARD = 2.0
# Seconds for the whole confirmation stage, shared among the suspects still to confirm.
BUDGET_S = 900.0


def gate_plan(options: ProcessOptions, screen_pairs: int = SCREEN_PAIRS,
              max_suspects: int = MAX_SUSPECTS) -> rules.GatePlan:
    """The gate's rules at the thresholds and limits `options` name: a point is a suspect when its screen of
    `screen_pairs` pairs is likelier slowed by SCREEN_TOWARD thresholds than unchanged; the `max_suspects` with
    the strongest evidence are confirmed."""
    return rules.GatePlan(threshold=options.threshold, alpha=options.alpha, screen_pairs=screen_pairs,
                          screen_at=0.0, max_suspects=max_suspects, max_pairs=options.max_repeats,
                          min_quiet=min(MIN_QUIET, screen_pairs), ranking="evidence",
                          screen_toward=min(0.9, SCREEN_TOWARD * options.threshold))


Runners = Callable[[str], dict[str, PointRunner]]  # stage -> the two sides' runners
Record = Callable[[str, str, PointRecord], None]  # stage, side, a finished point


class Night:
    """The gate's two stages over a suite's points, with whatever runs the processes (`runners`, one pair of
    runners per stage) and keeps them (`record`): trainer processes and the store for `rlperf gate`, drawn ones
    for the simulations of studies/gate_power.py."""

    def __init__(self, plan: rules.GatePlan, say: Callable[[str], None], rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.plan = plan
        self.say = say
        self.rng = rng or random.Random()
        self.clock = clock  # the seconds the confirmation's budget is on

    def run(self, points: list[suites.Point], runners: Runners, record: Record,
            skip_reason: Callable[[suites.Point], str | None], gpu_uuids: Callable[[suites.Point], list[str]],
            budget_s: float, start_confirmation: Callable[[], None] = lambda: None) -> list[rules.GateVerdict]:
        screen_records = self.screen(points, runners("screen"), record, skip_reason, gpu_uuids)
        screened = rules.screen(*frames([r["new"] for r in screen_records]),
                                *frames([r["ref"] for r in screen_records]), self.plan)
        chosen = rules.suspects(screened, self.plan)
        confirmed: dict[str, PointVerdict] = {}
        if chosen:
            start_confirmation()
            pair_s = {r["new"].point_key: (r["new"].seconds + r["ref"].seconds) / max(1, len(r["new"].samples))
                      for r in screen_records}
            confirmed = self.confirm(chosen, points, runners("confirm"), record, gpu_uuids, budget_s, pair_s)
        return rules.verdicts(screened, confirmed, self.plan)

    def screen(self, points: list[suites.Point], sides: dict[str, PointRunner], record: Record,
               skip_reason: Callable[[suites.Point], str | None],
               gpu_uuids: Callable[[suites.Point], list[str]]) -> list[dict[str, PointRecord]]:
        pairing = Pairing(sides, None, self.say, rng=self.rng, clock=self.clock)
        found = []
        for index, point in enumerate(points):
            records = {side: PointRecord(point.key, point.config, "ok", utc_now(), 0.0) for side in SIDES}
            reason = skip_reason(point)
            if reason is not None:
                for side in SIDES:
                    records[side].status, records[side].reason = "skipped", reason
                self.say(f"skipped {point.label}: {reason}")
            else:
                directories = pairing.directories(index, point)
                pair = quiet = 0
                # a pair with a contended process is left out, so the screen makes up for it, within limits
                while quiet < self.plan.screen_pairs and pair < 2 * self.plan.screen_pairs:
                    if pairing.run_pair(pair, point, records, directories, gpu_uuids(point)) is not None:
                        break
                    quiet += not any(is_contended(records[side].samples[-1][1]) for side in SIDES)
                    pair += 1
                self.say_screen(point, records)
            for side in SIDES:
                record("screen", side, records[side])
            found.append(records)
        return found

    def say_screen(self, point: suites.Point, records: dict[str, PointRecord]) -> None:
        if records["new"].status != "ok" or records["ref"].status != "ok":
            return
        ratios = [new[1]["sps"] / ref[1]["sps"] for ref, new in zip(records["ref"].samples, records["new"].samples)]
        busy = [f"pair {pair + 1} {note}" for pair in range(len(ratios))
                if (note := pair_contention(records, pair, {"ref": "baseline", "new": "new"}))]
        self.say(f"screen {point.label}: new / baseline SPS per pair " + ", ".join(f"{r:.3f}" for r in ratios)
                 + (f"; left out: {', '.join(busy)}" if busy else ""))

    def confirm(self, chosen: list[rules.Screened], points: list[suites.Point], sides: dict[str, PointRunner],
                record: Record, gpu_uuids: Callable[[suites.Point], list[str]], budget_s: float,
                pair_s: dict[str, float] | None = None) -> dict[str, PointVerdict]:
        """Each suspect in turn until it decides or its share of the budget is spent: what is left less what the
        suspects after it need to reach their first look (at their screen's seconds a pair), and never less
        than an equal share of what is left."""
        design = self.plan.confirmation(len(chosen))
        self.say(f"confirming {len(chosen)} suspects, each at alpha {design.alpha:.3g} (looks at "
                 f"{', '.join(map(str, design.looks))} quiet pairs): " + ", ".join(s.label for s in chosen))
        pairing = Pairing(sides, design, self.say, rng=self.rng, clock=self.clock)
        started = self.clock()
        by_key = {point.key: (index, point) for index, point in enumerate(points)}
        confirmed = {}
        for done, suspect in enumerate(chosen):
            index, point = by_key[suspect.point_key]
            left = started + budget_s - self.clock()
            reserve = sum(design.looks[0] * (pair_s or {}).get(later.point_key, 0.0) for later in chosen[done + 1:])
            deadline = self.clock() + max(left / (len(chosen) - done), left - reserve)
            records = {side: PointRecord(point.key, point.config, "ok", utc_now(), 0.0) for side in SIDES}
            confirmed[suspect.key] = pairing.measure(index, point, records, gpu_uuids(point), deadline)
            for side in SIDES:
                record("confirm", side, records[side])
        return confirmed
