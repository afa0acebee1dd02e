"""How large a change is, how sure we can be of it, and how large a change a point can see at all.

The unit is the process, its values compared as logs: the Hodges-Lehmann shift, the exact Mann-Whitney interval
(distribution-free, so one outlier moves it no more than any other), and the smallest slowdown that rule claims 95%
of the time, simulated (docs/decision-rules.md#runs-of-different-nights). decisions/verdicts.py judges the shift.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import stats

# Asymptotic relative efficiency of the Mann-Whitney test against the t-test under normal noise (3/pi): the
# rank interval is about sqrt(pi/3) times as wide as a t interval on the same data.
RANK_VARIANCE_INFLATION = math.pi / 3
DETECTION_POWER = 0.95
DETECTION_DRAWS = 2000
EXACT_UP_TO = 40  # repeats in all, up to which the exact Mann-Whitney law is simulated
DECIDING_POWER = 0.8


@dataclass(frozen=True)
class Shift:
    """Candidate against baseline, as relative changes (candidate / baseline - 1)."""

    estimate: float
    low: float  # -1 when no finite bound is reachable with these repeats: a slowdown of any size fits
    high: float  # inf, likewise
    confidence: float
    p_value: float  # two-sided p of no change: below alpha exactly when the interval excludes no change
    n_baseline: int
    n_candidate: int


def band(threshold: float) -> tuple[float, float]:
    """The threshold band on the log scale."""
    return math.log1p(-threshold) if threshold < 1 else -math.inf, math.log1p(threshold)


def shift(baseline: np.ndarray, candidate: np.ndarray, alpha: float) -> Shift:
    """Estimate and interval of the change from `baseline` to `candidate` (positive values, one per process)."""
    base, cand = np.log(np.asarray(baseline, float)), np.log(np.asarray(candidate, float))
    differences = np.sort(np.subtract.outer(cand, base).ravel())
    method = test_method(base, cand)
    low, high = rank_interval(base, cand, differences, alpha, method)
    p_value = float(stats.mannwhitneyu(cand, base, alternative="two-sided", method=method).pvalue)
    return Shift(estimate=math.expm1(float(np.median(differences))), low=math.expm1(low), high=math.expm1(high),
                 confidence=1 - alpha, p_value=p_value, n_baseline=len(base), n_candidate=len(cand))


def test_method(base: np.ndarray, cand: np.ndarray) -> str:
    """The exact null distribution where it holds (no ties within a sample); scipy would switch to the normal
    approximation from 8 values on, which undercovers slightly at the sizes used here."""
    distinct = len(np.unique(base)) == len(base) and len(np.unique(cand)) == len(cand)
    return "exact" if distinct else "asymptotic"


def rank_interval(base: np.ndarray, cand: np.ndarray, differences: np.ndarray, alpha: float,
                  method: str) -> tuple[float, float]:
    """The shifts not rejected by the two-sided test, on the log scale.

    Shifting the candidate by d changes the test's statistic only where d crosses a pairwise difference, so
    the test is asked once per gap between consecutive differences; the interval's ends are the differences
    that bound the accepted gaps, or infinite where even the most extreme gap is accepted."""
    gaps = np.concatenate([[differences[0] - 1.0], (differences[:-1] + differences[1:]) / 2, [differences[-1] + 1.0]])
    shifted = cand[None, :] - gaps[:, None]
    below = stats.mannwhitneyu(shifted, base[None, :], axis=1, alternative="greater", method=method).pvalue
    above = stats.mannwhitneyu(shifted, base[None, :], axis=1, alternative="less", method=method).pvalue
    accepted = np.flatnonzero((below > alpha / 2) & (above > alpha / 2))
    first, last = accepted[0], accepted[-1]
    low = differences[first - 1] if first > 0 else -math.inf
    high = differences[last] if last < len(differences) else math.inf
    return float(low), float(high)


def smallest_two_sided_p(n: int, m: int) -> float:
    """The smallest p an exact two-sided Mann-Whitney test of n against m distinct values can give."""
    return 2.0 / math.comb(n + m, n) if n and m else 1.0


def fewest_repeats(alpha: float) -> int:
    """Repeats a side below which no shift can be excluded at `alpha`, whatever the data."""
    n = 1
    while smallest_two_sided_p(n, n) > alpha:
        n += 1
    return n


def log_spread(*samples: np.ndarray) -> float:
    """A robust pooled standard deviation of the logs: the scaled median absolute deviation of every value from
    its own sample's median, so one process slowed tenfold by a neighbour does not pass for noise."""
    logs = [np.log(np.asarray(s, float)) for s in samples if len(s) > 1]
    if not logs:
        return math.nan
    deviations = np.concatenate([x - np.median(x) for x in logs])
    # a sample's own median sits inside it: with n values, about n / (n - 1) of the spread is seen
    correction = math.sqrt(sum(len(x) for x in logs) / sum(len(x) - 1 for x in logs))
    return float(stats.median_abs_deviation(deviations, scale="normal")) * correction


