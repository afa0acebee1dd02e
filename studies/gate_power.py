"""How often does the gate cry wolf, and how often does it catch a slowed point? Measured by simulation through
the gate's own code.

`python -m studies.gate_power --suite nightly --noise gpu --slowdown 0.10 --nights 2000`; what it draws and reports:
docs/decision-rules.md#gate-nights-studiesgate_powerpy.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from scipy import stats

from benches import forecast
from benches import suite as suites
from benches.night import (LEAD_SHARE, MAX_SUSPECTS, NIGHT_S, REFINE_POINTS, SCREEN_PAIRS, Night, NightSetup,
                           gate_plan, set_up_night)
from benches.options import ProcessOptions
from benches.pairing import SIDES
from studies import night_forecast
from studies.simulated import NOISES, Noise, SimulatedMachine, SimulatedRunner, parse_noise
from decisions import screening as rules
from decisions import sequential
from decisions.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from rlperf.arguments import DEFAULT_MAX_REPEATS
from rlperf.errors import BadInput
from rlperf.forkserver import LAUNCHES
from rlperf.store import PointRecord, Store

# the pairs of the screen that read 1.225, 0.950, 1.190 on the H100: how likely is a triple as far out?
SEEN_TRIPLE = (1.225, 0.950, 1.190)
# the history nights' seeds are [seed, HISTORY_STREAM, night], apart from the studied nights' [seed, night]
HISTORY_STREAM = 7_000_001
# the simulated runners are asked for directories and never write there
SCRATCH = Path("/nonexistent/simulated")


def rate(hits: int, trials: int) -> dict:
    low, high = stats.binomtest(hits, trials).proportion_ci(0.95) if trials else (np.nan, np.nan)
    return {"rate": hits / trials if trials else np.nan, "low": low, "high": high, "hits": hits, "trials": trials}


def simulate(points: list[suites.Point], plan: rules.GatePlan, noise: Noise, slowdown: float, nights: int,
             seed: int, walls: dict[str, float], process_s: float, night_s: float,
             graphed_noise: Noise | None = None, history_nights: int = 0, fit_night: bool = True,
             accept_weaker: bool = False) -> dict:
    machine = SimulatedMachine(noise, np.random.default_rng(seed), graphed_noise=graphed_noise, walls=walls,
                               process_s=process_s)
    night = Night(plan, say=lambda text: None, clock=machine.clock)
    history = drawn_history(night, machine, points, history_nights, seed)
    # the night fitted as the gate fits it to its forecast, where the processes cost anything
    costs = {point.key: walls.get(point.key, process_s) for point in points} \
        if fit_night and (walls or process_s) else None
    labels = {point.key: point.label for point in points}
    setup = set_up_night(plan, history, costs, night_s, accept_weaker, labels)
    night.plan, night.screen_pairs = setup.plan, setup.screen_pairs
    tallies = Tallies()
    if setup.refused:  # the gate refuses every such night before it measures: exit 2
        return tallies.refused(nights, setup)
    for index in range(nights):
        tallies.add(simulate_night(night, machine, points, slowdown, seed, index, night_s), setup.plan)
    return tallies.results(points, setup)


@dataclass(frozen=True)
class SimulatedNight:
    """One simulated night: the point slowed (None on a null night), the verdicts, the processes it ran and each
    stage's seconds."""

    slowed: suites.Point | None
    found: list[rules.GateVerdict]
    processes: int
    stage_seconds: dict[str, float]

    @property
    def kind(self) -> str:
        return "null" if self.slowed is None else "slowed"


