"""How long will a gate's night take, and which points cost most? Said before it measures, from what the store
knows of earlier runs on this machine (on a machine it knows nothing of, after the screen's first point, from
that point's processes); and, after, how far off that was. A process costs the median wall of its point's newest
processes here, started the same way (docs/gate.md#rlperf-gate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Any, Iterable

from benches.suite import Point
from decisions import screening as rules
from decisions.screening import GatePlan
from rlperf.errors import BadInput
from rlperf.store import Store
from rlperf.summary import RunSummary

# Processes per point a forecast is taken from (the newest first), and how many runs back it looks for them.
RECENT_PROCESSES = 12
RECENT_RUNS = 24
# the earlier gate screens a point's noise is weighed from (screen_history), the newest first
HISTORY_NIGHTS = 30
SHOWN_POINTS = 5


@dataclass(frozen=True)
class PointCost:
    label: str
    process_s: float
    known_from: int  # stored processes of this very point behind process_s (0: the machine's median)
    pairs: int  # its screen pairs


@dataclass(frozen=True)
class Forecast:
    points: tuple[PointCost, ...]
    suspects_s: float  # every suspect's pairs at the costliest points: the most a confirmation could use
    fallback_s: float  # what a point the store does not know was taken to cost: the machine's median process
    night_s: float  # the night, screen to confirmation
    refine_s: tuple[float, float] = (0.0, 0.0)  # the refinement at the cheapest and at the costliest leaders

    @property
    def screen_s(self) -> float:
        return sum(self.point_screen_s(point) for point in self.points)

    def point_screen_s(self, point: PointCost) -> float:
        return 2 * point.pairs * point.process_s

    @property
    def confirm_max_s(self) -> float:
        """The confirmation stage's ceiling: what the night leaves after the screen and the cheapest refinement, or
        every suspect's pairs if less."""
        return max(0.0, min(self.suspects_s, self.night_s - self.screen_s - self.refine_s[0]))

    @property
    def overrun(self) -> bool:
        """The screen and the costliest refinement may leave no time to confirm a suspect."""
        return self.screen_s + self.refine_s[1] >= self.night_s

    def costliest(self, count: int = SHOWN_POINTS) -> list[PointCost]:
        return sorted(self.points, key=lambda point: -point.process_s)[:count]

    def lines(self, heading: str = "forecast") -> list[str]:
        known = sum(point.known_from > 0 for point in self.points)
        low = self.screen_s + self.refine_s[0]
        high = max(self.screen_s + self.refine_s[1], min(self.night_s, low + self.confirm_max_s))
        refine = (f"refinement {duration(self.refine_s[0])} to {duration(self.refine_s[1])}; "
                  if self.refine_s[1] else "")
        pairs = sorted({point.pairs for point in self.points})
        each = f"x {2 * pairs[0]} processes" if len(pairs) == 1 else f"x {2 * pairs[0]} to {2 * pairs[-1]} processes"
        out = [f"{heading}: screen {duration(self.screen_s)} ({len(self.points)} points {each}; {known} of them "
               f"from their own earlier processes here"
               + (f", the others at this machine's median process ({self.fallback_s:.0f} s)"
                  if known < len(self.points) else "") + f"); {refine}"
               f"confirmation none without suspects, at most {duration(self.confirm_max_s)} (what the night of "
               f"{duration(self.night_s)} leaves): the night {duration(low)} to {duration(high)}"]
        if self.overrun:
            out.append(f"{heading}: the screen and refinement may take {duration(self.screen_s + self.refine_s[1])} "
                       f"of the night's {duration(self.night_s)}, leaving suspects no time to be confirmed: raise "
                       f"--night-s or lower --screen-pairs")
        out.append(f"{heading}: costliest points: " + "; ".join(
            f"{point.label} {duration(self.point_screen_s(point))} ({point.process_s:.0f} s a process)"
            for point in self.costliest()))
        return out

    def review(self, store: Store, runs: dict[tuple[str, str], str], elapsed_s: float) -> str:
        """How far off the forecast was: each stage's stored processes (`runs`: (stage, side) -> run id) against
        it, and `elapsed_s`, the night's wall from before the screen to after the confirmation."""
        measured = stored_stage_walls(store, runs)
        screen, confirm = measured.get("screen", 0.0), measured.get("confirm", 0.0)
        off = f"{screen / self.screen_s - 1:+.0%}" if self.screen_s > 0 else "n/a"
        refine = (f"refinement {duration(measured.get('refine', 0.0))} ({duration(self.refine_s[0])} to "
                  f"{duration(self.refine_s[1])} forecast); " if self.refine_s[1] else "")
        return (f"forecast against measured: screen {duration(screen)} of processes where {duration(self.screen_s)} "
                f"was forecast ({off}); {refine}confirmation {duration(confirm)} (at most "
                f"{duration(self.confirm_max_s)} forecast); the night {duration(elapsed_s)} in all")


