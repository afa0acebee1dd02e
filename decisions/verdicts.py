"""Regression verdicts: did a point get slower, by how much, how sure can we be, and which phase grew.

Runs of different nights are judged by the Hodges-Lehmann shift of their processes and its exact Mann-Whitney
interval (decisions/intervals.py), claims across points by Benjamini-Hochberg; runs measured in pairs by the design
stored with them (decisions/sequential.py). Why: docs/decision-rules.md#runs-of-different-nights. SPS: higher is
better; phase times, as seconds per agent step so runs of different lengths compare: lower is better.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from reference_trainer.config import OBSERVER, PHASES, TrainConfig, fields_with
from decisions import intervals, sequential
from decisions.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from rlperf.summary import OTHER, RunSummary
from rlperf.store import point_label

# A phase is named as a cause only if its growth is a visible part of the step: a 40% slower `log`
# phase that costs 0.1% of the step explains nothing.
MIN_PHASE_GROWTH_SHARE = 0.02
DEFAULT_CONFIG = TrainConfig().to_dict()
OUTCOMES = ("regressed", "improved", "unchanged", "not slower", "inconclusive")
# a gate's verdicts (decisions/screening.py) speak of points passed, not confirmed, undecided, not measured or skipped
STATUSES = OUTCOMES + ("passed", "not confirmed", "undecided", "could not measure", "skipped", "new", "missing",
                       "failed")


@dataclass(frozen=True)
class Change:
    """One metric compared. `baseline` and `candidate` are medians over repeats; `relative` is the estimated
    change with its interval [low, high] at `confidence`; `p_value` is the two-sided p of no change;
    `decision` is down, up (real and beyond the threshold), same (inside +-threshold) or undecided."""

    baseline: float
    candidate: float
    relative: float
    low: float
    high: float
    confidence: float
    p_value: float
    decision: str
    worse: bool
    n_baseline: int
    n_candidate: int
    spread: float  # pooled standard deviation of the logs: the noise of one process


@dataclass
class PointVerdict:
    match_key: str
    point: str
    status: str
    reason: str = ""
    sps: Change | None = None
    phases_grew: list[tuple[str, Change]] = field(default_factory=list)
    phases_shrank: list[tuple[str, Change]] = field(default_factory=list)
    contended: tuple[int, int] = (0, 0)  # repeats left out: baseline, candidate
    detectable: float = math.inf  # the smallest slowdown these repeats would catch (DETECTION_POWER)
    repeats_needed: int | None = None  # a side, for an inconclusive verdict
    decision: sequential.Decision | None = None  # pairs judged by a stored design: the decision behind the verdict


def match_key(point_key: str, config: dict, ignored: tuple[str, ...] = ()) -> str:
    """Identity of a point across runs: its swept values and its resolved configuration, less the fields
    that only change how it was observed or perturbed (a traced or delay-injected run is still the same
    point) and any `ignored` ones. The swept values are part of it because two sweep blocks of one suite
    can resolve to the same configuration. A setting added to the trainer after a run was stored counts as
    its default there, so the run still matches a newer one that leaves the setting at its default. The two sides
    of a suite's [against] pairs are one point: they differ by the settings it names and the command they make."""
    against = config.get("against")
    if isinstance(against, dict):
        ignored = (*ignored, *against, "command")
    resolved = {**DEFAULT_CONFIG, **config}
    kept = {name: value for name, value in resolved.items() if name not in fields_with(OBSERVER) + ignored}
    return json.dumps([json.loads(point_key), kept], sort_keys=True)


def is_contended(summary: RunSummary) -> bool:
    return bool((summary.interference or {}).get("contended"))


def quiet(samples: pd.DataFrame) -> pd.DataFrame:
    """The repeats whose machine was not contended while they ran."""
    if samples.empty:
        return samples
    return samples[~samples["summary"].map(is_contended)]


def detectable_alone(samples: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD, alpha: float = DEFAULT_ALPHA,
                     family: int = 1) -> tuple[int, float]:
    """(contended repeats, the smallest slowdown this point's quiet repeats would catch against as many
    repeats of a baseline as noisy, when it is one of `family` points judged together): what a point can tell
    before it is compared with anything. A lone regression among them must clear Benjamini-Hochberg's first
    step, alpha / family."""
    calm = quiet(samples)
    n = len(calm)
    spread = intervals.log_spread(calm["sps"].to_numpy(float)) if n > 1 else math.nan
    return len(samples) - n, intervals.detectable_change(spread, n, n, threshold, alpha / max(1, family))


