"""Decisions on pairs of processes, judged as the pairs arrive: is the new side slower, faster, or not slower?

Each pair's order is drawn at random, so a test that only flips the pairs' signs is exact whatever the machine does;
a spending function holds the false-claim chance over all looks at alpha, counted in the test's own law, and the
estimate at a stop is corrected for stopping (docs/decision-rules.md, "Pairs judged as they land"). Every decision is
a function of the design and the ordered quiet pairs alone, so a report rendered later reaches the same verdict.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, replace
from functools import lru_cache

import numpy as np
from scipy import stats

from decisions import intervals

# Hwang-Shih-DeCani spending, gamma -2: between O'Brien-Fleming (about -4), which keeps most power for the last
# look, and Pocock (about 1), which stops large changes soonest (simulated in docs/decision-rules.md).
GAMMA = -2.0
LOOK_GROWTH = 1.4
FUTILITY_ALPHA = 0.05  # one-sided level of "not slower by the threshold", a stop that gives up, never a claim
# Sign patterns of up to this many pairs are enumerated (2^16); beyond, SIGN_DRAWS are drawn, seeded by the pairs'
# sizes, and each level is set so that the count drawn plus two of its standard errors stays within its share.
ENUMERATED_PAIRS = 16
SIGN_DRAWS = 2 ** 17
RESAMPLES = 2000  # draws of the design's outcomes behind each corrected estimate
SHIFT_TOLERANCE = 1e-4  # of a log ratio: 0.01% of SPS
SIGNED_RANK, CLIPPED, CAUCHY = "signed-rank", "clipped", "cauchy"
STATISTICS = (SIGNED_RANK, CLIPPED, CAUCHY)
CLIP = 1.5  # a clipped score's ceiling, in medians of the pairs' sizes
CAUCHY_WIDTH = 1.5  # the size at which a Cauchy score peaks, in medians of the pairs' sizes

# Statuses a decision can end in; `not slower` and `unchanged` are futility stops, the second also shown not
# faster by the threshold.
REGRESSED, IMPROVED, UNCHANGED, NOT_SLOWER, INCONCLUSIVE = "regressed", "improved", "unchanged", "not slower", \
    "inconclusive"


@dataclass(frozen=True)
class Design:
    """How a point's pairs are judged. `looks` are counts of quiet pairs; the last is the most a point gets.
    `alpha` is the chance of any false claim over every look of this point; `sides` 1 asks only "slower?"
    (a gate, a bisection), 2 also "faster?" with alpha split evenly. `futility_from` is the first look count
    at which a point may stop as not slower."""

    looks: tuple[int, ...]
    alpha: float
    sides: int
    threshold: float
    futility_from: int
    gamma: float = GAMMA  # of the Hwang-Shih-DeCani spending function
    statistic: str = SIGNED_RANK  # the score of |d| the sign-flip test sums; designs stored without it: signed ranks

    def __post_init__(self):
        if not self.looks or list(self.looks) != sorted(set(self.looks)) or self.looks[0] < 1:
            raise ValueError(f"looks must be increasing pair counts, not {self.looks}")
        if self.sides not in (1, 2) or not 0 < self.alpha < 1 or self.gamma == 0 \
                or self.statistic not in STATISTICS:
            raise ValueError(f"not a design: sides {self.sides}, alpha {self.alpha}, gamma {self.gamma}, "
                             f"statistic {self.statistic}")

    @property
    def max_pairs(self) -> int:
        return self.looks[-1]

    @property
    def side_alpha(self) -> float:
        return self.alpha / self.sides

    def to_dict(self) -> dict:
        return {**asdict(self), "looks": list(self.looks)}

    @classmethod
    def from_dict(cls, data: dict) -> "Design":
        return cls(**{**data, "looks": tuple(data["looks"])})

    @classmethod
    def plan(cls, max_pairs: int, alpha: float, sides: int, threshold: float,
             statistic: str = SIGNED_RANK) -> "Design":
        """Looks from the first at which the exact test can cross its boundary, each about LOOK_GROWTH times
        the last, up to `max_pairs`; futility from the first look."""
        first = first_look(max_pairs, alpha / sides, GAMMA)
        looks = [first]
        while looks[-1] < max_pairs:
            step = max(1, math.ceil(looks[-1] * LOOK_GROWTH) - looks[-1])
            # a look that would leave less than half a step before the most pairs is merged into the last
            looks.append(max_pairs if max_pairs - looks[-1] < 1.5 * step else looks[-1] + step)
        return cls(tuple(looks), alpha, sides, threshold, futility_from=first, statistic=statistic)

    def allowed(self, count: int, final: bool) -> float:
        """The chance of a claim, either way, that looks up to `count` pairs may have spent in all; with `final`
        the data ended there, and all of alpha."""
        return self.alpha if final else self.sides * spent(count / self.max_pairs, self.side_alpha, self.gamma)


def spent(t: float, alpha: float, gamma: float) -> float:
    """How much of one side's alpha may be spent by information fraction t (Hwang-Shih-DeCani)."""
    t = min(max(t, 0.0), 1.0)
    return alpha * (1 - math.exp(-gamma * t)) / (1 - math.exp(-gamma))