def simulate_night(night: Night, machine: SimulatedMachine, points: list[suites.Point], slowdown: float, seed: int,
                   index: int, night_s: float) -> SimulatedNight:
    """Night `index`, every odd one with a point slowed by `slowdown`, drawn from seeds of its own, so gates
    simulated with the same seed meet the same nights."""
    rng = np.random.default_rng([seed, index])
    night.rng = random.Random(int(rng.integers(2 ** 63)))
    slowed = points[rng.integers(len(points))] if index % 2 else None
    machine.new_night(rng)
    machine.slowdowns = {("new", slowed.key): slowdown} if slowed else {}
    stages = StageLog(machine)
    found = night.run(points, stages.runners, stages.record, lambda point: None, lambda point: [], night_s)
    return SimulatedNight(slowed, found, stages.processes, stages.seconds())


@dataclass
class StageLog:
    """The drawn runners of a simulated night's stages, and what they ran: the processes, counted as they are
    recorded, and each stage's start on the machine's clock."""

    machine: SimulatedMachine
    processes: int = 0
    started: dict[str, float] = field(default_factory=dict)

    def runners(self, stage: str) -> dict[str, SimulatedRunner]:
        self.started[stage] = self.machine.clock()
        return {side: self.machine.runner(side, SCRATCH) for side in SIDES}

    def record(self, stage: str, side: str, point_record: PointRecord) -> None:
        self.processes += len(point_record.samples)

    def seconds(self) -> dict[str, float]:
        ends = list(self.started.values())[1:] + [self.machine.clock()]  # each stage ends where the next starts
        return {stage: end - start for (stage, start), end in zip(self.started.items(), ends)}