def phase_per_step(samples: pd.DataFrame, phase: str) -> np.ndarray:
    """Seconds per agent step spent in `phase`, one value per repeat."""
    return np.array([row.phases.get(phase, 0.0) / row.summary.steady_steps for row in samples.itertuples()],
                    dtype=float)


def compare_values(baseline: np.ndarray, candidate: np.ndarray, higher_is_better: bool, threshold: float,
                   alpha: float) -> Change:
    """Compares per-process values (positive) and decides where the change lies against the threshold."""
    found = intervals.shift(baseline, candidate, alpha)
    if found.high < 0 and found.estimate < -threshold:
        decision = "down"
    elif found.low > 0 and found.estimate > threshold:
        decision = "up"
    elif -threshold < found.low and found.high < threshold:
        decision = "same"
    else:
        decision = "undecided"
    worse = found.estimate < 0 if higher_is_better else found.estimate > 0
    return Change(float(np.median(baseline)), float(np.median(candidate)), found.estimate, found.low, found.high,
                  found.confidence, found.p_value, decision, worse, found.n_baseline, found.n_candidate,
                  intervals.log_spread(baseline, candidate))


def judge_point(candidate: pd.DataFrame, baseline: pd.DataFrame, threshold: float, alpha: float) -> PointVerdict:
    """The verdict on two sets of ok samples (rows of `Store.samples()`), contended repeats left out."""
    cand, base = quiet(candidate), quiet(baseline)
    contended = (len(baseline) - len(base), len(candidate) - len(cand))
    verdict = PointVerdict("", "", "inconclusive", contended=contended)
    fewest = intervals.fewest_repeats(alpha)
    if len(cand) < 2 or len(base) < 2:
        verdict.reason = few_repeats_reason(len(base), len(cand), fewest, contended)
        verdict.repeats_needed = fewest
        return verdict
    sps = compare_values(base["sps"].to_numpy(float), cand["sps"].to_numpy(float), True, threshold, alpha)
    verdict.sps = sps
    verdict.detectable = intervals.detectable_change(sps.spread, len(base), len(cand), threshold, alpha)
    verdict.status = {"down": "regressed", "up": "improved", "same": "unchanged"}.get(sps.decision, "inconclusive")
    if verdict.status == "inconclusive":
        if min(len(base), len(cand)) < fewest:
            verdict.reason = few_repeats_reason(len(base), len(cand), fewest, contended)
            verdict.repeats_needed = fewest
        else:
            verdict.repeats_needed = intervals.repeats_to_decide(sps.spread, sps.relative, threshold, alpha)
            verdict.reason = straddle_reason(sps, threshold, verdict.repeats_needed, contended)
    elif any(contended):
        verdict.reason = contended_text(contended)
    verdict.phases_grew, verdict.phases_shrank = phase_changes(cand, base, sps, threshold, alpha)
    return verdict


def phase_changes(cand: pd.DataFrame, base: pd.DataFrame, sps: Change, threshold: float, alpha: float):
    """Phases whose time per step grew or shrank beyond the threshold, largest first. A growth under
    MIN_PHASE_GROWTH_SHARE of the baseline's step is left out: it explains nothing."""
    step_seconds = 1.0 / sps.baseline if sps.baseline else 0.0
    grew, shrank = [], []
    names = [p for p in (*PHASES, OTHER) if any(p in phases for phases in pd.concat([cand, base])["phases"])]
    for phase in names:
        before, after = phase_per_step(base, phase), phase_per_step(cand, phase)
        if (before <= 0).any() or (after <= 0).any():
            continue
        change = compare_values(before, after, False, threshold, alpha)
        if change.decision == "up" and change.candidate - change.baseline >= MIN_PHASE_GROWTH_SHARE * step_seconds:
            grew.append((phase, change))
        elif change.decision == "down":
            shrank.append((phase, change))
    grew.sort(key=lambda item: item[1].baseline - item[1].candidate)
    shrank.sort(key=lambda item: item[1].candidate - item[1].baseline)
    return grew, shrank


def contended_text(contended: tuple[int, int]) -> str:
    return f"left out contended repeats: {contended[0]} of the baseline's, {contended[1]} of this run's"


def few_repeats_reason(n: int, m: int, fewest: int, contended: tuple[int, int]) -> str:
    which = "quiet repeats" if any(contended) else "repeats"
    text = f"too few {which}: {n} against {m} cannot reach the confidence asked for (at least {fewest} a side)"
    return text + (f"; {contended_text(contended)}" if any(contended) else "")