def first_look(max_pairs: int, side_alpha: float, gamma: float) -> int:
    """The fewest pairs at which complete separation (every pair one way, p = 2^-n) fits within the first look's
    share of one side's alpha; `max_pairs` when none before it can."""
    for n in range(1, max_pairs):
        if 0.5 ** n <= spent(n / max_pairs, side_alpha, gamma):
            return n
    return max_pairs


def look_levels(design: Design, sizes: np.ndarray, counts: tuple[int, ...], final: bool) -> list[float]:
    """The level each look's exact one-sided p must meet for a claim, given the pairs' sizes |log ratio| in the
    order measured. Under no change every sign pattern of the pairs is equally likely whatever their sizes, so
    the chance of a claim at any look up to k is a count over patterns: look k's level is the largest p whose
    claims, added to those of the looks before it, keep that count within what the spending function allows
    by then (both ways in a two-sided design). A look depends only on the pairs up to it, so a level never
    changes once taken; with `final`, the last look may spend all of alpha."""
    sizes = np.ascontiguousarray(sizes, float)
    return [_level(design, counts[:k + 1], final and k == len(counts) - 1, sizes[:count].tobytes())
            for k, count in enumerate(counts)]


@lru_cache(maxsize=4096)
def _level(design: Design, counts: tuple[int, ...], final: bool, size_bytes: bytes) -> float:
    """The level of the last of `counts` (see look_levels), cached: the same pairs are judged after every pair
    that lands, and again when a report is rendered."""
    sizes = np.frombuffer(size_bytes, float)
    earlier = [_level(design, counts[:k + 1], False, size_bytes[:8 * count]) for k, count in enumerate(counts[:-1])]
    count = counts[-1]
    signs = sign_patterns(sizes)
    claimed = np.zeros(len(signs), bool)
    for look_count, level in zip(counts, earlier):
        claimed |= _pattern_p(signs[:, :look_count], sizes[:look_count], design.sides, design.statistic) <= level
    remaining = _pattern_p(signs, sizes, design.sides, design.statistic)[~claimed]
    budget = design.allowed(count, final) * len(signs) - claimed.sum()
    return _largest_level(np.sort(remaining), budget, exact=count <= ENUMERATED_PAIRS)


def sign_patterns(sizes: np.ndarray) -> np.ndarray:
    """Every sign pattern of these pairs (1: the new side slower) up to ENUMERATED_PAIRS, else SIGN_DRAWS
    drawn with a seed taken from the sizes, so the same pairs always get the same patterns."""
    n = len(sizes)
    if n <= ENUMERATED_PAIRS:
        return _every_pattern(n)
    rng = np.random.default_rng(np.frombuffer(np.ascontiguousarray(sizes, float).tobytes(), np.uint32))
    return rng.integers(0, 2, (SIGN_DRAWS, n), dtype=np.int8)


@lru_cache(maxsize=ENUMERATED_PAIRS + 1)
def _every_pattern(n: int) -> np.ndarray:
    return ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1).astype(np.int8)


