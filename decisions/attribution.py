"""`rlperf selfcheck`'s verdicts: does a delay injected into a phase land in that phase, within a band, by an
interval rather than a point? docs/decision-rules.md ("Selfcheck's band") says why the rule is this one.

A run injects its delays in every other epoch, so each delayed epoch is compared with its undelayed neighbour in
the same process: the process's own speed cancels, and what is left is the share of the delay the phase took,
plus epoch-to-epoch noise. The shares of all pairs give a Hodges-Lehmann estimate and its Wilcoxon signed-rank
interval (distribution-free; a difference of two exchangeable epochs is symmetric). A share is `ok` when the interval
lies inside the band, `FAIL` when it lies wholly outside (under- and over-attribution alike), and otherwise more
runs are added until one of the two holds or the budget ends: `undecided`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

BAND = (0.95, 1.05)
CONFIDENCE = 0.95
DELAY_EVERY = 2  # delays in every other epoch: each delayed epoch has an undelayed neighbour
ALL_AT_ONCE = "(all phases delayed)"
BASELINE = "baseline"
# an automatic delay: this many times the largest spread of a checked phase's adjacent-epoch differences, so the
# band's 5% holds a few such spreads; within these bounds (milliseconds)
AUTO_DELAY_SPREADS = 40.0
AUTO_DELAY_BOUNDS_MS = (40.0, 3000.0)


def paired_shares(epochs: list[dict], phase: str, delay_s: float) -> list[float]:
    """Per pair of adjacent steady epochs of which one delayed `phase` and the other did not: the delayed epoch's
    seconds in the phase less the other's, over the delay."""
    steady = [epoch for epoch in epochs if not epoch.get("warmup")]
    shares, index = [], 0
    while index + 1 < len(steady):
        first, second = steady[index], steady[index + 1]
        first_delayed, second_delayed = phase in first.get("delayed", ()), phase in second.get("delayed", ())
        if first_delayed == second_delayed:
            index += 1
            continue
        delayed, plain = (first, second) if first_delayed else (second, first)
        shares.append((delayed["phases"].get(phase, 0.0) - plain["phases"].get(phase, 0.0)) / delay_s)
        index += 2
    return shares


def signed_rank_null(n: int) -> list[float]:
    """P(T = t) for Wilcoxon's signed-rank statistic T of n values under the null, t = 0 .. n(n+1)/2."""
    counts = [1]
    for rank in range(1, n + 1):
        grown = counts + [0] * rank
        for total, ways in enumerate(counts):
            grown[total + rank] += ways
        counts = grown
    return [ways / 2 ** n for ways in counts]


def walsh_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float | None, float | None,
                                                                                  float | None]:
    """The Hodges-Lehmann estimate of the values' centre and its signed-rank interval at `confidence`; the
    interval is None where there are too few values for one (fewer than 6 at 95%)."""
    if not values:
        return None, None, None
    walsh = sorted((values[i] + values[j]) / 2 for i in range(len(values)) for j in range(i, len(values)))
    estimate = statistics.median(walsh)
    tail, cumulative, cut = (1 - confidence) / 2, 0.0, -1
    for probability in signed_rank_null(len(values)):
        cumulative += probability
        if cumulative > tail:
            break
        cut += 1
    if cut < 0:
        return estimate, None, None
    return estimate, walsh[cut], walsh[len(walsh) - 1 - cut]


@dataclass
class RowVerdict:
    """One row of the check: a phase's share of its delay, alone or with every phase delayed."""

    row: str
    phase: str
    shares: list[float] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)  # the names of the runs that gave its pairs
    estimate: float | None = None
    low: float | None = None
    high: float | None = None
    verdict: str = "undecided"

    def judge(self, band: tuple[float, float] = BAND, confidence: float = CONFIDENCE) -> str:
        self.estimate, self.low, self.high = walsh_interval(self.shares, confidence)
        if self.low is None:
            self.verdict = "undecided"
        elif band[0] <= self.low and self.high <= band[1]:
            self.verdict = "ok"
        elif self.high < band[0] or self.low > band[1]:
            self.verdict = "FAIL"
        else:
            self.verdict = "undecided"
        return self.verdict


def delayed_run(row: str) -> str:
    """The name of the runs whose delays a row measures: the phase's own, or the one delaying every phase."""
    return ALL_AT_ONCE if row.endswith(ALL_AT_ONCE) else row


def automatic_delay_ms(epochs: list[dict], phases: tuple[str, ...]) -> float:
    """A delay large against how far the checked phases move from one steady epoch to the next in a run without
    delays (a robust spread of adjacent differences), within AUTO_DELAY_BOUNDS_MS, rounded up to 10 ms."""
    steady = [epoch for epoch in epochs if not epoch.get("warmup")]
    spreads = [0.0]
    for phase in phases:
        differences = [abs(b["phases"].get(phase, 0.0) - a["phases"].get(phase, 0.0)) for a, b in zip(steady, steady[1:])]
        if differences:
            spreads.append(1.4826 * statistics.median(differences))
    wanted = AUTO_DELAY_SPREADS * max(spreads) * 1000.0
    low, high = AUTO_DELAY_BOUNDS_MS
    return min(high, max(low, math.ceil(wanted / 10.0) * 10.0))


def check(phases: tuple[str, ...], delay_ms: float, run: Callable[[str, dict[str, float]], list[dict]],
          max_runs: int, band: tuple[float, float] = BAND) -> dict[str, RowVerdict]:
    """Each phase's share of its delay alone and with every phase delayed at once; `run(name, delays)` runs one
    process (or training) with `delays` in every other epoch and returns its epochs. Runs are added, a round at a
    time, to the rows still undecided, until every row is decided or each has had `max_runs`."""
    rows = {phase: RowVerdict(phase, phase) for phase in phases}
    rows.update({f"{phase} {ALL_AT_ONCE}": RowVerdict(f"{phase} {ALL_AT_ONCE}", phase) for phase in phases})
    delay_s = delay_ms / 1000.0
    for round_index in range(max_runs):
        pending = sorted({delayed_run(row.row) for row in rows.values() if row.verdict == "undecided"},
                         key=lambda name: (name == ALL_AT_ONCE, phases.index(name) if name in phases else 0))
        if not pending:
            break
        for name in pending:
            delays = dict.fromkeys(phases if name == ALL_AT_ONCE else (name,), delay_ms)
            label = f"{name} #{round_index + 1}"
            epochs = run(label, delays)
            for row in rows.values():
                if delayed_run(row.row) == name and row.verdict == "undecided":
                    row.shares += paired_shares(epochs, row.phase, delay_s)
                    row.runs.append(label)
                    row.judge(band)
    return rows