@dataclass
class Tallies:
    """What the nights came to, null and slowed nights apart."""

    outcome: dict[str, Counter] = field(default_factory=lambda: {"null": Counter(), "slowed": Counter()})
    processes: dict[str, list[int]] = field(default_factory=lambda: {"null": [], "slowed": []})
    seconds: dict[str, list[dict]] = field(default_factory=lambda: {"null": [], "slowed": []})
    lost: Counter = field(default_factory=Counter)  # where the slowed point was lost on bad nights
    # bad nights and catches, by the slowed point's label
    by_point: dict[str, Counter] = field(default_factory=lambda: {"nights": Counter(), "caught": Counter()})

    def add(self, simulated: SimulatedNight, plan: rules.GatePlan) -> None:
        found, slowed = simulated.found, simulated.slowed
        self.processes[simulated.kind].append(simulated.processes)
        self.seconds[simulated.kind].append(simulated.stage_seconds)
        verdicts = {verdict.screen.point_key: verdict for verdict in found}
        regressed = [v for v in found if v.status == rules.REGRESSED]
        exit_code = rules.exit_code(found)
        tally = self.outcome[simulated.kind]
        tally["nights"] += 1
        tally[f"exit {exit_code}"] += 1
        tally["undecided"] += any(v.status == rules.UNDECIDED for v in found)
        tally["job failed"] += exit_code != rules.EXIT_PASSED
        tally["could not measure"] += exit_code == rules.EXIT_UNMEASURED
        tally["suspects"] += sum(v.confirmation is not None for v in found)
        if slowed is None:
            tally["false night"] += bool(regressed)
            tally["false claims"] += len(regressed)
            return
        caught = verdicts[slowed.key].status == rules.REGRESSED
        self.by_point["nights"][slowed.label] += 1
        self.by_point["caught"][slowed.label] += caught
        strongest = max(found, key=lambda v: v.screen.evidence if math.isfinite(v.screen.evidence) else -math.inf)
        tally["slowed the strongest suspect"] += strongest.screen.point_key == slowed.key
        self.lost[where_lost(verdicts[slowed.key], found, plan)] += 1
        tally["caught"] += caught
        tally["caught and failed"] += caught and exit_code == rules.EXIT_REGRESSED
        tally["others claimed"] += sum(v.screen.point_key != slowed.key for v in regressed)
        if caught:
            tally["estimate sum"] += verdicts[slowed.key].confirmation.sps.relative

    def refused(self, nights: int, setup: NightSetup) -> dict:
        """What `nights` nights the gate refuses before measuring come to: exit 2, each."""
        for index in range(nights):
            tally = self.outcome["slowed" if index % 2 else "null"]
            tally["nights"] += 1
            tally["exit 2"] += 1
        return {"refused": setup.refused, "exit codes": self.exit_codes(), **self.promise(setup)}

    def exit_codes(self) -> dict:
        return {kind: {code: rate(tally[f"exit {code}"], tally["nights"]) for code in (0, 1, 2, 3)}
                for kind, tally in self.outcome.items()}

    @staticmethod
    def promise(setup: NightSetup) -> dict:
        promise = setup.promise
        return {} if promise is None else {"promise": {
            "slowdown": promise.slowdown, "suspects": promise.suspects, "confirmed": promise.confirmed,
            "kept": promise.kept, "weaker": setup.plan.beyond_undecided,
            "detects": {key: list(pair) for key, pair in promise.detects.items()}}}

    def results(self, points: list[suites.Point], setup: NightSetup) -> dict:
        null, bad = self.outcome["null"], self.outcome["slowed"]
        processes, seconds, fit = self.processes, self.seconds, setup.fit
        screen_processes = 2 * sum(setup.screen_pairs.values())
        return {
            "exit codes": self.exit_codes(), **self.promise(setup),
            "nights with an undecided suspect": {kind: rate(tally["undecided"], tally["nights"])
                                                 for kind, tally in (("null", null), ("slowed", bad))},
            "screen fitted to the night": None if fit is None else {
                "cut": {next(p.label for p in points if p.key == key): f"{before} -> {after}"
                        for key, (before, after) in fit.cut.items()},
                "suspects": fit.suspects, "screen_s": fit.screen_s, "refine_s": fit.refine_s,
                "reserve_s": fit.reserve_s},
            "false night": rate(null["false night"], null["nights"]),
            "null night failed (any cause)": rate(null["job failed"], null["nights"]),
            "null night could not measure": rate(null["could not measure"], null["nights"]),
            "caught and the job failed": rate(bad["caught and failed"], bad["nights"]),
            "caught": rate(bad["caught"], bad["nights"]),
            "the slowed point's evidence the strongest": rate(bad["slowed the strongest suspect"], bad["nights"]),
            "other points claimed on bad nights": rate(bad["others claimed"], bad["nights"] * (len(points) - 1)),
            "suspects confirmed per null night": null["suspects"] / max(1, null["nights"]),
            "processes per null night": float(np.mean(processes["null"])),
            "processes per bad night": float(np.mean(processes["slowed"])),
            "mean estimate when caught": bad["estimate sum"] / max(1, bad["caught"]),
            "screen pairs": {point.label: setup.screen_pairs[point.key] for point in points},
            "pairs confirmed per null night": confirmed_pairs(processes["null"], screen_processes),
            "pairs confirmed per bad night": confirmed_pairs(processes["slowed"], screen_processes),
            "confirmation seconds per null night": stage_seconds(seconds["null"], "confirm"),
            "confirmation seconds per bad night": stage_seconds(seconds["slowed"], "confirm"),
            "screen seconds per night": stage_seconds(seconds["null"] + seconds["slowed"], "screen"),
            "refinement seconds per night": stage_seconds(seconds["null"] + seconds["slowed"], "refine"),
            "the slowed point on bad nights": {what: rate(hits, bad["nights"]) for what, hits in sorted(self.lost.items())},
            "caught by the slowed point": {label: f"{self.by_point['caught'][label]} of {nights}"
                                           for label, nights in sorted(self.by_point["nights"].items())},
        }


def stored_walls(store_path: Path, points: list[suites.Point], plan: rules.GatePlan, launch: str) -> dict[str, float]:
    """Each point's process wall as the gate's forecast (benches/forecast.py) takes it from the store: on the
    machine of its newest run, from processes started as `launch` says."""
    try:
        with Store.open(store_path, readonly=True) as store:
            runs = store.runs()
            predicted = None if runs.empty else forecast.predict(store, runs["machine_key"].iloc[-1], points, plan,
                                                                 NIGHT_S, launch)
    except BadInput as error:
        raise ValueError(f"walls-store: {error}") from None
    if predicted is None:
        raise ValueError(f"walls-store: {store_path} holds no {launch} process of these points")
    return {point.key: cost.process_s for point, cost in zip(points, predicted.points)}