def straddle_reason(sps: Change, threshold: float, needed: int | None, contended: tuple[int, int]) -> str:
    text = (f"noise: the interval {fmt_interval(sps)} neither excludes no change beyond ±{threshold:.0%} nor "
            f"fits within it; "
            + (f"about {needed} repeats a side would likely decide it" if needed
               else "the change sits on the threshold, and no practical number of repeats decides it"))
    return text + (f"; {contended_text(contended)}" if any(contended) else "")


def fmt_interval(change: Change) -> str:
    low = "−∞" if change.low <= -1 else f"{change.low:+.1%}"
    high = "+∞" if math.isinf(change.high) else f"{change.high:+.1%}"
    return f"[{low}, {high}]"


def judge(candidate_points: pd.DataFrame, candidate_samples: pd.DataFrame, baseline_points: pd.DataFrame,
          baseline_samples: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD,
          alpha: float = DEFAULT_ALPHA) -> list[PointVerdict]:
    """One verdict per point of either run, matched by configuration, in the candidate's order; claims are
    then weighed together across points (Benjamini-Hochberg)."""
    verdicts = match_points(candidate_points, candidate_samples, baseline_points, baseline_samples,
                            lambda cand, base: judge_point(cand, base, threshold, alpha))
    weigh_claims(verdicts, alpha, threshold)
    return verdicts


def judge_pairs(candidate_points: pd.DataFrame, candidate_samples: pd.DataFrame, baseline_points: pd.DataFrame,
                baseline_samples: pd.DataFrame, design: sequential.Design) -> list[PointVerdict]:
    """One verdict per point of two runs measured in pairs, by their stored design: its alpha is already each
    point's share of the run's, so claims need no weighing together afterwards."""
    return match_points(candidate_points, candidate_samples, baseline_points, baseline_samples,
                        lambda cand, base: judge_pair_point(cand, base, design, ended=True))


def match_points(candidate_points: pd.DataFrame, candidate_samples: pd.DataFrame, baseline_points: pd.DataFrame,
                 baseline_samples: pd.DataFrame, judge_one) -> list[PointVerdict]:
    """Points of either run matched by configuration, in the candidate's order: `missing`, `failed` or `new`
    where they cannot be compared, else `judge_one(candidate rows, baseline rows)`."""
    candidates = _by_match_key(candidate_points)
    baselines = _by_match_key(baseline_points)
    verdicts = []
    for key in list(candidates) + [key for key in baselines if key not in candidates]:
        cand, base = candidates.get(key), baselines.get(key)
        label = point_label((cand if cand is not None else base)["point_key"])
        if cand is None or cand["status"] == "skipped":
            reason = "not in this run" if cand is None else f"skipped: {cand['reason'] or 'no reason given'}"
            verdicts.append(PointVerdict(key, label, "missing", reason))
            continue
        cand_rows = candidate_samples[candidate_samples["point_key"] == cand["point_key"]]
        if cand["status"] != "ok" or cand_rows.empty:
            reason = f"{cand['status']}: {cand['reason'] or 'no reason given'}" if cand["status"] != "ok" \
                else "no samples stored"
            verdicts.append(PointVerdict(key, label, "failed", reason))
            continue
        base_rows = None if base is None else baseline_samples[baseline_samples["point_key"] == base["point_key"]]
        if base is None or base["status"] != "ok" or base_rows.empty:
            reason = "not in the baseline" if base is None else f"baseline point {base['status']}"
            verdicts.append(PointVerdict(key, label, "new", reason))
            continue
        verdict = judge_one(cand_rows, base_rows)
        verdict.match_key, verdict.point = key, label
        verdicts.append(verdict)
    return verdicts


# ---- pairs ---------------------------------------------------------------------------------------------------

def pairs_of(candidate: pd.DataFrame, baseline: pd.DataFrame) -> pd.DataFrame:
    """The pairs of two sides' samples, in the order measured (a pair is the repeat index both share): ref and
    new SPS, and whether each process was contended."""
    ref = {repeat: (sps, is_contended(summary))
           for repeat, sps, summary in zip(baseline["repeat"], baseline["sps"], baseline["summary"])}
    rows = sorted((repeat, ref[repeat][0], sps, ref[repeat][1], is_contended(summary))
                  for repeat, sps, summary in zip(candidate["repeat"], candidate["sps"], candidate["summary"])
                  if repeat in ref)
    return pd.DataFrame(rows, columns=["repeat", "sps_ref", "sps_new", "contended_ref", "contended_new"])


