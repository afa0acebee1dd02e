"""What a fitted night promises before it measures: the slowdown each point is flagged at 95% of the time, at its
pair spread on earlier nights, and how many suspects it confirms. A night that cannot keep the promise refuses,
naming the --night-s or the points to drop that would keep it (docs/gate.md#the-nights-promise)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import median

from benches import forecast
from decisions import screening as rules
from rlperf.errors import BadInput

# the promised detectable slowdown, in thresholds: what the screen weighs each point's pairs for
PROMISE_THRESHOLDS = 2.0


@dataclass(frozen=True)
class Promise:
    """A night's promise and what its fit keeps of it: each point's detectable slowdown at its allocated and at its
    fitted pairs (by point key; only points whose spread is known), and the suspects it confirms."""

    slowdown: float  # every point flagged 95% of the time when this much slower
    suspects: int  # promised suspects confirmed
    confirmed: int  # the suspects the fitted night confirms
    detects: dict[str, tuple[float, float]]  # point key -> (at its allocated pairs, at its fitted pairs)

    @property
    def broken(self) -> list[str]:
        """The points the fit took past the promise: a point whose own noise keeps it from the promise at its
        allocated pairs is held to those, since no night of the suite does better."""
        return [key for key, (before, after) in self.detects.items() if after > max(self.slowdown, before)]

    @property
    def kept(self) -> bool:
        return self.confirmed >= self.suspects and not self.broken


class Detecting:
    """`rules.detectable` at each point's spread on earlier nights (the median point's where it has none), each
    (pairs, spread) worked out once: the search for a night that keeps the promise asks again and again."""

    def __init__(self, plan: rules.GatePlan, history: dict[str, list[tuple]]):
        self.plan = plan
        known = {key: spread for key, nights in history.items() if math.isfinite(spread := rules.spread_within(nights))}
        typical = median(known.values()) if known else None
        self.spreads = {key: known.get(key, typical) for key in history} if typical is not None else {}
        self.found: dict[tuple[int, float], float] = {}

    def __call__(self, key: str, pairs: int) -> float:
        spread = round(self.spreads[key], 4)
        if (pairs, spread) not in self.found:
            self.found[(pairs, spread)] = rules.detectable(replace(self.plan, screen_pairs=pairs), spread)
        return self.found[(pairs, spread)]

    def promise(self, allocated: dict[str, int], fit: forecast.NightFit, slowdown: float) -> Promise:
        detects = {key: (self(key, allocated[key]), self(key, fit.pairs.get(key, allocated[key])))
                   for key in allocated if key in self.spreads}
        return Promise(slowdown, self.plan.max_suspects, fit.suspects, detects)


def promised_slowdown(plan: rules.GatePlan) -> float:
    return min(0.9, PROMISE_THRESHOLDS * plan.threshold)


def fit_promise(costs: dict[str, float], allocated: dict[str, int], detecting: Detecting, night_s: float,
                fixed: frozenset[str] = frozenset()) -> tuple[forecast.NightFit | None, Promise | None]:
    """The night fitted into `night_s` and its promise; (None, None) where not even the fewest pairs fit."""
    plan = detecting.plan
    try:
        fit = forecast.fit_night(costs, allocated, plan, night_s, plan.point_spreads, fixed,
                                 fewer_suspects=not fixed)
    except BadInput:
        return None, None
    return fit, detecting.promise(allocated, fit, promised_slowdown(plan))


def least_night_s(costs: dict[str, float], allocated: dict[str, int], detecting: Detecting, night_s: float,
                  fixed: frozenset[str] = frozenset()) -> int:
    """The least whole seconds of night that keep the promise: every pair and suspect fit at the most."""
    plan = detecting.plan
    whole = forecast.fit_night(costs, allocated, detecting.plan, math.inf, plan.point_spreads, fixed)
    low, high = int(night_s), math.ceil(whole.screen_s[0] + whole.refine_s + whole.reserve_s) + 1
    while high - low > 1:
        middle = (low + high) // 2
        _, promise = fit_promise(costs, allocated, detecting, float(middle), fixed)
        low, high = (low, middle) if promise is not None and promise.kept else (middle, high)
    return high


def points_to_drop(costs: dict[str, float], allocated: dict[str, int], detecting: Detecting,
                   night_s: float) -> list[str]:
    """The costliest points' screens dropped one at a time until the rest keep the promise in `night_s`; empty
    where only one point would be left."""
    left = dict(costs)
    dropped: list[str] = []
    while len(left) > 2:
        costliest = max(left, key=lambda key: allocated[key] * left[key])
        dropped.append(costliest)
        del left[costliest]
        _, promise = fit_promise(left, {key: allocated[key] for key in left}, detecting, night_s)
        if promise is not None and promise.kept:
            return dropped
    return []


def refusal(promise: Promise | None, costs: dict[str, float], allocated: dict[str, int], detecting: Detecting,
            night_s: float, labels: dict[str, str], fixed: frozenset[str] = frozenset()) -> str:
    """The one line a night that cannot keep its promise refuses with (`promise` None: not even the fewest pairs
    fit)."""
    least = least_night_s(costs, allocated, detecting, night_s, fixed)
    dropped = [] if fixed else points_to_drop(costs, allocated, detecting, night_s)
    slowdown, suspects = promised_slowdown(detecting.plan), detecting.plan.max_suspects
    if promise is None:
        why = "not even 2 pairs a point and one suspect fit"
    else:
        short = [f"{labels[key]} detects {promise.detects[key][1]:.1%}" for key in promise.broken]
        if promise.confirmed < suspects:
            short.insert(0, f"it confirms {promise.confirmed} suspect{'s' if promise.confirmed != 1 else ''}")
        why = "fitted, " + ", ".join(short)
    named = "; ".join(labels[key] for key in dropped)
    drop = f", or drop the costliest point{'s' if len(dropped) > 1 else ''} ({named})" if dropped else ""
    return (f"night-s: {forecast.duration(night_s)} cannot keep what the night promises (every point flagged 95% of "
            f"the time when {slowdown:.0%} slower, {suspects} suspect{'s' if suspects != 1 else ''} confirmed): "
            f"{why}; raise --night-s to at least {least}{drop}, or run the weaker night with --accept-weaker")


def weaker_line(promise: Promise, fit: forecast.NightFit, labels: dict[str, str]) -> str:
    """The last line of a night run weaker than its promise: what it did promise, per cut point."""
    cut = [f"{labels[key]} {promise.detects[key][1]:.1%} ({before} -> {after} pairs)"
           if key in promise.detects else f"{labels[key]} unknown ({before} -> {after} pairs)"
           for key, (before, after) in fit.cut.items()]
    suspects = (f"{promise.confirmed} suspect{'s' if promise.confirmed != 1 else ''} confirmed rather than "
                f"{promise.suspects}, every other suspect undecided"
                if promise.confirmed < promise.suspects else f"{promise.suspects} suspects confirmed")
    return (f"gate: a weaker night than promised (--accept-weaker): {suspects}; each cut point flagged 95% of the "
            f"time when slower by: " + ("; ".join(cut) if cut else "no point cut"))


def promise_line(promise: Promise) -> str:
    """The promise a night states before it measures, with what its points detect at their fitted pairs."""
    detects = [after for _, after in promise.detects.values()]
    spread = (f" (its points detect {min(detects):.1%} to {max(detects):.1%} at their pairs and earlier nights' "
              f"spread)" if detects else " (no earlier screen here tells what each point detects)")
    kept = "kept" if promise.kept else "not kept: the night runs weaker (--accept-weaker)"
    return (f"night: promises every point flagged 95% of the time when {promise.slowdown:.0%} slower{spread}, and "
            f"{promise.suspects} suspect{'s' if promise.suspects != 1 else ''} confirmed: {kept}")