def stage_seconds(nights: list[dict], stage: str) -> dict:
    spent = np.array([night.get(stage, 0.0) for night in nights])
    return {"mean": float(spent.mean()), "p95": float(np.quantile(spent, 0.95)), "max": float(spent.max())}


def where_lost(verdict: rules.GateVerdict, found: list[rules.GateVerdict], plan: rules.GatePlan) -> str:
    """What became of the slowed point: caught, or the step of the gate that lost it."""
    confirmation = verdict.confirmation
    if verdict.status == rules.REGRESSED:
        return "caught"
    if not verdict.screen.suspect:
        return "not a suspect in the screen"
    if confirmation is None and verdict.status == rules.NOT_CONFIRMED:
        return f"a suspect beyond the {plan.max_suspects} confirmed"
    if confirmation is None and verdict.status == rules.UNDECIDED:
        return f"undecided: a suspect beyond the {plan.max_suspects} the weaker night confirms"
    if verdict.status == rules.UNDECIDED:
        return "undecided: the night ended before its confirmation decided"
    if confirmation is not None and confirmation.status == "skipped":
        return "a suspect the night had no time left to confirm"
    if confirmation is None or confirmation.decision is None:
        return f"confirmation not judged ({verdict.status})"
    decision = confirmation.decision
    budget = "stopped at the time budget" in confirmation.reason
    if verdict.status == rules.UNMEASURED:
        return "confirmation short of its first look at the budget" if budget else "could not measure"
    if decision.status == "inconclusive":
        return "confirmation inconclusive at the time budget" if budget else "confirmation inconclusive at its most pairs"
    return f"confirmation stopped as {decision.status}"


def confirmed_pairs(processes: list[int], screen_processes: int) -> float:
    """Pairs a night spent confirming, on average: its processes beyond the screen's (made-up pairs counted as
    confirmation, a small overcount)."""
    return float(np.mean([max(0, count - screen_processes) / 2 for count in processes]))


def drawn_history(night: Night, machine: SimulatedMachine, points: list[suites.Point], nights: int,
                  seed: int) -> dict[str, list[tuple]]:
    """What a runner's store holds of the points' noise before the nights studied: `nights` screens of unchanged
    code at the plan's pairs, drawn as the studied nights are (from seeds of their own), each point's quiet pairs'
    log ratios as the gate's screen reads them (benches/forecast.py screen_history)."""
    history: dict[str, list[tuple]] = {point.key: [] for point in points}
    for index in range(nights):
        rng = np.random.default_rng([seed, HISTORY_STREAM, index])
        night.rng = random.Random(int(rng.integers(2 ** 63)))
        machine.new_night(rng)
        machine.slowdowns = {}
        records = night.screen(points, {side: machine.runner(side, SCRATCH) for side in SIDES},
                               lambda stage, side, record: None, lambda point: None, lambda point: [])
        for screened in night.screened(records, []):
            if screened.ratios:
                history[screened.point_key].append(screened.ratios)
    return history


