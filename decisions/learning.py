"""Time to solve and share solved: how soon a point learns, judged with statistics made for censored data.

A repeat that never solved is a lower bound, not a value: shares get exact binomial intervals, times Kaplan-Meier
medians, and changes the log-rank test, read into the four outcomes of SPS verdicts with a wider threshold
(LEARNING_THRESHOLD). Why: docs/decision-rules.md#time-to-solve.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from decisions.criteria import DEFAULT_ALPHA
from decisions.verdicts import OUTCOMES, match_key, quiet
from rlperf.store import point_label

# A change of time to solve counts from 25%: learning varies by seed far more than speed does, and a tighter margin
# would leave most comparisons inconclusive for good (docs/decision-rules.md#time-to-solve).
LEARNING_THRESHOLD = 0.25
# What each repeat's time to solve is measured in: end to end (what a person waits for), at the steady speed,
# and in agent steps (what the knob does to learning, whatever it does to speed).
METRICS = ("seconds", "steady_seconds", "steps")
FASTER_LEARNS_WORSE = "faster, learns worse"
# Learning verdicts are two-sided and fixed-size: never the sequential designs' "not slower".
REGRESSED, IMPROVED, UNCHANGED, INCONCLUSIVE = (outcome for outcome in OUTCOMES if outcome != "not slower")
OUTCOME_OF = {"up": REGRESSED, "down": IMPROVED, "same": UNCHANGED, "undecided": INCONCLUSIVE}


@dataclass(frozen=True)
class Durations:
    """One point's repeats: time to solve (or to the end of the budget), and whether each solved."""

    times: np.ndarray
    solved: np.ndarray

    def __len__(self) -> int:
        return len(self.times)

    def censored(self) -> stats.CensoredData:
        return stats.CensoredData(uncensored=self.times[self.solved], right=self.times[~self.solved])


@dataclass(frozen=True)
class Median:
    """A Kaplan-Meier median and its interval; inf where not reached."""

    value: float
    low: float
    high: float


@dataclass(frozen=True)
class Share:
    solved: int
    n: int
    low: float
    high: float

    @property
    def fraction(self) -> float:
        return self.solved / self.n


@dataclass(frozen=True)
class PointLearning:
    """A point's learning over its repeats (contended ones included: steps and shares do not depend on the
    machine, and the report says which repeats were contended)."""

    point_key: str
    label: str
    target_return: float
    window: int
    share: Share
    medians: dict[str, Median]  # by METRICS
    budget: dict[str, float]  # by METRICS: the longest a repeat ran
    final_return: float  # median over repeats of the return at the end of the run


@dataclass(frozen=True)
class SolveChange:
    """Candidate against baseline. `relative` is the ratio of the medians less 1, a bound when `bound` says
    ("at least": the candidate's median is not reached; "at most": the baseline's), NaN when neither is
    reached; [low, high] is the interval of that ratio less 1 at `confidence`. `decision` is up (takes
    longer), down, same or undecided."""

    baseline: Median
    candidate: Median
    relative: float
    bound: str
    low: float
    high: float
    confidence: float
    p_value: float
    decision: str
    n_baseline: int
    n_candidate: int


@dataclass
class LearningVerdict:
    match_key: str
    point: str
    status: str
    reason: str = ""
    change: SolveChange | None = None
    shares: tuple[Share, Share] | None = None  # baseline, candidate


@contextlib.contextmanager
def undefined_points_allowed():
    """scipy warns where a formula is undefined (the log-log band where the curve is 0 or 1, the log-rank
    statistic with no event at risk); those places are handled where the values are read."""
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def durations(samples: pd.DataFrame, metric: str = "seconds") -> Durations | None:
    """The repeats' times to solve in `metric`; None when no repeat measured one."""
    records = [summary.time_to_solve for summary in samples["summary"]] if len(samples) else []
    records = [record for record in records if record]
    if not records:
        return None
    return Durations(np.array([float(r[metric]) for r in records]), np.array([bool(r["solved"]) for r in records]))


def km_median(d: Durations, confidence: float) -> Median:
    with undefined_points_allowed():
        curve = stats.ecdf(d.censored()).sf
        band = curve.confidence_interval(confidence, method="log-log")
    times, survival = curve.quantiles, curve.probabilities

    def first_at_or_below_half(values: np.ndarray) -> float:
        # the band is undefined where the curve is 0 or 1, and is the curve there
        values = np.where(np.isnan(values), survival, values)
        below = np.flatnonzero(values <= 0.5)
        return float(times[below[0]]) if len(below) else math.inf

    return Median(first_at_or_below_half(survival), first_at_or_below_half(band.low.probabilities),
                  first_at_or_below_half(band.high.probabilities))


def share_solved(d: Durations, confidence: float) -> Share:
    solved = int(d.solved.sum())
    interval = stats.binomtest(solved, len(d)).proportion_ci(confidence, method="exact")
    return Share(solved, len(d), float(interval.low), float(interval.high))


