"""Change points in a history: the runs at which a point's SPS, or the time per agent step of one of its
phases, shifted to a new level and stayed there.

Why written here rather than taken from a library: the three made for the job do not fit this data.
- signal-processing-algorithms (MongoDB's E-divisive) needs numpy < 2 and Python < 3.12 and takes one value
  per run; on 5 runs it found a 50% slowdown in fewer than one series in ten.
- apache-otava (E-divisive with a t-test) pins numpy 2.2 and scipy < 1.17 and brings database, cloud and chat
  clients; its t-test p-value is that of the best split, with no allowance for having picked it among all the
  splits, and on pure noise of our size (12% per process, 3 repeats a run) it reported a change point in
  28-41% of series of 5-30 runs.
- ruptures searches for a segmentation under a penalty and gives no significance at all; with a BIC-like
  penalty it put a change point in 25-32% of the same noise series.
All three also reduce a run to one number, while each of our runs holds several processes per point.

The method. A point's series is its runs in start order, each run holding one value per quiet repeat
(contended repeats are left out, as in verdicts). Within a stretch of runs, every split into runs before and
runs after is scored by the Mann-Whitney rank-sum statistic of the repeats after against those before,
standardized; the split with the largest |z| is the candidate. Its significance is a permutation test of that
largest |z|: the repeats of the stretch are shuffled among its runs many times and the scan repeated, so the
p-value allows for every split that could have been picked (no Bonferroni guess). Every series of a suite
(each point's SPS and each phase) is tested once over all its runs; Benjamini-Hochberg over those p-values
decides which series changed at all, and a series that did is split again on each side (binary
segmentation) at the level the procedure accepted. As with verdicts, a change point must also be large: the
Hodges-Lehmann shift between the levels either side must lie beyond the threshold.

The unit is the process, as in verdicts: with no change, every repeat of a stretch is taken to be drawn
alike, whatever run it came from. A whole run that was slower for a reason of its own (a busy night whose
contention the monitor missed) can therefore read as a shift if it is the newest run, or as two shifts around
it; the threshold keeps small drifts out.

Each change point carries its shift with the exact Mann-Whitney interval (reports/intervals.py) of the
repeats between the neighbouring change points, and the phases whose time per step moved at the same run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from reference_trainer.config import PHASES
from reports import intervals
from reports.rundata import RunData
from reports.verdicts import MIN_PHASE_GROWTH_SHARE, match_key, phase_per_step, quiet
from rlperf.store import point_label

SPS = "SPS"
# 9,999 shuffles resolve p-values down to 1e-4: below the level Benjamini-Hochberg asks of the first of
# about a hundred series at alpha 0.01. The first 999 already show most series to be far from any level
# worth resolving (p above 0.1), and those stop there.
PERMUTATIONS = 9_999
FIRST_PERMUTATIONS = 999
CLEARLY_NOT = 0.1
# Fixed, so that the same store always gives the same report.
SEED = 20_240_601
# The exact interval asks one test per gap between pairwise differences: past this many pairs (a stretch of
# many runs or many repeats) it takes seconds, and the normal approximation to Mann-Whitney's distribution,
# which is then as good as exact, takes over.
EXACT_PAIRS = 2_500


@dataclass
class Series:
    """One metric of one point over the runs that measured it. `orders` index the history's runs; `values`
    holds each of those runs' per-repeat values (SPS, or seconds per agent step), all positive."""

    point: str
    metric: str
    orders: list[int]
    values: list[np.ndarray]


@dataclass
class ChangePoint:
    """A shift that began at run `order` (an index into the history's runs)."""

    point: str
    metric: str
    order: int
    run_id: str
    commit: str
    p_value: float  # the permutation p of the scan that found it, every candidate split allowed for
    shift: intervals.Shift  # after against before, the repeats between the neighbouring change points
    before: float  # medians of those repeats
    after: float
    runs_before: int
    runs_after: int
    before_band: tuple[float, float]  # quartiles of those repeats, for the plots
    after_band: tuple[float, float]
    span: tuple[int, int]  # the first run before and the last run after
    phases_moved: list[tuple[str, intervals.Shift]] = field(default_factory=list)

    @property
    def worse(self) -> bool:
        return self.shift.estimate < 0 if self.metric == SPS else self.shift.estimate > 0

    def sentence(self) -> str:
        """`learn got 12% slower at abc1234`, or for SPS `SPS fell 30% at abc1234 (learn +45%)`."""
        size = f"{abs(self.shift.estimate):.0%}"
        where = f"at {self.commit[:7]}"
        if self.metric == SPS:
            moved = ", ".join(f"{phase} {change.estimate:+.0%}" for phase, change in self.phases_moved)
            verb = "fell" if self.shift.estimate < 0 else "rose"
            return f"SPS {verb} {size} {where}" + (f" ({moved})" if moved else "")
        return f"{self.metric} got {size} {'slower' if self.worse else 'faster'} {where}"