def noise_check(noise: Noise, draws: int, seed: int) -> dict:
    """What the noise model gives one point's pairs: their robust spread (what the gate's `pair noise` reads),
    and the chance that a screen's three pairs fall at least as far from 1 as SEEN_TRIPLE did (two of three as
    far as its second-largest log ratio)."""
    rng = np.random.default_rng(seed)
    machine = SimulatedMachine(noise, rng)
    point = suites.Point(key="{}", axes={}, config={})
    ratios = []
    for _ in range(draws):
        machine.new_night()
        ratios.append([math.log(machine.draw("new", point)[0] / machine.draw("ref", point)[0]) for _ in range(3)])
    ratios = np.abs(np.array(ratios))
    seen = sorted(abs(math.log(r)) for r in SEEN_TRIPLE)[1]
    return {"pair_spread": float(stats.median_abs_deviation(ratios[:, 0] * rng.choice([-1, 1], draws),
                                                            scale="normal")),
            "triple_as_far_as_seen": float(np.mean(np.sort(ratios, axis=1)[:, 1] >= seen))}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="nightly", help="the suite whose points are simulated (default nightly)")
    parser.add_argument("--points", type=int, help="simulate only the first N points of the suite")
    parser.add_argument("--noise", default="gpu", help="gpu, or process=0.06,drift=0.6,night=0.03,... "
                                                       "(studies/simulated.Noise fields)")
    parser.add_argument("--graphed-noise", help="the noise of the points with CUDA graphs, named or as fields like "
                                                "--noise's (default: --noise); h100-eager and h100-graphed are "
                                                "what an H100 measured, h200-eager and h200-graphed an H200")
    parser.add_argument("--slowdown", type=float, default=0.10, help="the slowed point's loss of SPS")
    parser.add_argument("--nights", type=int, default=2000, help="nights simulated, half of them slowed")
    parser.add_argument("--screen-pairs", type=int, default=SCREEN_PAIRS)
    parser.add_argument("--ranking", choices=("evidence", "estimate"), default="evidence",
                        help="the screen's rule (decisions/screening.py GatePlan; default the gate's, evidence)")
    parser.add_argument("--screen-at", type=float, default=DEFAULT_THRESHOLD,
                        help="with --ranking estimate: a suspect's screen estimate is slower than this "
                             "(default: the threshold)")
    parser.add_argument("--refine-points", type=int, default=REFINE_POINTS)
    parser.add_argument("--max-suspects", type=int, default=MAX_SUSPECTS)
    parser.add_argument("--lead-share", type=float, default=LEAD_SHARE,
                        help="the strongest suspect's share of alpha (0: alpha / suspects, nothing passed on)")
    parser.add_argument("--statistic", choices=sequential.STATISTICS, default=sequential.CAUCHY,
                        help="the confirmation's sign-flip score (default the gate's, cauchy)")
    parser.add_argument("--night-s", type=float, default=NIGHT_S,
                        help="seconds of the night, screen to confirmation, spent at each point's process wall: "
                             "the confirmation gets what the screen and refinement leave")
    parser.add_argument("--walls-from", type=Path, metavar="MEASUREMENTS",
                        help="each point's process wall modelled from the H100's measurements "
                             "(studies/night_forecast.py)")
    parser.add_argument("--walls-store", type=Path, metavar="STORE",
                        help="each point's process wall as the gate's forecast takes it from this store (the "
                             "machine of its newest run)")
    parser.add_argument("--launch", choices=LAUNCHES, default=LAUNCHES[0],
                        help="with --walls-store: the processes whose walls count (default forked, as the gate "
                             "starts them)")
    parser.add_argument("--outside-s", type=float,
                        help="with --walls-from: the harness's wall outside the trainer per process (default: the "
                             "median measured there, fresh processes)")
    parser.add_argument("--walls-scale", type=float, default=1.0,
                        help="every process's wall times this (2: a runner, or a commit, twice as slow)")
    parser.add_argument("--side-offset", type=float, default=0.0,
                        help="log SD of an offset one side's processes share for a whole night (default 0)")
    add_night_rules(parser)
    parser.add_argument("--process-s", type=float, default=0.0,
                        help="the wall of every process without --walls-from (default 0: no budget binds)")
    parser.add_argument("--max-repeats", type=int, default=DEFAULT_MAX_REPEATS,
                        help="at most this many pairs in one suspect's confirmation")
    parser.add_argument("--gpus", type=int, help="leave out the points needing more GPUs than this, as a runner "
                                                 "with that many skips them (default: every point)")
    parser.add_argument("--history-nights", type=int, default=forecast.HISTORY_NIGHTS,
                        help="unchanged nights screened before those studied, whose pairs share the screen's pairs "
                             "out by each point's noise as a runner's store would (0: every point gets "
                             f"--screen-pairs; default {forecast.HISTORY_NIGHTS}, what the gate weighs at most)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the results here")
    return parser


