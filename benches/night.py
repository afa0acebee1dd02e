"""The gate's night: its stages over a suite's points (decisions/screening.py's rules), a screen of every point
in a few pairs of processes, a few more pairs for the screen's leaders, and a sequential confirmation of the few
strongest suspects, with whatever runs the processes and keeps them: `rlperf gate` (benches/gate.py) gives it
trainer processes and the store, the simulations of studies/gate_power.py drawn ones."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import pandas as pd

from benches import forecast
from benches import suite as suites
from benches.options import ProcessOptions
from benches.pairing import SIDES, Pairing, frames, pair_contention
from benches.promise import Detecting, Promise, fit_promise, refusal
from benches.runner import PointRunner
from decisions import screening as rules
from decisions import sequential
from decisions.verdicts import PointVerdict, is_contended
from rlperf.store import PointRecord, point_label, utc_now

# Sized by simulation at the H100's noise, one GPU's nightly points in a night of an hour; the rates and what the
# other sizes lost: docs/decision-rules.md#measured-by-simulation.
SCREEN_PAIRS = 3
REFINE_POINTS = 4
REFINE_PAIRS = 2
MAX_SUSPECTS = 2
MIN_QUIET = 2
# the screen weighs each point's evidence for a slowdown of this many thresholds against none
SCREEN_TOWARD = 2.0
# Seconds of the whole night, screen to confirmation: the confirmation gets what the screen and refinement leave,
# the strongest suspect first.
NIGHT_S = 3600.0
# the strongest suspect's share of alpha, the others splitting the rest (decisions/screening.py GatePlan)
LEAD_SHARE = 0.8
# the night's pair spread is taken at most this many times the spread within points (screening.night_scale)
SPREAD_CAP = 2.0


def gate_plan(options: ProcessOptions, screen_pairs: int = SCREEN_PAIRS, max_suspects: int = MAX_SUSPECTS,
              refine_points: int = REFINE_POINTS) -> rules.GatePlan:
    """The gate's rules at the thresholds and limits `options` name: the `refine_points` points whose screen of
    `screen_pairs` pairs gives the strongest evidence get REFINE_PAIRS more; a point is a suspect when its pairs
    are likelier slowed by SCREEN_TOWARD thresholds than unchanged; the `max_suspects` with the strongest
    evidence are confirmed with the Cauchy sign-flip score."""
    return rules.GatePlan(threshold=options.threshold, alpha=options.alpha, screen_pairs=screen_pairs,
                          refine_points=refine_points, refine_pairs=REFINE_PAIRS if refine_points else 0,
                          screen_at=0.0, max_suspects=max_suspects, max_pairs=options.max_repeats,
                          min_quiet=min(MIN_QUIET, screen_pairs), ranking="evidence",
                          screen_toward=min(0.9, SCREEN_TOWARD * options.threshold), statistic=sequential.CAUCHY,
                          lead_share=LEAD_SHARE, spread_cap=SPREAD_CAP, night_end_undecided=True)


@dataclass(frozen=True)
class NightSetup:
    """What a night is measured by: its plan, each point's screen pairs (by point key), the fit that cut them to
    the night's seconds and what that fit promises (None where the night was not fitted), and, where it cannot keep
    the promise, the line it refuses with."""

    plan: rules.GatePlan
    screen_pairs: dict[str, int]
    fit: forecast.NightFit | None = None
    promise: Promise | None = None
    refused: str | None = None


def set_up_night(plan: rules.GatePlan, history: dict[str, list[tuple]], costs: dict[str, float] | None,
                 night_s: float, accept_weaker: bool = False, labels: dict[str, str] | None = None) -> NightSetup:
    """The night as the gate sets it up before it measures, and as studies/gate_power.py simulates it: the screen's
    pairs shared by each point's noise on earlier nights (`history`), then, where each point's process is known to
    cost `costs[key]` seconds, fitted into `night_s` (benches/promise.py: refused where the fit breaks the promise,
    unless `accept_weaker`; a refusal names the points by `labels`, by point key)."""
    weighed = NightSetup(replace(plan, point_spreads=rules.relative_spreads(history)),
                         rules.screen_allocation(history, plan))
    return weighed if costs is None else fitted_night(weighed, costs, night_s, history=history,
                                                      accept_weaker=accept_weaker, labels=labels)


def fitted_night(setup: NightSetup, costs: dict[str, float], night_s: float, screened: frozenset[str] = frozenset(),
                 history: dict[str, list[tuple]] | None = None, accept_weaker: bool = False,
                 labels: dict[str, str] | None = None) -> NightSetup:
    """`setup` fitted into `night_s` at these costs (benches/forecast.py fit_night): once points are `screened`,
    only the others lose pairs, and the suspects stay as many. Where the fit breaks the night's promise, `refused`
    says why, or with `accept_weaker` the night runs with every suspect beyond those confirmed undecided."""
    detecting = Detecting(setup.plan, history or {key: [] for key in costs})
    allocated = {key: setup.screen_pairs[key] for key in costs}
    fit, kept = fit_promise(costs, allocated, detecting, night_s, screened)
    if fit is None or not kept.kept:
        if not accept_weaker or fit is None:
            labels = labels or {key: point_label(key) for key in costs}
            return replace(setup, fit=fit, promise=kept,
                           refused=refusal(kept, costs, allocated, detecting, night_s, labels, screened))
    plan = replace(setup.plan, max_suspects=fit.suspects, beyond_undecided=not kept.kept)
    return NightSetup(plan, {**setup.screen_pairs, **fit.pairs}, fit, kept)


Runners = Callable[[str], dict[str, PointRunner]]  # stage -> the two sides' runners
Record = Callable[[str, str, PointRecord], None]  # stage, side, a finished point


class Night:
    """The gate's stages over a suite's points, with whatever runs the processes (`runners`, one pair of
    runners per stage) and keeps them (`record`): trainer processes and the store for `rlperf gate`, drawn ones
    for the simulations of studies/gate_power.py."""

    def __init__(self, plan: rules.GatePlan, say: Callable[[str], None], rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic, screen_pairs: dict[str, int] | None = None):
        self.plan = plan
        self.say = say
        self.rng = rng or random.Random()
        self.clock = clock  # the seconds the night's time is on
        # each point's quiet pairs in the screen, by point key (decisions/screening.screen_allocation); the plan's
        # screen_pairs for a point it does not name
        self.screen_pairs = screen_pairs or {}

    def run(self, points: list[suites.Point], runners: Runners, record: Record,
            skip_reason: Callable[[suites.Point], str | None], gpu_uuids: Callable[[suites.Point], list[str]],
            night_s: float, start_stage: Callable[[str], None] = lambda stage: None) -> list[rules.GateVerdict]:
        """The night's verdicts, its stages within `night_s` seconds: the confirmation gets what is left."""
        started = self.clock()
        screen_records = self.screen(points, runners("screen"), record, skip_reason, gpu_uuids)
        screened = self.screened(screen_records, [])
        leaders = rules.leaders(screened, self.plan)
        if leaders:
            start_stage("refine")
            refined = self.refine(leaders, points, screen_records, runners("refine"), record, gpu_uuids)
            screened = self.screened(screen_records, refined)
        chosen = rules.suspects(screened, self.plan)
        confirmed: dict[str, PointVerdict] = {}
        if chosen:
            start_stage("confirm")
            pair_s = {r["new"].point_key: (r["new"].seconds + r["ref"].seconds) / max(1, len(r["new"].samples))
                      for r in screen_records}
            left = started + night_s - self.clock()
            confirmed = self.confirm(chosen, points, runners("confirm"), record, gpu_uuids, left, pair_s)
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
                wanted = self.screen_pairs.get(point.key, self.plan.screen_pairs)
                # a pair with a contended process is left out, so the screen makes up for it, within limits
                while quiet < wanted and pair < 2 * wanted:
                    if pairing.run_pair(pair, point, records, directories, gpu_uuids(point)) is not None:
                        break
                    quiet += not any(is_contended(records[side].samples[-1][1]) for side in SIDES)
                    pair += 1
                self.say_screen(point, records)
            for side in SIDES:
                record("screen", side, records[side])
            found.append(records)
        return found

    def screened(self, screen_records: list[dict[str, PointRecord]],
                 refined: list[dict[str, PointRecord]]) -> list[rules.Screened]:
        """The screen's verdicts on its pairs and the refined points' further pairs."""
        sides = {side: frames([r[side] for r in screen_records]) for side in SIDES}
        if refined:
            sides = {side: (points, pd.concat([samples, frames([r[side] for r in refined])[1]], ignore_index=True))
                     for side, (points, samples) in sides.items()}
        return rules.screen(*sides["new"], *sides["ref"], self.plan)

    def refine(self, leaders: list[rules.Screened], points: list[suites.Point],
               screen_records: list[dict[str, PointRecord]], sides: dict[str, PointRunner], record: Record,
               gpu_uuids: Callable[[suites.Point], list[str]]) -> list[dict[str, PointRecord]]:
        """`refine_pairs` more pairs for each of the screen's leaders, numbered after its screen's pairs."""
        pairing = Pairing(sides, None, self.say, rng=self.rng, clock=self.clock)
        by_key = {point.key: (index, point) for index, point in enumerate(points)}
        refined = []
        for leader in leaders:
            index, point = by_key[leader.point_key]
            records = {side: PointRecord(point.key, point.config, "ok", utc_now(), 0.0) for side in SIDES}
            directories = pairing.directories(index, point)
            first = len(screen_records[index]["new"].samples)
            for pair in range(first, first + self.plan.refine_pairs):
                if pairing.run_pair(pair, point, records, directories, gpu_uuids(point)) is not None:
                    break
            self.say_screen(point, records)
            for side in SIDES:
                record("refine", side, records[side])
            refined.append(records)
        return refined

    def say_screen(self, point: suites.Point, records: dict[str, PointRecord]) -> None:
        if records["new"].status != "ok" or records["ref"].status != "ok":
            return
        ratios = [new[1].sps / ref[1].sps for ref, new in zip(records["ref"].samples, records["new"].samples)]
        busy = [f"pair {pair + 1} {note}" for pair in range(len(ratios))
                if (note := pair_contention(records, pair, {"ref": "baseline", "new": "new"}))]
        self.say(f"screen {point.label}: new / baseline SPS per pair " + ", ".join(f"{r:.3f}" for r in ratios)
                 + (f"; left out: {', '.join(busy)}" if busy else ""))

    def confirm(self, chosen: list[rules.Screened], points: list[suites.Point], sides: dict[str, PointRunner],
                record: Record, gpu_uuids: Callable[[suites.Point], list[str]], budget_s: float,
                pair_s: dict[str, float] | None = None) -> dict[str, PointVerdict]:
        """Each suspect in turn, the strongest evidence first, until it decides or the budget is spent: the
        strongest is the point that got slower on most bad nights, and a confirmation that neither claims nor
        stops as not slower is leaning slower, so the time goes to it rather than being held back for the
        suspects after it. A suspect whose pair (at its screen's seconds a pair) no longer fits in what is left is
        stored as skipped: `undecided`, as is one the night ends before it decides."""
        pair_s = pair_s or {}
        unclaimed = [self.plan.confirmation(len(chosen), done) for done in range(len(chosen))]
        self.say(f"confirming {len(chosen)} suspect{'s' if len(chosen) > 1 else ''}, at alpha "
                 f"{', '.join(f'{d.alpha:.3g}' for d in unclaimed)}"
                 f"{' (a claim passes its level on to the next)' if self.plan.lead_share and len(chosen) > 1 else ''}"
                 f": " + ", ".join(s.label for s in chosen))
        started = self.clock()
        by_key = {point.key: (index, point) for index, point in enumerate(points)}
        confirmed: dict[str, PointVerdict] = {}
        for done, suspect in enumerate(chosen):
            index, point = by_key[suspect.point_key]
            design = rules.confirmation_designs(chosen[:done + 1], confirmed, self.plan, len(chosen))[suspect.key]
            records = {side: PointRecord(point.key, point.config, "ok", utc_now(), 0.0) for side in SIDES}
            deadline = started + budget_s
            if deadline - self.clock() < max(pair_s.get(suspect.point_key, 0.0), 1e-9):
                reason = (f"{max(0.0, deadline - self.clock()):.0f} s of the night left, a pair takes "
                          f"{pair_s.get(suspect.point_key, 0.0):.0f} s")
                for side in SIDES:
                    records[side].status, records[side].reason = "skipped", reason
                confirmed[suspect.key] = PointVerdict(suspect.key, suspect.label, "skipped", reason)
                self.say(f"{point.label}: {reason}")
            else:
                self.say(f"confirming {point.label} at alpha {design.alpha:.3g} (looks at "
                         f"{', '.join(map(str, design.looks))} quiet pairs)")
                pairing = Pairing(sides, design, self.say, rng=self.rng, clock=self.clock, budget_flag="--night-s")
                confirmed[suspect.key] = pairing.measure(index, point, records, gpu_uuids(point), deadline)
            for side in SIDES:
                record("confirm", side, records[side])
        return confirmed