def point_series(runs: list[RunData]) -> dict[str, dict[str, Series]]:
    """Every point's series, SPS first and then each phase, keyed by the point's match key: points are the
    same across runs when their configuration is, less the fields that only observe or perturb them."""
    found: dict[str, dict[str, Series]] = {}
    for order, run in enumerate(runs):
        for point in run.points.itertuples():
            if point.status != "ok":
                continue
            samples = quiet(run.samples[run.samples["point_key"] == point.point_key])
            samples = samples[pd.to_numeric(samples["sps"], errors="coerce") > 0]
            if samples.empty:
                continue
            key = match_key(point.point_key, point.config)
            label = point_label(point.point_key)
            metrics = found.setdefault(key, {})
            _append(metrics, label, SPS, order, samples["sps"].to_numpy(float))
            for phase in PHASES:
                per_step = phase_per_step(samples, phase)
                _append(metrics, label, phase, order, per_step[per_step > 0])
    return found


def _append(metrics: dict[str, Series], label: str, metric: str, order: int, values: np.ndarray) -> None:
    if len(values):
        series = metrics.setdefault(metric, Series(label, metric, [], []))
        series.orders.append(order)
        series.values.append(values)


def scan(values: list[np.ndarray], rng: np.random.Generator) -> tuple[int, float]:
    """The best split of these runs (the index of the first run after it) and its permutation p-value.

    The rank-sum of the repeats after each split, standardized, is compared with what the same scan gives
    when the repeats are shuffled among the runs."""
    counts = np.array([len(v) for v in values])
    total = int(counts.sum())
    if len(values) < 2 or total < 3:
        return 1, 1.0
    ranks = stats.rankdata(np.concatenate(values))
    after = total - np.cumsum(counts)[:-1]  # repeats after each split
    before = total - after
    expected = after * (total + 1) / 2
    deviation = np.sqrt(after * before * (total + 1) / 12)

    def best(rank_rows: np.ndarray) -> np.ndarray:
        before_sums = np.cumsum(rank_rows, axis=-1)[..., np.cumsum(counts)[:-1] - 1]
        after_sums = rank_rows.sum(axis=-1, keepdims=True) - before_sums
        return np.abs((after_sums - expected) / deviation)

    observed = best(ranks)
    exceed, done = 0, 0
    for batch in (FIRST_PERMUTATIONS, PERMUTATIONS - FIRST_PERMUTATIONS):
        shuffled = rng.permuted(np.broadcast_to(ranks, (batch, total)), axis=1)
        # A tolerance, so that shuffles tying the observed statistic count as at least as extreme.
        exceed += int((best(shuffled).max(axis=1) >= observed.max() - 1e-9).sum())
        done += batch
        if (1 + exceed) / (1 + done) > CLEARLY_NOT:
            break
    return int(np.argmax(observed)) + 1, (1 + exceed) / (1 + done)


def find(runs: list[RunData], threshold: float, alpha: float) -> list[ChangePoint]:
    """The change points of every point and metric in these runs (one suite on one machine, in order):
    SPS change points with the phases that moved at them, then phase change points that no SPS change point
    names."""
    every = point_series(runs)
    flat = [(metrics, series) for metrics in every.values() for series in metrics.values()]
    if not flat:
        return []
    rng = np.random.default_rng(SEED)
    first = [scan(series.values, rng) for _, series in flat]
    p_values = np.array([p for _, p in first])
    adjusted = stats.false_discovery_control(p_values, method="bh") if len(p_values) > 1 else p_values
    accepted = adjusted <= alpha
    if not accepted.any():
        return []
    # The largest p that Benjamini-Hochberg accepted: further splits of a changed series are held to it.
    level = float(p_values[accepted].max())
    found = []
    for (metrics, series), best, changed in zip(flat, first, accepted):
        if changed:
            splits = segment(series, 0, len(series.orders), best, level, threshold, alpha, rng)
            found += describe(series, splits, metrics, runs, threshold, alpha)
    named = {(c.point, c.order, phase) for c in found if c.metric == SPS for phase, _ in c.phases_moved}
    return [c for c in found if c.metric == SPS or (c.point, c.order, c.metric) not in named]


def segment(series: Series, start: int, stop: int, best: tuple[int, float], level: float, threshold: float,
            alpha: float, rng: np.random.Generator) -> list[tuple[int, float]]:
    """Binary segmentation of series[start:stop]: (first run after, p) of each split that is significant at
    `level` and large beyond the threshold, in order."""
    split, p_value = best
    split += start
    if p_value > level:
        return []
    if not beyond(hodges_lehmann(np.concatenate(series.values[start:split]),
                                 np.concatenate(series.values[split:stop])), threshold):
        return []
    left = segment(series, start, split, scan(series.values[start:split], rng), level, threshold, alpha, rng) \
        if split - start > 1 else []
    right = segment(series, split, stop, scan(series.values[split:stop], rng), level, threshold, alpha, rng) \
        if stop - split > 1 else []
    return left + [(split, p_value)] + right