def contention_note(pairs: pd.DataFrame) -> str:
    """Which side contention fell on, when it fell: pairs with one side contended are discordant, and an exact
    binomial (McNemar) test says whether one side drew more of them than chance allows at 5%. A change that
    itself loads the machine (more threads, a busy helper) would show up this way."""
    ref_only = int((pairs["contended_ref"] & ~pairs["contended_new"]).sum())
    new_only = int((pairs["contended_new"] & ~pairs["contended_ref"]).sum())
    both = int((pairs["contended_ref"] & pairs["contended_new"]).sum())
    if not ref_only + new_only + both:
        return ""
    left_out = ref_only + new_only + both
    text = f"left out {left_out} contended pair{'s' if left_out != 1 else ''} (baseline side {ref_only + both}, " \
           f"this run's {new_only + both})"
    if ref_only + new_only and stats.binomtest(new_only, ref_only + new_only).pvalue < 0.05:
        busier = "this run's" if new_only > ref_only else "the baseline's"
        text += f"; {busier} side was contended more often than chance allows: the change may load the machine"
    return text


def judge_pair_point(candidate: pd.DataFrame, baseline: pd.DataFrame, design: sequential.Design,
                     ended: bool) -> PointVerdict:
    """The verdict on one point's pairs by `design`; `ended` when no more pairs will come."""
    pairs = pairs_of(candidate, baseline)
    quiet_pairs = pairs[~pairs["contended_ref"] & ~pairs["contended_new"]]
    ref, new = quiet_pairs["sps_ref"].to_numpy(float), quiet_pairs["sps_new"].to_numpy(float)
    decision = sequential.decide(design, np.log(new) - np.log(ref), ended=ended)
    status = "inconclusive" if decision.status == "running" else decision.status
    verdict = PointVerdict("", "", status, decision=decision,
                           contended=(int(pairs["contended_ref"].sum()), int(pairs["contended_new"].sum())))
    notes = [contention_note(pairs)]
    if len(ref):
        kind = {"regressed": "down", "improved": "up", "unchanged": "same", "not slower": "same"}
        verdict.sps = Change(float(np.median(ref)), float(np.median(new)), decision.estimate, decision.low,
                             decision.high, decision.confidence, decision.p_value, kind.get(status, "undecided"),
                             decision.estimate < 0, len(ref), len(new), decision.spread)
    if len(ref) and decision.stopped:  # what a finished point could detect, and which phases moved
        verdict.detectable = sequential.detectable(design, decision.spread)
        cand_quiet = candidate[candidate["repeat"].isin(quiet_pairs["repeat"])]
        base_quiet = baseline[baseline["repeat"].isin(quiet_pairs["repeat"])]
        verdict.phases_grew, verdict.phases_shrank = phase_changes(cand_quiet, base_quiet, verdict.sps,
                                                                   design.threshold, design.alpha)
        if decision.stopped and status != "inconclusive":
            notes.insert(0, f"decided after {decision.look} quiet pairs (estimate corrected for stopping there; "
                            f"plain {decision.naive:+.1%})")
    notes.insert(0, decision.reason)
    verdict.reason = "; ".join(note for note in notes if note)
    return verdict


def weigh_claims(verdicts: list[PointVerdict], alpha: float, threshold: float = DEFAULT_THRESHOLD) -> None:
    """Demotes the regressed/improved claims that do not survive Benjamini-Hochberg over every compared point,
    and says what each point can detect at the level a lone regression among them must reach."""
    compared = [v for v in verdicts if v.sps is not None]
    if len(compared) < 2:
        return
    for verdict in compared:
        verdict.detectable = intervals.detectable_change(verdict.sps.spread, verdict.sps.n_baseline,
                                                         verdict.sps.n_candidate, threshold, alpha / len(compared))
    adjusted = stats.false_discovery_control([v.sps.p_value for v in compared], method="bh")
    for verdict, p in zip(compared, adjusted):
        if verdict.status in ("regressed", "improved") and p > alpha:
            verdict.reason = (f"{verdict.status} alone (p={verdict.sps.p_value:.2g}), but not once the "
                              f"{len(compared)} points are weighed together (Benjamini-Hochberg p={p:.2g})")
            verdict.status = "inconclusive"


def _by_match_key(points: pd.DataFrame) -> dict[str, pd.Series]:
    return {match_key(row["point_key"], row["config"]): row for _, row in points.iterrows()}


def tally(verdicts: list[PointVerdict]) -> dict[str, int]:
    return {status: sum(v.status == status for v in verdicts) for status in STATUSES}


def exit_code(verdicts: list[PointVerdict], fail_on_inconclusive: bool = False) -> int:
    failing = ("regressed", "inconclusive") if fail_on_inconclusive else ("regressed",)
    return 1 if any(v.status in failing for v in verdicts) else 0
