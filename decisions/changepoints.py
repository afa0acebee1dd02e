"""Change points in a history: the runs at which a point's SPS, or the time per agent step of one of its
phases, shifted to a new level and stayed there.

Runs are the unit (processes of one night share its offset): every split and stretch of a point's runs is scanned,
its significance from shuffling whole runs, Benjamini-Hochberg across series, and the reported shift corrected for
having been found. Why, and the libraries not taken: docs/decision-rules.md#change-points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pandas as pd
from scipy import stats

from reference_trainer.config import PHASES
from decisions import intervals
from decisions.rundata import RunData
from decisions.verdicts import MIN_PHASE_GROWTH_SHARE, match_key, phase_per_step, quiet
from rlperf.store import point_label

SPS = "SPS"
# 9,999 shuffles resolve p-values down to 1e-4: below the level Benjamini-Hochberg asks of the first of
# about a hundred series at alpha 0.01. The first 999 already show most series to be far from any level
# worth resolving (p above 0.1), and those stop there.
PERMUTATIONS = 9_999
FIRST_PERMUTATIONS = 999
CLEARLY_NOT = 0.1
SHUFFLE_BATCH = 1_000  # shuffles scored at once (a batch of long histories holds millions of scores)
# Fixed, so that the same store always gives the same report.
SEED = 20_240_601
SELECTION_DRAWS = 400  # histories drawn to correct a change point's shift for having been found
SHIFT_STEPS = 12  # bisection steps of that correction (to 1/4096 of twice the shift observed)
MIN_FOUND = 20  # drawn histories that must show a change before their mean is trusted
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
    key: str = ""  # the point's match key (decisions/verdicts.py): the same point in every run

    @property
    def levels(self) -> np.ndarray:
        """One value per run: the median of its repeats' logs."""
        return np.array([float(np.median(np.log(v))) for v in self.values])


@dataclass
class ChangePoint:
    """A shift that began at run `order` (an index into the history's runs)."""

    point: str
    metric: str
    order: int
    run_id: str
    commit: str
    p_value: float  # the permutation p of the whole series' scan, every candidate split allowed for
    shift: intervals.Shift  # after against before, runs between the neighbouring change points, corrected
    naive: float  # the shift before the correction for picking the split
    before: float  # medians of those runs' values
    after: float
    runs_before: int
    runs_after: int
    before_band: tuple[float, float]  # quartiles of those runs' repeats, for the plots
    after_band: tuple[float, float]
    span: tuple[int, int]  # the first run before and the last run after
    phases_moved: list[tuple[str, intervals.Shift]] = field(default_factory=list)
    confirmation: str = ""  # how re-measuring the commits either side in pairs ended, when it was done
    key: str = ""  # the point's match key

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
            _append(metrics, key, label, SPS, order, samples["sps"].to_numpy(float))
            for phase in PHASES:
                per_step = phase_per_step(samples, phase)
                _append(metrics, key, label, phase, order, per_step[per_step > 0])
    return found


def _append(metrics: dict[str, Series], key: str, label: str, metric: str, order: int, values: np.ndarray) -> None:
    if len(values):
        series = metrics.setdefault(metric, Series(label, metric, [], [], key))
        series.orders.append(order)
        series.values.append(values)


@lru_cache(maxsize=64)
def intervals_of(runs: int) -> tuple[np.ndarray, np.ndarray]:
    """Every stretch [a, b) of `runs` runs but the whole: the runs inside set against those outside."""
    a, b = np.triu_indices(runs + 1, k=1)
    keep = (b - a) < runs
    return a[keep], b[keep]


def interval_scores(levels: np.ndarray) -> np.ndarray:
    """|z| of the Mann-Whitney statistic of the runs inside each stretch against those outside it (the
    stretches of intervals_of), a row of scores per row of levels. A stretch touching either end is a single
    split; one in the middle is a level that came and went."""
    ranks = stats.rankdata(levels, axis=-1)
    runs = levels.shape[-1]
    a, b = intervals_of(runs)
    inside = b - a
    prefix = np.concatenate([np.zeros(ranks.shape[:-1] + (1,)), np.cumsum(ranks, axis=-1)], axis=-1)
    sums = prefix[..., b] - prefix[..., a]
    expected = inside * (runs + 1) / 2
    deviation = np.sqrt(inside * (runs - inside) * (runs + 1) / 12)
    return np.abs((sums - expected) / deviation)