def predict(store: Store, machine_key: str, points: Iterable[Point], plan: GatePlan, night_s: float,
            launch: str, screen_pairs: dict[str, int] | None = None) -> Forecast | None:
    """The forecast of a night over `points` (those the machine can run) on the machine `machine_key`, its
    processes started as `launch` says, each point screened in `screen_pairs[point key]` pairs (`plan.screen_pairs`
    where it says none), judged by `plan` within `night_s` seconds; None where the store holds no such process of
    this machine (`unknown` says why)."""
    points = list(points)
    screen_pairs = screen_pairs or {}
    walls = process_walls(store, machine_key, points, launch)
    every = [wall for found in walls.values() for wall in found]
    if not every:
        return None
    fallback_s = median(every)
    costs = tuple(PointCost(point.label, median(walls[point.key]) if walls[point.key] else fallback_s,
                            len(walls[point.key]), screen_pairs.get(point.key, plan.screen_pairs)) for point in points)
    by_cost = sorted(cost.process_s for cost in costs)
    suspects = sum(2 * plan.max_pairs * process_s for process_s in by_cost[::-1][:plan.max_suspects])
    leaders = min(plan.refine_points, len(by_cost)) if plan.refine_pairs else 0
    refine = (2 * plan.refine_pairs * sum(by_cost[:leaders]),
              2 * plan.refine_pairs * sum(by_cost[len(by_cost) - leaders:]))
    return Forecast(costs, suspects, fallback_s, night_s, refine)


@dataclass(frozen=True)
class NightFit:
    """A night planned to fit: each point's screen pairs, those cut, and the suspects it confirms."""

    pairs: dict[str, int]  # by point key
    cut: dict[str, tuple[int, int]]  # point key -> (pairs before, after), for the points given fewer
    suspects: int  # the most suspects confirmed
    screen_s: tuple[float, float]  # the screen's processes before and after
    refine_s: float  # the refinement at the median process
    reserve_s: float  # kept for the confirmation: each suspect's first look at the costliest points' pairs


def confirmation_reserve_s(plan: GatePlan, suspects: int, costs: list[float]) -> float:
    """What a night keeps for confirming `suspects` suspects: each reaching its design's first look, the strongest
    at the costliest point's pair, the next at the next costliest. A suspect the night ends before it decides fails
    the job, so a night that keeps less fails clean nights whose suspects are costly points."""
    costliest = sorted(costs, reverse=True)
    return sum(plan.confirmation(suspects, index).looks[0] * 2 * costliest[min(index, len(costliest) - 1)]
               for index in range(suspects))