def logrank_p(candidate: Durations, baseline: Durations, scale: float = 1.0) -> float:
    """Two-sided p of the log-rank test of the candidate's times divided by `scale` against the baseline's;
    1 where no repeat is at risk at any solve (nothing to tell them apart)."""
    with undefined_points_allowed():
        p = stats.logrank(Durations(candidate.times / scale, candidate.solved).censored(), baseline.censored()).pvalue
    return 1.0 if np.isnan(p) else float(p)


def scale_interval(candidate: Durations, baseline: Durations, alpha: float) -> tuple[float, float]:
    """The factors (less 1) by which the candidate's times can be divided without the log-rank test rejecting
    them at `alpha`. The test's statistic changes only where a scaled candidate time crosses a baseline time,
    so it is asked once per gap between consecutive log ratios; the ends are the ratios bounding the accepted
    gaps, or infinite where even the most extreme gap is accepted."""
    ratios = np.sort(np.subtract.outer(np.log(candidate.times), np.log(baseline.times)).ravel())
    gaps = np.concatenate([[ratios[0] - 1.0], (ratios[:-1] + ratios[1:]) / 2, [ratios[-1] + 1.0]])
    accepted = np.flatnonzero([logrank_p(candidate, baseline, math.exp(gap)) > alpha for gap in gaps])
    if not len(accepted):  # every factor rejected, even where the two sides balance: no interval to give
        return math.nan, math.nan
    first, last = accepted[0], accepted[-1]
    low = math.expm1(ratios[first - 1]) if first > 0 else -1.0
    high = math.expm1(ratios[last]) if last < len(ratios) else math.inf
    return low, high


def median_ratio(candidate: Durations, baseline: Durations, cand: Median, base: Median) -> tuple[float, str]:
    if math.isfinite(cand.value) and math.isfinite(base.value):
        return cand.value / base.value - 1, ""
    if math.isfinite(base.value):  # the candidate's median lies beyond its longest repeat
        return candidate.times.max() / base.value - 1, "at least"
    if math.isfinite(cand.value):
        return cand.value / baseline.times.max() - 1, "at most"
    return math.nan, "neither median reached"


def compare_solve(baseline: Durations, candidate: Durations, threshold: float, alpha: float) -> SolveChange:
    """Candidate's time to solve against the baseline's, decided against `threshold` at `alpha`."""
    base, cand = km_median(baseline, 1 - alpha), km_median(candidate, 1 - alpha)
    relative, bound = median_ratio(candidate, baseline, cand, base)
    low, high = scale_interval(candidate, baseline, alpha)
    p_value = logrank_p(candidate, baseline)
    down, up = -threshold, threshold
    beyond_up = relative > up and bound in ("", "at least")
    beyond_down = relative < down and bound in ("", "at most")
    if p_value <= alpha and beyond_up and low > 0:
        decision = "up"
    elif p_value <= alpha and beyond_down and high < 0:
        decision = "down"
    elif down < low and high < up:
        decision = "same"
    else:
        decision = "undecided"
    return SolveChange(base, cand, relative, bound, low, high, 1 - alpha, p_value, decision, len(baseline),
                       len(candidate))


def judge_learning(candidate: pd.DataFrame, baseline: pd.DataFrame, threshold: float = LEARNING_THRESHOLD,
                   alpha: float = DEFAULT_ALPHA) -> LearningVerdict | None:
    """The verdict on the time to solve of two sets of samples (rows of `Store.samples()`), contended repeats
    left out (their seconds are the neighbour's as much as the code's); None when either has no time to solve."""
    if durations(candidate) is None or durations(baseline) is None:
        return None
    cand, base = durations(quiet(candidate)), durations(quiet(baseline))
    if cand is None or base is None or min(len(cand), len(base)) < 2:
        counts = [0 if d is None else len(d) for d in (base, cand)]
        return LearningVerdict("", "", INCONCLUSIVE, f"too few quiet repeats: {counts[0]} against {counts[1]}")
    verdict = LearningVerdict("", "", INCONCLUSIVE,
                              shares=(share_solved(base, 1 - alpha), share_solved(cand, 1 - alpha)))
    if not cand.solved.any() and not base.solved.any():
        verdict.reason = "neither side solved within its budget: there is no time to compare"
        return verdict
    change = compare_solve(base, cand, threshold, alpha)
    verdict.change, verdict.status = change, OUTCOME_OF[change.decision]
    if verdict.status == INCONCLUSIVE:
        verdict.reason = undecided_reason(change, threshold, alpha)
    return verdict


def undecided_reason(change: SolveChange, threshold: float, alpha: float) -> str:
    p, interval = f"log-rank p={change.p_value:.2g}", fmt_solve_interval(change)
    if change.bound == "neither median reached":
        return f"fewer than half of either side's repeats solved: there is no median to compare ({p})"
    if change.p_value <= alpha:
        return (f"a real change ({p}), not shown to exceed ±{threshold:.0%}: the estimate or the interval "
                f"{interval} reaches inside")
    return (f"the interval {interval} neither excludes no change ({p}) nor fits within ±{threshold:.0%}; more seeds "
            "a side would narrow it")