@dataclass(frozen=True)
class Scan:
    stretch: tuple[int, int]  # the runs [a, b) that differ most from the rest
    statistic: float  # its |z|
    p_value: float
    null: np.ndarray  # the best |z| of each shuffle of the runs, sorted


def scan(levels: np.ndarray, rng: np.random.Generator) -> Scan:
    """The stretch of these runs' levels that differs most from the others, and its permutation p: the same
    scan on the runs shuffled, many times (a tolerance lets shuffles that tie the observed statistic count as
    at least as extreme)."""
    if len(levels) < 3:
        return Scan((0, 1), 0.0, 1.0, np.zeros(1))
    scores = interval_scores(levels[None, :])[0]
    observed = float(scores.max())
    nulls = []
    exceed = done = 0
    for batch in (FIRST_PERMUTATIONS,) + (SHUFFLE_BATCH,) * ((PERMUTATIONS - FIRST_PERMUTATIONS) // SHUFFLE_BATCH):
        shuffled = rng.permuted(np.broadcast_to(levels, (batch, len(levels))), axis=1)
        best = interval_scores(shuffled).max(axis=1)
        nulls.append(best)
        exceed += int((best >= observed - 1e-9).sum())
        done += batch
        if (1 + exceed) / (1 + done) > CLEARLY_NOT:
            break
    a, b = intervals_of(len(levels))
    best = int(np.argmax(scores))
    return Scan((int(a[best]), int(b[best])), observed, (1 + exceed) / (1 + done), np.sort(np.concatenate(nulls)))


def critical_value(null: np.ndarray, level: float) -> float:
    """The |z| that the scan's shuffles exceed with chance `level` at most."""
    index = int(np.ceil((1 - level) * (len(null) + 1))) - 1
    return float(null[min(index, len(null) - 1)]) if index >= 0 else 0.0


def find(runs: list[RunData], threshold: float, alpha: float) -> list[ChangePoint]:
    """The change points of every point and metric in these runs (one suite on one machine, in order):
    SPS change points with the phases that moved at them, then phase change points that no SPS change point
    names."""
    every = point_series(runs)
    flat = [(metrics, series) for metrics in every.values() for series in metrics.values()]
    if not flat:
        return []
    rng = np.random.default_rng(SEED)
    first = [scan(series.levels, rng) for _, series in flat]
    p_values = np.array([found.p_value for found in first])
    adjusted = stats.false_discovery_control(p_values, method="bh") if len(p_values) > 1 else p_values
    accepted = adjusted <= alpha
    if not accepted.any():
        return []
    # The largest p that Benjamini-Hochberg accepted: every split of a changed series is held to it.
    level = float(p_values[accepted].max())
    found = []
    for (metrics, series), whole, changed in zip(flat, first, accepted):
        if changed:
            critical = critical_value(whole.null, level)
            splits = segment(series.levels, 0, len(series.orders), critical, threshold)
            found += describe(series, splits, whole.p_value, critical, metrics, runs, threshold, alpha, rng)
    named = {(c.point, c.order, phase) for c in found if c.metric == SPS for phase, _ in c.phases_moved}
    return [c for c in found if c.metric == SPS or (c.point, c.order, c.metric) not in named]


def segment(levels: np.ndarray, start: int, stop: int, critical: float, threshold: float) -> list[int]:
    """Circular binary segmentation of levels[start:stop]: the stretch that differs most from the rest, when
    its |z| clears `critical` and its shift lies beyond the threshold, gives a change point at each of its ends
    inside the stretch searched, and each piece is searched again; the first run after each change, in order."""
    if stop - start < 3:
        return []
    scores = interval_scores(levels[None, start:stop])[0]
    best = int(np.argmax(scores))
    a, b = place_ends(levels, start, stop, *(int(end[best]) + start for end in intervals_of(stop - start)))
    inside = levels[a:b]
    outside = np.concatenate([levels[start:a], levels[b:stop]])
    if scores[best] < critical - 1e-9 or not beyond(math.expm1(hodges_lehmann(outside, inside)), threshold):
        return []
    ends = [end for end in (a, b) if start < end < stop]
    pieces = [start] + ends + [stop]
    found = []
    for left, right in zip(pieces, pieces[1:]):
        found += segment(levels, left, right, critical, threshold)
    return sorted(found + ends)


def place_ends(levels: np.ndarray, start: int, stop: int, a: int, b: int) -> tuple[int, int]:
    """The stretch's ends moved by a run either way where that leaves the runs inside and outside closer to
    their own side's median (absolute deviations): ranks choose the stretch well, but standardizing by its size
    can pull in a neighbour whose level is the other side's."""
    def spread(a: int, b: int) -> float:
        inside, outside = levels[a:b], np.concatenate([levels[start:a], levels[b:stop]])
        return float(np.abs(inside - np.median(inside)).sum() + np.abs(outside - np.median(outside)).sum())

    candidates = [(a + da, b + db) for da in (-1, 0, 1) for db in (-1, 0, 1)
                  if start <= a + da < b + db <= stop and b + db - (a + da) < stop - start]
    return min(candidates, key=lambda ends: (spread(*ends), ends != (a, b)))


def hodges_lehmann(before: np.ndarray, after: np.ndarray) -> float:
    """The estimate alone, on the log scale, of levels already on the log scale."""
    return float(np.median(np.subtract.outer(after, before)))


def corrected_shift(levels: np.ndarray, split: int, critical: float, threshold: float,
                    rng: np.random.Generator) -> float:
    """The shift (log scale) at this split of the stretch, corrected for having been found there: a change
    point is reported at a split only where the noise let that split score best, clear `critical` and clear
    the threshold, so the shifts reported are larger than the shifts behind them (the winner's curse: a true
    -10% read -13%). The shift returned is the one whose histories, drawn with the runs' residuals resampled
    (the same draws for every shift tried) and scanned as this one was, have the observed shift as the
    mean of those reported at this split."""
    before, after = levels[:split], levels[split:]
    observed = hodges_lehmann(before, after)
    # residuals about each side's mean are smaller than the noise by the two means fitted: scaled back
    inflate = math.sqrt(len(levels) / (len(levels) - 2))
    residuals = np.concatenate([before - before.mean(), after - after.mean()]) * inflate
    noise = rng.choice(residuals, (SELECTION_DRAWS, len(levels)))
    step = np.r_[np.zeros(split), np.ones(len(levels) - split)]
    down, up = intervals.band(threshold)
    starts, stops = intervals_of(len(levels))
    at_split = ((starts == split) & (stops == len(levels))) | ((starts == 0) & (stops == split))

    def mean_found(shift: float) -> float | None:
        drawn = noise + shift * step
        scores = interval_scores(drawn)
        best = np.argmax(scores, axis=1)
        differences = drawn[:, split:, None] - drawn[:, None, :split]
        shifts = np.median(differences.reshape(len(drawn), -1), axis=1)
        found = (at_split[best] & (scores.max(axis=1) >= critical - 1e-9)
                 & ((shifts < down) | (shifts > up)))
        return float(np.mean(shifts[found])) if found.sum() >= MIN_FOUND else None

    # The mean reported grows with the shift drawn: bisect between no change and twice the shift observed.
    # A shift so small that too few draws report it lies on the side of no change; where even twice the shift
    # is too rarely reported at this split (another split of the draws scores best), nothing is corrected.
    toward_zero, away = 0.0, 2 * observed
    if mean_found(away) is None:
        return observed
    for _ in range(SHIFT_STEPS):
        middle = (toward_zero + away) / 2
        found = mean_found(middle)
        if found is None or abs(found) < abs(observed):
            toward_zero = middle
        else:
            away = middle
    return (toward_zero + away) / 2


def beyond(relative: float, threshold: float) -> bool:
    """Whether a change lies outside the threshold band (symmetric on the log scale, like verdicts')."""
    down, up = intervals.band(threshold)
    return not down < math.log1p(relative) < up


def describe(series: Series, splits: list[int], p_value: float, critical: float, metrics: dict[str, Series],
             runs: list[RunData], threshold: float, alpha: float, rng: np.random.Generator) -> list[ChangePoint]:
    """Each split measured between its neighbours: the runs from the previous change point to it against
    those from it to the next, the shift corrected for picking the split. A phase's change point must also
    move a visible part of the step."""
    bounds = [0] + splits + [len(series.orders)]
    levels = series.levels
    out = []
    for index, split in enumerate(splits):
        start, stop = bounds[index], bounds[index + 2]
        before, after = levels[start:split], levels[split:stop]
        naive = intervals.shift(np.exp(before), np.exp(after), alpha)
        bias = math.log1p(naive.estimate) - corrected_shift(levels[start:stop], split - start, critical,
                                                            threshold, rng)
        shift = intervals.Shift(math.expm1(math.log1p(naive.estimate) - bias),
                                math.expm1(math.log1p(naive.low) - bias) if naive.low > -1 else -1.0,
                                math.expm1(math.log1p(naive.high) - bias), naive.confidence, naive.p_value,
                                naive.n_baseline, naive.n_candidate)
        before_orders, after_orders = set(series.orders[start:split]), set(series.orders[split:stop])
        before_values = np.concatenate(series.values[start:split])
        after_values = np.concatenate(series.values[split:stop])
        step_seconds = 1 / float(np.median(_within(metrics[SPS], before_orders)))
        run = runs[series.orders[split]]
        change = ChangePoint(series.point, series.metric, series.orders[split], run.run_id, run.commit, p_value,
                             shift, naive.estimate, float(np.median(before_values)),
                             float(np.median(after_values)), split - start, stop - split,
                             _quartiles(before_values), _quartiles(after_values),
                             (series.orders[start], series.orders[stop - 1]), key=series.key)
        if series.metric == SPS:
            change.phases_moved = phases_moved(metrics, before_orders, after_orders, step_seconds, threshold, alpha)
        elif abs(change.after - change.before) < MIN_PHASE_GROWTH_SHARE * step_seconds:
            continue
        out.append(change)
    return out


def phases_moved(metrics: dict[str, Series], before_orders: set[int], after_orders: set[int], step_seconds: float,
                 threshold: float, alpha: float) -> list[tuple[str, intervals.Shift]]:
    """Phases whose time per step changed between these runs, from their repeats: the interval excludes no
    change, the estimate lies beyond the threshold, and the change is a visible part of the step; the largest
    in seconds first."""
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


def level_shift(before: np.ndarray, after: np.ndarray, alpha: float) -> intervals.Shift:
    """The Hodges-Lehmann shift of `after` against `before` with its Mann-Whitney interval: exact
    (decisions/intervals.py) up to EXACT_PAIRS pairs, else from the normal approximation, whose interval runs
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


def _quartiles(values: np.ndarray) -> tuple[float, float]:
    low, high = np.quantile(values, [0.25, 0.75])
    return float(low), float(high)


def _within(series: Series, orders: set[int]) -> np.ndarray:
    kept = [values for order, values in zip(series.orders, series.values) if order in orders]
    return np.concatenate(kept) if kept else np.array([])


# ---- confirmations: a change point's commits measured again, in pairs, in one job ----------------------------------

CONFIRMS = "confirms"


def confirms_entry(change: ChangePoint, point_key: str) -> dict:
    """The fingerprint entry of a run that re-measures a change point's commits (benches/confirm.py)."""
    return {CONFIRMS: {"run": change.run_id, "point": change.key, "point_key": point_key, "metric": change.metric}}


def confirmation_text(change: ChangePoint, verdict) -> str:
    """How a confirmation ended, as the history shows it: confirmed when the pairs claim the change point's
    direction, else what they showed."""
    expected = "regressed" if change.worse else "improved"
    if verdict.status == expected:
        return f"confirmed: {verdict.sps.relative:+.1%} in {verdict.sps.n_candidate} pairs"
    if verdict.status in ("failed", "inconclusive"):
        return f"undecided: {verdict.status}"
    return f"not confirmed: {verdict.status}" + (f" ({verdict.sps.relative:+.1%})" if verdict.sps else "")