def detectable_change(spread: float, n: int, m: int, threshold: float, alpha: float,
                      power: float = DETECTION_POWER) -> float:
    """The smallest slowdown (a positive fraction) that n against m repeats with this log spread would call a
    regression with probability `power`: simulated with normal noise through the rule itself, the exact
    Mann-Whitney test at `alpha` and the Hodges-Lehmann estimate beyond the threshold. inf when the repeats
    cannot reach alpha at all, or no slowdown short of 99% is claimed that often."""
    if smallest_two_sided_p(n, m) > alpha or not math.isfinite(spread) or spread <= 0:
        return math.inf
    return _detectable_change(round(spread, 4), n, m, threshold, alpha, power)


@lru_cache(maxsize=1024)
def _detectable_change(spread: float, n: int, m: int, threshold: float, alpha: float, power: float) -> float:
    rng = np.random.default_rng(0)
    base = rng.standard_normal((DETECTION_DRAWS, n)) * spread
    cand = rng.standard_normal((DETECTION_DRAWS, m)) * spread
    differences = (cand[:, :, None] - base[:, None, :]).reshape(DETECTION_DRAWS, -1)
    method = "exact" if n + m <= EXACT_UP_TO else "asymptotic"
    down = math.log1p(-threshold)

    def claimed(slowdown: float) -> float:
        shift = math.log1p(-slowdown)
        p = stats.mannwhitneyu(cand + shift, base, axis=1, alternative="two-sided", method=method).pvalue
        return float(np.mean((p <= alpha) & (np.median(differences, axis=1) + shift < down)))

    return smallest_with_power(claimed, power)


def smallest_with_power(power_at, power: float) -> float:
    """The smallest slowdown in (0, 0.99] at which `power_at` (rising with the slowdown) reaches `power`, to
    0.2%; inf when even 0.99 falls short."""
    if power_at(0.99) < power:
        return math.inf
    low, high = 0.0, 0.99
    while high - low > 0.002:
        middle = (low + high) / 2
        low, high = (low, middle) if power_at(middle) >= power else (middle, high)
    return high


def repeats_to_decide(spread: float, estimate: float, threshold: float, alpha: float) -> int | None:
    """Repeats a side that would likely (80%) decide a point whose change is `estimate`: beyond the threshold,
    enough that the interval excludes no change; within it, enough that the interval fits inside the band.
    None when the estimate sits on the threshold."""
    logged = math.log1p(estimate)
    down, up = band(threshold)
    distance = abs(logged) if not down < logged < up else min(logged - down, up - logged)
    if not math.isfinite(spread) or distance < 1e-3:
        return None
    z = stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(DECIDING_POWER)
    needed = 2 * RANK_VARIANCE_INFLATION * (z * spread / distance) ** 2
    return max(fewest_repeats(alpha), math.ceil(needed))