def _pattern_p(signs: np.ndarray, sizes: np.ndarray, sides: int, statistic: str = SIGNED_RANK) -> np.ndarray:
    """Each pattern's smallest one-sided exact p (of the sides a claim may take). A score's law (clipped or
    Cauchy) is the patterns' own: every pattern given (all of them, or the same draws the levels are counted
    over) is equally likely, so a pattern's p is the share of them scoring at least as high."""
    n = len(sizes)
    if statistic != SIGNED_RANK:
        slower = _exact_scores(signs, sizes, statistic)
        ordered = np.sort(slower)
        p = (len(ordered) - np.searchsorted(ordered, slower, side="left")) / len(ordered)
        if sides == 2:
            p = np.minimum(p, np.searchsorted(ordered, slower, side="right") / len(ordered))
        return p
    ranks = (np.argsort(np.argsort(sizes)) + 1).astype(np.int32)
    slower = signs @ ranks
    tail = signed_rank_upper_tail(n)
    p = tail[slower]
    return np.minimum(p, tail[n * (n + 1) // 2 - slower]) if sides == 2 else p


def pair_scores(sizes: np.ndarray, statistic: str) -> np.ndarray:
    """Each pair's score of |d| (last axis) by a sign-flip statistic other than the signed ranks: clipped at CLIP
    times their median, or the Cauchy score peaking at CAUCHY_WIDTH times it. Either is a function of the sizes
    alone, which every sign pattern shares, so the test stays exact."""
    sizes = np.abs(np.asarray(sizes, float))
    median = np.median(sizes, axis=-1, keepdims=True)
    if statistic == CLIPPED:
        return np.minimum(sizes, CLIP * median)
    width = CAUCHY_WIDTH * median
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(width > 0, sizes / (1 + (sizes / width) ** 2), 0.0)


def _exact_scores(signs: np.ndarray, sizes: np.ndarray, statistic: str) -> np.ndarray:
    """Each pattern's score in whole units of a millionth of the largest pair's, summed in integers: patterns
    that score alike tie exactly, whatever order a float sum would take."""
    scores = pair_scores(sizes, statistic)
    if scores.max() <= 0:
        return np.zeros(len(signs), np.int64)
    return signs.astype(np.int64) @ np.rint(scores / scores.max() * 1e6).astype(np.int64)


def exact_p(design: Design, values: np.ndarray) -> float:
    """One-sided exact p of the design's sign-flip test that the values lean positive."""
    values = np.asarray(values, float)
    if design.statistic == SIGNED_RANK:
        return signed_rank_p(values)
    sizes = np.abs(values)
    observed = _exact_scores((values > 0).astype(np.int8)[None, :], sizes, design.statistic)[0]
    return float(np.mean(_exact_scores(sign_patterns(sizes), sizes, design.statistic) >= observed))


def _largest_level(sorted_p: np.ndarray, budget: float, exact: bool) -> float:
    """The largest p among these whose count at or below it fits the budget (drawn patterns: with two standard
    errors of the count to spare); 0 when not even the smallest fits."""
    fits = np.arange(1, len(sorted_p) + 1)
    if not exact:
        fits = fits + 2 * np.sqrt(fits)
    # the count at a level includes every pattern tied with it
    last_of_value = np.r_[sorted_p[1:] != sorted_p[:-1], True]
    allowed = (fits <= budget) & last_of_value
    return float(sorted_p[np.flatnonzero(allowed)[-1]]) if allowed.any() else 0.0


# ---- one look --------------------------------------------------------------------------------------------------

def signed_rank_p(values: np.ndarray) -> float:
    """One-sided exact p of the Wilcoxon signed-rank test that the values lean positive; with ties or zeros,
    where the exact law does not hold, scipy's normal approximation."""
    if len(np.unique(np.abs(values))) == len(values) and not np.any(values == 0):
        return float(_row_signed_rank_p(values[None, :])[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.wilcoxon(values, alternative="greater", method="approx").pvalue)


def walsh_averages(values: np.ndarray) -> np.ndarray:
    i, j = np.triu_indices(len(values))
    return np.sort((values[i] + values[j]) / 2)


def hodges_lehmann(values: np.ndarray) -> float:
    """The median of the Walsh averages: the estimate that goes with the signed-rank test."""
    return float(np.median(walsh_averages(values)))


@lru_cache(maxsize=256)
def signed_rank_tail(n: int, tail: float) -> int:
    """The smallest count t with P(T+ >= t) <= tail under no change; n(n+1)/2 + 1 when no count is that rare."""
    rare = np.flatnonzero(signed_rank_upper_tail(n) <= tail)
    return int(rare[0]) if len(rare) else n * (n + 1) // 2 + 1


def signed_rank_interval(values: np.ndarray, tail: float) -> tuple[float, float]:
    """The shifts that neither one-sided signed-rank test rejects at `tail`: an interval of confidence
    1 - 2 * tail. T+ of the values less a shift counts the Walsh averages above that shift, so the ends are
    the Walsh averages at the test's critical count from either end; infinite where no count is that rare."""
    walsh = walsh_averages(values)
    critical = signed_rank_tail(len(values), tail)
    if critical > len(walsh):
        return -math.inf, math.inf
    return float(walsh[len(walsh) - critical]), float(walsh[critical - 1])


def pair_spread(values: np.ndarray) -> float:
    """A robust standard deviation of the pairs' log ratios (scaled median absolute deviation), the noise a
    point's pairs carry; the plain SD where the MAD is 0."""
    if len(values) < 2:
        return math.nan
    spread = float(stats.median_abs_deviation(values, scale="normal"))
    return spread if spread > 0 else float(np.std(values, ddof=1))


# ---- a decision ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    """Where a point's pairs stand. Changes are relative (new / ref - 1) and `slower`-oriented values never
    leave this module. `stopped` is False while more looks may come."""

    status: str
    stopped: bool
    pairs: int  # quiet pairs judged
    look: int  # pairs at the look that decided, or the last look taken
    estimate: float  # median-unbiased under the design's stagewise ordering
    low: float
    high: float
    confidence: float
    naive: float  # the Hodges-Lehmann estimate at the stop, biased by stopping
    p_value: float  # one-sided exact p of the side the status speaks of (slower unless improved)
    level: float  # the nominal level that p met, or had to meet, at `look`
    spread: float  # robust SD of the pairs' log ratios
    reason: str = ""

    @property
    def claim(self) -> bool:
        return self.status in (REGRESSED, IMPROVED)


def decide(design: Design, log_ratios: np.ndarray, ended: bool = False, estimate: bool = True) -> Decision:
    """The decision on these quiet pairs' log ratios (new over ref, in the order measured).

    The scheduled looks up to the pairs there are come first, in order, each at its own level; the first that
    stops decides. With `ended` (no more pairs will come) and no stop, the pairs there are make one final look
    that spends what is left of alpha. A stop therefore never depends on whether more pairs could have come,
    so judging the pairs as they land and judging the stored pairs later agree. Without `estimate`, a stop
    reports its plain Hodges-Lehmann estimate and fixed-sample interval (for simulations of error rates, which
    need only the status)."""
    d = np.asarray(log_ratios, float)
    n = len(d)
    sizes = np.abs(d)
    scheduled = tuple(count for count in design.looks if count <= n)
    if scheduled:
        levels = look_levels(design, sizes, scheduled, final=scheduled[-1] == design.max_pairs)
        for k, count in enumerate(scheduled):
            decision = look(design, d, scheduled[:k + 1], levels[:k + 1], estimate)
            if decision is not None:
                return decision
        if scheduled[-1] == design.max_pairs:
            return inconclusive(design, d, scheduled, levels, estimate)
    if not ended:
        naive = math.expm1(hodges_lehmann(d)) if n else math.nan
        return Decision("running", False, n, n, naive, -1.0, math.inf, 1 - 2 * design.side_alpha, naive, math.nan,
                        math.nan, pair_spread(d))
    if n == 0:
        return Decision(INCONCLUSIVE, True, 0, 0, math.nan, -1.0, math.inf, 1 - 2 * design.side_alpha, math.nan,
                        1.0, math.nan, math.nan, "no quiet pair was measured")
    counts = tuple(count for count in design.looks if count < n) + (n,)
    levels = look_levels(design, sizes, counts, final=True)
    return look(design, d, counts, levels, estimate) or inconclusive(design, d, counts, levels, estimate)


def look(design: Design, d: np.ndarray, counts: tuple[int, ...], levels: list[float],
         estimate: bool) -> Decision | None:
    """The last of `counts` judged: a claim when its exact p meets the look's level and the estimate lies
    beyond the threshold (slower first), else a futility stop from `futility_from` pairs when the interval
    lies above -threshold; None when neither."""
    count, level = counts[-1], levels[-1]
    part = d[:count]
    naive = hodges_lehmann(part)
    down, up = math.log1p(-design.threshold), math.log1p(design.threshold)
    p_slower = exact_p(design, -part)
    if p_slower <= level and naive < down:
        return stopped(design, d, counts, levels, REGRESSED, p_slower, estimate=estimate)
    if design.sides == 2:
        p_faster = exact_p(design, part)
        if p_faster <= level and naive > up:
            return stopped(design, d, counts, levels, IMPROVED, p_faster, estimate=estimate)
    if count >= design.futility_from:
        low, high = signed_rank_interval(part, FUTILITY_ALPHA)
        if low > down:
            status = UNCHANGED if high < up else NOT_SLOWER
            return stopped(design, d, counts, levels, status, p_slower, (low, high), estimate=estimate)
    return None


def inconclusive(design: Design, d: np.ndarray, counts: tuple[int, ...], levels: list[float],
                 estimate: bool) -> Decision:
    part = d[:counts[-1]]
    decision = stopped(design, d, counts, levels, INCONCLUSIVE, exact_p(design, -part), estimate=estimate)
    return replace(decision, reason=inconclusive_reason(design, part, decision.spread))


def stopped(design: Design, d: np.ndarray, counts: tuple[int, ...], levels: list[float], status: str,
            p_value: float, futility: tuple[float, float] | None = None, estimate: bool = True) -> Decision:
    """The decision at the last of `counts`: the estimate corrected for stopping there and, for a claim or an
    inconclusive end, the interval from the same ordering; a futility stop shows the interval that stopped it."""
    part = d[:counts[-1]]
    spread = pair_spread(part)
    confidence = 1 - 2 * design.side_alpha
    if estimate:
        value, low, high = corrected(design, counts, levels, part, status)
    else:
        value = math.expm1(hodges_lehmann(part))
        low, high = (math.expm1(end) for end in signed_rank_interval(part, design.side_alpha))
    if futility is not None:
        low, high = math.expm1(futility[0]), math.expm1(futility[1])
        confidence = 1 - 2 * FUTILITY_ALPHA
    return Decision(status, True, len(d), counts[-1], value, low, high, confidence,
                    math.expm1(hodges_lehmann(part)), p_value, levels[-1], spread)


def corrected(design: Design, counts: tuple[int, ...], levels: list[float], part: np.ndarray,
              status: str) -> tuple[float, float, float]:
    """(estimate, low, high) as relative changes, corrected for stopping at the last of `counts`.

    Outcomes of the design are ordered stagewise: a stop on the slower side at an earlier look is more extreme
    than any outcome later, and at the stopping look a larger slowdown (Hodges-Lehmann) is more extreme. The
    estimate is the shift at which the outcome observed is the median of that order, the interval ends the
    shifts at which it is the side-alpha quantiles. The law of the outcomes under a shift is drawn by running
    the design's own looks (exact p against each look's level, and the threshold) on pairs made of the shift
    plus the observed residuals, resampled with random signs; the same draws serve every shift, so the answer
    is monotone in it and, being seeded by the data, the same wherever these pairs are judged. Futility stops
    are left out of the order: they are non-binding."""
    naive = hodges_lehmann(part)
    if len(part) < 2 or np.all(part == part[0]):
        return math.expm1(naive), -1.0, math.inf
    rng = np.random.default_rng(np.frombuffer(part.tobytes(), np.uint32))
    residuals = part - naive
    noise = rng.choice(residuals, (RESAMPLES, counts[-1])) * rng.choice((-1.0, 1.0), (RESAMPLES, counts[-1]))
    # a Hodges-Lehmann estimate moves with a shift, so each look's is the shift plus the noise's, found once
    noise_hl = {count: _row_hodges_lehmann(noise[:, :count]) for count in counts}
    down, up = math.log1p(-design.threshold), math.log1p(design.threshold)
    earlier = list(zip(counts[:-1], levels[:len(counts) - 1]))
    observed = min(naive, down) if status == REGRESSED else naive  # a claim is at least as slow as its threshold

    def slower_than_observed(shift: float) -> float:
        """P(an outcome at least as slow as observed) when the true log ratio is `shift`."""
        stopped_slower = np.zeros(RESAMPLES, bool)
        stopped_faster = np.zeros(RESAMPLES, bool)
        for count, level in earlier:
            block = noise[:, :count] + shift
            going = ~stopped_slower & ~stopped_faster
            hl = noise_hl[count] + shift
            stopped_slower |= going & (hl < down) & (_row_p(design, -block) <= level)
            if design.sides == 2:
                stopped_faster |= going & (hl > up) & (_row_p(design, block) <= level)
        reached = ~stopped_slower & ~stopped_faster
        return float(np.mean(stopped_slower | (reached & (shift + noise_hl[counts[-1]] <= observed))))

    def solve(quantile: float) -> float:
        low, high = naive - 2.0, naive + 2.0
        while high - low > SHIFT_TOLERANCE:  # bisection: the probability falls as the shift rises (towards faster)
            middle = (low + high) / 2
            if slower_than_observed(middle) >= quantile:
                low = middle
            else:
                high = middle
        return (low + high) / 2

    return (math.expm1(solve(0.5)), math.expm1(solve(1 - design.side_alpha)),
            math.expm1(solve(design.side_alpha)))


def _row_hodges_lehmann(rows: np.ndarray) -> np.ndarray:
    i, j = np.triu_indices(rows.shape[1])
    return np.median((rows[:, i] + rows[:, j]) / 2, axis=1)


def _row_p(design: Design, rows: np.ndarray) -> np.ndarray:
    """Each row's one-sided p that it leans positive, by the design's statistic: the signed ranks' exact law;
    for a score (clipped or Cauchy), the normal law of its sign flips (mean half the scores' sum, variance a
    quarter of their squares'), which the corrected estimates and the power drawn over thousands of rows use,
    never a claim."""
    if design.statistic == SIGNED_RANK:
        return _row_signed_rank_p(rows)
    scores = pair_scores(rows, design.statistic)
    leaning = np.where(rows > 0, scores, 0.0).sum(axis=1)
    spread = np.sqrt((scores ** 2).sum(axis=1) / 4)
    with np.errstate(divide="ignore", invalid="ignore"):
        return stats.norm.sf(np.where(spread > 0, (leaning - scores.sum(axis=1) / 2) / spread, 0.0))


def _row_signed_rank_p(rows: np.ndarray) -> np.ndarray:
    """Each row's one-sided exact signed-rank p that it leans positive (ties broken by position)."""
    ranks = np.argsort(np.argsort(np.abs(rows), axis=1), axis=1) + 1
    statistic = np.where(rows > 0, ranks, 0).sum(axis=1)
    return signed_rank_upper_tail(rows.shape[1])[statistic]


@lru_cache(maxsize=256)
def signed_rank_upper_tail(n: int) -> np.ndarray:
    """P(T+ >= t) for t = 0 .. n(n+1)/2 under no change: the exact law of the signed-rank statistic of n pairs,
    every subset of the ranks 1..n equally likely to be the positive ones."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for rank in range(1, n + 1):
        counts[rank:] = counts[rank:] + counts[:-rank].copy()
    return np.cumsum((counts / counts.sum())[::-1])[::-1]


def inconclusive_reason(design: Design, part: np.ndarray, spread: float) -> str:
    """Why the pairs decided nothing, and about how many a side would: at the measured spread, the pairs a
    fixed test of this design's level needs to show this point either slower by its estimate or not slower."""
    needed = pairs_to_decide(spread, hodges_lehmann(part), design)
    text = (f"{len(part)} quiet pairs decided nothing: pair spread {spread:.1%}, change "
            f"{math.expm1(hodges_lehmann(part)):+.1%}")
    if needed is None:
        return text + "; the change sits on the threshold and no practical number of pairs decides it"
    return text + f"; about {needed} pairs would likely decide it"


def pairs_to_decide(spread: float, log_change: float, design: Design, power: float = 0.8) -> int | None:
    """Pairs at which a point with this change and spread would likely (`power`) be decided, counting the
    signed-rank test's efficiency: claimed when beyond the threshold, shown not slower when inside it."""
    if not (math.isfinite(spread) and spread > 0 and math.isfinite(log_change)):
        return None
    down = math.log1p(-design.threshold)
    distance = abs(log_change) if log_change < down else log_change - down
    if distance < 1e-3:
        return None
    level = design.side_alpha if log_change < down else FUTILITY_ALPHA
    z = stats.norm.isf(level) + stats.norm.isf(1 - power)
    return max(design.looks[0], math.ceil((math.pi / 3) * (z * spread / distance) ** 2))


# ---- what a design can detect -----------------------------------------------------------------------------------

DETECTION_POWER = 0.95
DETECTION_DRAWS = 1000


def detectable(design: Design, spread: float, power: float = DETECTION_POWER) -> float:
    """The smallest slowdown (a positive fraction) this design claims with `power` by its last look, when the
    pairs' log ratios spread by `spread` (normal noise); inf when no slowdown short of 99% is claimed that
    often."""
    if not math.isfinite(spread) or spread <= 0:
        return math.inf
    return intervals.smallest_with_power(lambda slowdown: claim_power(design, round(spread, 4), slowdown), power)


@lru_cache(maxsize=65536)
def claim_power(design: Design, spread: float, slowdown: float) -> float:
    """The chance this design claims a point slower by `slowdown` at some look, its pairs' log ratios spreading
    by `spread` (normal noise): simulated through the design's own looks, each look's exact p against the levels
    the design sets for typical pair sizes, and the threshold (the pairs' median standing in for the
    Hodges-Lehmann estimate)."""
    noise, levels = _power_draws(design, spread)
    pairs = math.log1p(-slowdown) + noise
    down = math.log1p(-design.threshold)
    hit = np.zeros(DETECTION_DRAWS, bool)
    for count, level in zip(design.looks, levels):
        block = pairs[:, :count]
        hit |= (_row_p(design, -block) <= level) & (np.median(block, axis=1) < down)
    return float(hit.mean())


@lru_cache(maxsize=256)
def _power_draws(design: Design, spread: float) -> tuple[np.ndarray, list[float]]:
    rng = np.random.default_rng(0)
    noise = rng.standard_normal((DETECTION_DRAWS, design.max_pairs)) * spread
    # levels depend on the sizes' ranks alone, so the same typical sizes serve every spread (and the cache)
    typical = np.abs(stats.norm.ppf((np.arange(design.max_pairs) + 0.5) / design.max_pairs))
    return noise, look_levels(design, np.random.default_rng(0).permutation(typical), design.looks, final=True)


# ---- the design stored with paired runs --------------------------------------------------------------------------

PAIRING = "pairing"


def pairing_entry(side: str, partner: str | None, design: Design) -> dict:
    """The fingerprint entry of a run measured in pairs: its side ("ref" or "new"), the run it was paired with
    (named by the new side's run, which is created second), and the design that judges the pairs."""
    return {PAIRING: {"side": side, "partner": partner, "design": design.to_dict()}}


def paired_design(fingerprint: dict, baseline_run: str) -> Design | None:
    """The design to judge a run by when its baseline is the run it was paired with; None otherwise."""
    entry = fingerprint.get(PAIRING) or {}
    if entry.get("side") != "new" or entry.get("partner") != baseline_run:
        return None
    return Design.from_dict(entry["design"])