def judge_all(candidate_points: pd.DataFrame, candidate_samples: pd.DataFrame, baseline_points: pd.DataFrame,
              baseline_samples: pd.DataFrame, threshold: float = LEARNING_THRESHOLD,
              alpha: float = DEFAULT_ALPHA) -> list[LearningVerdict]:
    """A learning verdict per point measured in both runs (matched as SPS verdicts match them) that has a
    time to solve; claims are weighed together over the points by Benjamini-Hochberg, as SPS claims are."""
    baselines = {match_key(row.point_key, row.config): row for row in baseline_points.itertuples()
                 if row.status == "ok"}
    verdicts = []
    for row in candidate_points.itertuples():
        key = match_key(row.point_key, row.config)
        if row.status != "ok" or key not in baselines:
            continue
        base = baselines[key]
        verdict = judge_learning(candidate_samples[candidate_samples["point_key"] == row.point_key],
                                 baseline_samples[baseline_samples["point_key"] == base.point_key], threshold, alpha)
        if verdict is not None:
            verdict.match_key, verdict.point = key, point_label(row.point_key)
            verdicts.append(verdict)
    compared = [v for v in verdicts if v.change is not None]
    if len(compared) > 1:
        adjusted = stats.false_discovery_control([v.change.p_value for v in compared], method="bh")
        for verdict, p in zip(compared, adjusted):
            if verdict.status in (REGRESSED, IMPROVED) and p > alpha:
                verdict.reason = (f"{verdict.status} alone (log-rank p={verdict.change.p_value:.2g}), but not once "
                                  f"the {len(compared)} points are weighed together (Benjamini-Hochberg p={p:.2g})")
                verdict.status = INCONCLUSIVE
    return verdicts


def summarize_learning(points: pd.DataFrame, samples: pd.DataFrame, alpha: float = DEFAULT_ALPHA) -> list[PointLearning]:
    """Per point with a time to solve, in the order of `points`: share solved, medians, budget, final return."""
    rows = []
    for point in points.itertuples():
        mine = samples[samples["point_key"] == point.point_key]
        measured = {metric: durations(mine, metric) for metric in METRICS}
        if measured["seconds"] is None:
            continue
        record = next(s.time_to_solve for s in mine["summary"] if s.time_to_solve)
        returns = pd.to_numeric(mine["mean_episode_return"], errors="coerce").dropna()
        rows.append(PointLearning(
            point.point_key, point_label(point.point_key), record["target_return"], record["window"],
            share_solved(measured["seconds"], 1 - alpha),
            {metric: km_median(d, 1 - alpha) for metric, d in measured.items()},
            {metric: float(d.times.max()) for metric, d in measured.items()},
            float(returns.median()) if len(returns) else math.nan))
    return rows


def reading(sps_status: str | None, learning_status: str | None) -> str:
    """SPS and time to solve in one phrase; FASTER_LEARNS_WORSE is the one a reader must not miss."""
    if sps_status == IMPROVED and learning_status == REGRESSED:
        return FASTER_LEARNS_WORSE
    speed = {"improved": "faster", "regressed": "slower", "unchanged": "same speed"}.get(sps_status or "",
                                                                                        "speed undecided")
    learning = {"improved": "solves sooner", "regressed": "solves later", "unchanged": "solves as soon"}.get(
        learning_status or "", "time to solve undecided")
    return f"{speed}, {learning}"


def fmt_time(value: float, metric: str) -> str:
    if not math.isfinite(value):
        return "not reached"
    return f"{value / 1e3:,.0f}K" if metric == "steps" else f"{value:,.1f} s"


def fmt_median(median: Median, metric: str) -> str:
    if math.isinf(median.low):
        return "not reached"
    high = "∞" if math.isinf(median.high) else fmt_time(median.high, metric)
    return f"{fmt_time(median.value, metric)} [{fmt_time(median.low, metric)}, {high}]"


def fmt_share(share: Share) -> str:
    return f"{share.solved}/{share.n} [{share.low:.0%}, {share.high:.0%}]"


def fmt_solve_interval(change: SolveChange) -> str:
    low = "−∞" if change.low <= -1 else f"{change.low:+.0%}"
    high = "+∞" if math.isinf(change.high) else f"{change.high:+.0%}"
    return f"[{low}, {high}]"


def fmt_solve_change(change: SolveChange | None) -> str:
    if change is None:
        return "–"
    if not math.isfinite(change.relative):
        return f"{change.bound} {fmt_solve_interval(change)}"
    sign = {"at least": "≥ ", "at most": "≤ "}.get(change.bound, "")
    return f"{sign}{change.relative:+.0%} {fmt_solve_interval(change)}"