def fit_night(costs: dict[str, float], pairs: dict[str, int], plan: GatePlan, night_s: float,
              spreads: dict[str, float] | None = None, fixed: frozenset[str] = frozenset(),
              fewer_suspects: bool = True) -> NightFit:
    """The night fitted into `night_s`: the screen (`pairs`, by point key, a process of each point costing
    `costs[key]` seconds), the refinement and the confirmation's reserve. Screen pairs go first, a pair at a time,
    down to `plan.min_quiet`, never from a point already screened (`fixed`): each cut is the pair whose loss widens
    its point's estimate least for the seconds it saves, so from the points whose earlier screens were quiet
    (`spreads`, relative to the others'), the costliest, and those with the most pairs. Then, with
    `fewer_suspects`, the suspects confirmed, down to one. BadInput (naming --night-s) when nothing fits."""
    spreads = spreads or {}
    median_s = median(costs.values())
    leaders = min(plan.refine_points, len(costs)) if plan.refine_pairs else 0
    refine_s = 2 * plan.refine_pairs * leaders * median_s

    def screen_s(given: dict[str, int]) -> float:
        return sum(2 * given[key] * costs[key] for key in costs)

    def widening(key: str) -> float:  # the variance a point's estimate gains by its last pair, per second saved
        given = fitted[key]
        return spreads.get(key, 1.0) ** 2 / (given * (given - 1)) / costs[key]

    fewest = screen_s({key: pairs[key] if key in fixed else min(pairs[key], plan.min_quiet) for key in costs})
    suspects = max(1, plan.max_suspects)
    while fewer_suspects and suspects > 1 and \
            fewest + refine_s + confirmation_reserve_s(plan, suspects, list(costs.values())) > night_s:
        suspects -= 1
    reserve_s = confirmation_reserve_s(plan, suspects, list(costs.values()))
    if fewest + refine_s + reserve_s > night_s:
        raise BadInput(
            f"night-s: {night_s:g} s cannot hold the screen at its fewest pairs ({plan.min_quiet} a point, "
            f"{duration(fewest)}), the refinement ({duration(refine_s)}) and {duration(reserve_s)} for "
            f"{'the suspects' if suspects > 1 else 'a suspect'} to reach a first look: raise --night-s to at least "
            f"{math.ceil(fewest + refine_s + reserve_s)}, or gate fewer points")
    fitted = dict(pairs)
    while screen_s(fitted) + refine_s + reserve_s > night_s:
        fitted[min((key for key in costs if key not in fixed and fitted[key] > plan.min_quiet), key=widening)] -= 1
    cut = {key: (pairs[key], fitted[key]) for key in costs if fitted[key] != pairs[key]}
    return NightFit(fitted, cut, suspects, (screen_s(pairs), screen_s(fitted)), refine_s, reserve_s)


def fit_line(fit: NightFit, points: list[Point], plan: GatePlan, night_s: float,
             history: dict[str, list[tuple]]) -> str | None:
    """What the fit cut and what it costs: the suspects confirmed, the points given fewer pairs, and the smallest
    slowdown each then flags 95% of the times at its pair spread on earlier nights (the median point's where it
    has none); None when nothing was cut."""
    if not fit.cut and fit.suspects == plan.max_suspects:
        return None
    from dataclasses import replace

    known = {key: spread for key, nights in history.items() if math.isfinite(spread := rules.spread_within(nights))}
    typical = median(known.values()) if known else None
    costs = []
    for point in points:
        if point.key in fit.cut and (spread := known.get(point.key, typical)) is not None:
            before, after = (rules.detectable(replace(plan, screen_pairs=pairs), spread) for pairs in fit.cut[point.key])
            costs.append(f"{point.label} {fit.cut[point.key][0]} -> {fit.cut[point.key][1]} pairs, detecting "
                         f"{after:.1%} rather than {before:.1%}")
    cost = "; ".join(costs) if costs else "no earlier screen here tells what that costs in detectable change"
    suspects = (f"{fit.suspects} suspect confirmed rather than {plan.max_suspects} (a suspect beyond is undecided); "
                if fit.suspects < plan.max_suspects else "")
    cut = (f"{len(fit.cut)} point{'s get' if len(fit.cut) > 1 else ' gets'} fewer pairs, the screen "
           f"{duration(fit.screen_s[0])} -> {duration(fit.screen_s[1])}: {cost}" if fit.cut else "every screen pair kept")
    return (f"night: fitted to {duration(night_s)}, keeping {duration(fit.reserve_s)} for the suspects' first looks "
            f"at the costliest points: {suspects}{cut}")