def hodges_lehmann(before: np.ndarray, after: np.ndarray) -> float:
    """The estimate alone, as a relative change: the median of every pairwise difference of the logs."""
    return math.expm1(float(np.median(np.subtract.outer(np.log(after), np.log(before)))))


def level_shift(before: np.ndarray, after: np.ndarray, alpha: float) -> intervals.Shift:
    """The Hodges-Lehmann shift of `after` against `before` with its Mann-Whitney interval: exact
    (reports/intervals.py) up to EXACT_PAIRS pairs, else from the normal approximation, whose interval runs
    between the pairwise differences that many places in from either end."""
    if len(before) * len(after) <= EXACT_PAIRS:
        return intervals.shift(before, after, alpha)
    base, cand = np.log(before), np.log(after)
    differences = np.sort(np.subtract.outer(cand, base).ravel())
    pairs, n, m = len(differences), len(base), len(cand)
    cut = math.floor(pairs / 2 - stats.norm.ppf(1 - alpha / 2) * math.sqrt(pairs * (n + m + 1) / 12))
    low, high = (differences[cut - 1], differences[pairs - cut]) if cut >= 1 else (-math.inf, math.inf)
    p_value = float(stats.mannwhitneyu(cand, base, alternative="two-sided", method="asymptotic").pvalue)
    return intervals.Shift(math.expm1(float(np.median(differences))), math.expm1(low), math.expm1(high),
                           1 - alpha, p_value, n, m)


def beyond(relative: float, threshold: float) -> bool:
    """Whether a change lies outside the threshold band (symmetric on the log scale, like verdicts')."""
    down, up = intervals.band(threshold)
    return not down < math.log1p(relative) < up


def describe(series: Series, splits: list[tuple[int, float]], metrics: dict[str, Series], runs: list[RunData],
             threshold: float, alpha: float) -> list[ChangePoint]:
    """Each split measured between its neighbours: the repeats from the previous change point to it against
    those from it to the next. A phase's change point must also move a visible part of the step."""
    bounds = [0] + [split for split, _ in splits] + [len(series.orders)]
    out = []
    for index, (split, p_value) in enumerate(splits):
        before_orders = set(series.orders[bounds[index]:split])
        after_orders = set(series.orders[split:bounds[index + 2]])
        before = np.concatenate(series.values[bounds[index]:split])
        after = np.concatenate(series.values[split:bounds[index + 2]])
        step_seconds = 1 / float(np.median(_within(metrics[SPS], before_orders)))
        run = runs[series.orders[split]]
        change = ChangePoint(series.point, series.metric, series.orders[split], run.run_id, run.commit, p_value,
                             level_shift(before, after, alpha), float(np.median(before)),
                             float(np.median(after)), split - bounds[index], bounds[index + 2] - split,
                             _quartiles(before), _quartiles(after),
                             (series.orders[bounds[index]], series.orders[bounds[index + 2] - 1]))
        if series.metric == SPS:
            change.phases_moved = phases_moved(metrics, before_orders, after_orders, step_seconds, threshold, alpha)
        elif abs(change.after - change.before) < MIN_PHASE_GROWTH_SHARE * step_seconds:
            continue
        out.append(change)
    return out


def phases_moved(metrics: dict[str, Series], before_orders: set[int], after_orders: set[int], step_seconds: float,
                 threshold: float, alpha: float) -> list[tuple[str, intervals.Shift]]:
    """Phases whose time per step changed between these runs: the interval excludes no change, the estimate
    lies beyond the threshold, and the change is a visible part of the step; the largest in seconds first."""
    moved = []
    for phase in PHASES:
        if phase not in metrics:
            continue
        before, after = _within(metrics[phase], before_orders), _within(metrics[phase], after_orders)
        if len(before) < 2 or len(after) < 2:
            continue
        change = level_shift(before, after, alpha)
        seconds = abs(float(np.median(after)) - float(np.median(before)))
        if (change.low > 0 or change.high < 0) and beyond(change.estimate, threshold) and \
                seconds >= MIN_PHASE_GROWTH_SHARE * step_seconds:
            moved.append((phase, change, seconds))
    moved.sort(key=lambda item: -item[2])
    return [(phase, change) for phase, change, _ in moved]


def _quartiles(values: np.ndarray) -> tuple[float, float]:
    low, high = np.quantile(values, [0.25, 0.75])
    return float(low), float(high)


def _within(series: Series, orders: set[int]) -> np.ndarray:
    kept = [values for order, values in zip(series.orders, series.values) if order in orders]
    return np.concatenate(kept) if kept else np.array([])