def add_night_rules(parser: argparse.ArgumentParser) -> None:
    """The rules a night ends by, as the gate's now or as before."""
    parser.add_argument("--night-end", choices=("undecided", "not-confirmed"), default="undecided",
                        help="what a suspect the night ran out of time for is: undecided (exit 3, the gate's rule) or "
                             "not confirmed (exit 0, the rule of plans stored before it)")
    parser.add_argument("--accept-weaker", action="store_true",
                        help="run a fitted night that cannot keep its promise, as the gate's --accept-weaker does, "
                             "rather than count each night refused (exit 2)")
    parser.add_argument("--no-fit", action="store_true",
                        help="screen every night as allocated, not fitted to the night (the gate before it fitted)")


def main() -> None:
    args = build_parser().parse_args()
    try:
        noise = parse_noise(args.noise)
        graphed_noise = parse_noise(args.graphed_noise) if args.graphed_noise else None
    except (TypeError, ValueError):
        print(f"noise: allowed {', '.join(NOISES)}, or Noise fields as process=0.06,drift=0.6 "
              f"(--noise {args.noise!r}, --graphed-noise {args.graphed_noise!r})", file=sys.stderr)
        raise SystemExit(2)
    points = [point for point in suites.load(args.suite).points
              if args.gpus is None or point.config["world_size"] <= args.gpus][:args.points]
    plan = gate_plan(ProcessOptions(threshold=DEFAULT_THRESHOLD, alpha=DEFAULT_ALPHA, max_repeats=args.max_repeats),
                     args.screen_pairs, args.max_suspects, args.refine_points)
    plan = replace(plan, lead_share=args.lead_share, statistic=args.statistic,
                   night_end_undecided=args.night_end == "undecided")
    noise = replace(noise, side_night=args.side_offset)
    if args.ranking == "estimate":
        plan = replace(plan, ranking="estimate", screen_at=args.screen_at, screen_toward=0.0)
    started = time.monotonic()
    if args.walls_from:
        walls = {key: process["interference"]["wall_s"] for key, process in
                 night_forecast.modelled_processes(args.walls_from, points, args.outside_s).items()}
    else:
        try:
            walls = stored_walls(args.walls_store, points, plan, args.launch) if args.walls_store else {}
        except ValueError as error:
            print(error, file=sys.stderr)
            raise SystemExit(2)
    walls = {key: wall * args.walls_scale for key, wall in walls.items()}
    try:
        results = simulate(points, plan, noise, args.slowdown, args.nights, args.seed, walls,
                           args.process_s * args.walls_scale, args.night_s, graphed_noise, args.history_nights,
                           not args.no_fit, args.accept_weaker)
    except BadInput as refused:
        print(refused, file=sys.stderr)
        raise SystemExit(2)
    graphed = {"graphed points": sum(bool(point.config.get("cuda_graphs")) for point in points),
               "graphed noise": asdict(graphed_noise),
               "graphed noise check": noise_check(graphed_noise, 20_000, args.seed)} if graphed_noise else {}
    results = {"suite": args.suite, "points": len(points), "noise": asdict(noise),
               "noise check": noise_check(noise, 20_000, args.seed), **graphed, "slowdown": args.slowdown,
               "plan": plan.to_dict(), "history nights": args.history_nights, "night_s": args.night_s,
               "side offset": args.side_offset,
               "process walls": {"from": str(args.walls_from or args.walls_store or "") or None,
                                 "scale": args.walls_scale,
                                 "outside the trainer": args.outside_s,
                                 "median": float(np.median(list(walls.values()))) if walls else args.process_s},
               "seconds": time.monotonic() - started, **results}
    text = json.dumps(results, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