def unknown(store: Store, machine_key: str) -> str:
    """Why nothing could be forecast, in the line the gate says instead of a forecast."""
    runs = store.runs()
    if runs.empty:
        why = "the store is empty"
    elif not (runs["machine_key"] == machine_key).any():
        why = "the store holds no run of this machine"
    else:
        why = "the store holds no process of these points on this machine started this way"
    return f"forecast: none yet ({why}); it follows the screen's first point, from that point's processes"


def process_walls(store: Store, machine_key: str, points: list[Point], launch: str) -> dict[str, list[float]]:
    """Per point key, the walls of the newest stored processes of that point on this machine started as `launch`
    says."""
    walls: dict[str, list[float]] = {point.key: [] for point in points}
    wanted = {point.key: point.config for point in points}
    runs = store.runs()
    if runs.empty:
        return walls
    runs = runs[runs["machine_key"] == machine_key].iloc[::-1][:RECENT_RUNS]
    for run_id in runs["run_id"]:
        configs = {row.point_key: row.config for row in store.points(run_id).itertuples() if row.status == "ok"}
        for sample in store.samples(run_id).itertuples():
            key = sample.point_key
            if key not in wanted or key not in configs or len(walls[key]) >= RECENT_PROCESSES:
                continue
            if not same_settings(wanted[key], configs[key]) or process_launch(sample.summary) != launch:
                continue
            wall = process_wall(sample.summary)
            if wall is not None:
                walls[key].append(wall)
    return walls


def screen_history(store: Store, machine_key: str, points: list[Point], plan: GatePlan) -> dict[str, list[tuple]]:
    """Per point key, the log ratios of its quiet pairs in each of the newest HISTORY_NIGHTS gate screens on this
    machine that measured it (the same settings), judged by `plan`'s screen as the gate judged them."""
    history: dict[str, list[tuple]] = {point.key: [] for point in points}
    wanted = {point.key: point.config for point in points}
    runs = store.runs()
    if runs.empty:
        return history
    ids = set(runs["run_id"])
    nights = 0
    for row in runs[runs["machine_key"] == machine_key].iloc[::-1].itertuples():
        entry = row.fingerprint.get(rules.GATE) or {}
        ref = (entry.get("runs") or {}).get("screen_ref")
        if (entry.get("stage"), entry.get("side")) != ("screen", "new") or ref not in ids:
            continue
        new_points = store.points(row.run_id)
        configs = dict(zip(new_points["point_key"], new_points["config"]))
        for screened in rules.screen(new_points, store.samples(row.run_id), store.points(ref), store.samples(ref),
                                     plan):
            key = screened.point_key
            if key in wanted and screened.ratios and same_settings(wanted[key], configs[key]):
                history[key].append(screened.ratios)
        nights += 1
        if nights >= HISTORY_NIGHTS:
            break
    return history


def same_settings(wanted: dict[str, Any], stored: dict[str, Any]) -> bool:
    """Every setting both configs have is equal: a field added to the trainer since does not hide the history."""
    return all(wanted[name] == stored[name] for name in wanted.keys() & stored.keys())


def process_launch(summary: RunSummary) -> str:
    """How a stored process started; those stored before the harness recorded it started fresh."""
    return (summary.interference or {}).get("launch", "fresh")


def process_wall(summary: RunSummary) -> float | None:
    """The harness's wall around the process; the trainer's own when the harness recorded none."""
    wall = (summary.interference or {}).get("wall_s") or summary.wall_seconds
    return float(wall) if wall is not None and math.isfinite(wall) and wall > 0 else None


def stored_stage_walls(store: Store, runs: dict[tuple[str, str], str]) -> dict[str, float]:
    """Each stage's processes' walls summed, from the gate's runs ((stage, side) -> run id)."""
    totals: dict[str, float] = {}
    for (stage, _side), run_id in runs.items():
        walls = [process_wall(summary) for summary in store.samples(run_id)["summary"]]
        totals[stage] = totals.get(stage, 0.0) + sum(wall for wall in walls if wall is not None)
    return totals


def duration(seconds: float) -> str:
    minutes, rest = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"
