"""Regression verdicts: did a point get slower, and which phase grew.

A change counts only when it is both large (the median over repeats moved by more than `threshold`) and
real (a two-sided Mann-Whitney U test on the samples gives p < `alpha`, moving the same way). Steps per second: higher is better. Phase times,
taken as seconds per agent step so runs of different lengths compare: lower is better.

Which samples are tested: a repeat (one trainer process) is the honest unit, because run-to-run noise only
shows between processes. But an exact two-sided test of n against m values cannot go below
2 / C(n+m, n): 0.1 for 3 against 3, so three repeats can never be significant at any useful alpha. When
the repeats cannot reach `alpha`, the steady epochs of all repeats are pooled instead (each epoch's steps
per second and phase times); as epochs of one process share its luck, the change must then also show in
every repeat, and the size threshold guards against the rest of the noise that pooling hides.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from reference_trainer.config import PHASES
from reports.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
# A phase is named as a cause only if its growth is a visible part of the step: a 40% slower `log`
# phase that costs 0.1% of the step explains nothing.
MIN_PHASE_GROWTH_SHARE = 0.02
# Fields that change how a run is observed or deliberately perturbed, not what it computes: a traced
# or delay-injected run is still the same point.
NOT_MATCHED_FIELDS = ("inject_delay", "trace_dir", "trace_epochs")
STATUSES = ("regressed", "improved", "unchanged", "new", "missing", "failed")


@dataclass(frozen=True)
class Change:
    """One metric compared: `relative` is candidate/baseline - 1 of the per-repeat medians; the test ran on
    n_baseline and n_candidate values."""

    baseline: float
    candidate: float
    relative: float
    p_value: float
    worse: bool
    counts: bool
    n_baseline: int
    n_candidate: int


@dataclass
class PointVerdict:
    match_key: str
    point: str
    status: str
    reason: str = ""
    sps: Change | None = None
    unit: str = ""
    phases_grew: list[tuple[str, Change]] = field(default_factory=list)
    phases_shrank: list[tuple[str, Change]] = field(default_factory=list)


def match_key(point_key: str, config: dict, ignored: tuple[str, ...] = ()) -> str:
    """Identity of a point across runs: its swept values and its resolved configuration, less the fields
    that only change how it was observed (and any `ignored` ones). The swept values are part of it because
    two sweep blocks of one suite can resolve to the same configuration."""
    kept = {name: value for name, value in config.items() if name not in NOT_MATCHED_FIELDS + ignored}
    return json.dumps([json.loads(point_key), kept], sort_keys=True)


def point_label(point_key: str) -> str:
    """`num_envs=64, dtype=bf16` from the canonical JSON of the swept values."""
    values = json.loads(point_key) if point_key else {}
    if not values:
        return "default"
    return ", ".join(f"{name}={_plain(value)}" for name, value in values.items())


def _plain(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_plain(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def steady_epochs(summary: dict) -> list[dict]:
    return [epoch for epoch in summary.get("epochs") or [] if not epoch.get("warmup") and epoch.get("seconds")]


def sps_samples(samples: pd.DataFrame, unit: str) -> np.ndarray:
    if unit == "repeat":
        return samples["sps"].to_numpy(dtype=float)
    return np.array([epoch["steps"] / epoch["seconds"] for summary in samples["summary"]
                     for epoch in steady_epochs(summary)], dtype=float)


def phase_samples(samples: pd.DataFrame, unit: str, phase: str) -> np.ndarray:
    """Seconds per agent step spent in `phase`."""
    if unit == "repeat":
        return np.array([row.phases.get(phase, 0.0) / row.summary["steady_steps"]
                         for row in samples.itertuples()], dtype=float)
    return np.array([epoch["phases"].get(phase, 0.0) / epoch["steps"] for summary in samples["summary"]
                     for epoch in steady_epochs(summary)], dtype=float)


def smallest_p(n: int, m: int) -> float:
    """The smallest p an exact two-sided Mann-Whitney U test of n against m distinct values can give."""
    return 2.0 / math.comb(n + m, n)


def choose_unit(candidate: pd.DataFrame, baseline: pd.DataFrame, alpha: float) -> str:
    n, m = len(candidate), len(baseline)
    if smallest_p(n, m) <= alpha:
        return "repeat"
    if len(sps_samples(candidate, "epoch")) and len(sps_samples(baseline, "epoch")):
        return "epoch"
    return "repeat"


def compare_values(baseline: np.ndarray, candidate: np.ndarray, higher_is_better: bool, threshold: float,
                   alpha: float, tested: tuple[np.ndarray, np.ndarray] | None = None) -> Change:
    """The size of a change is read from the per-repeat values (the figures a report shows). The test runs on
    `tested` (baseline, candidate: pooled epochs) when given; the pooled samples must then move the same way,
    and every repeat must too (the two sides' repeats do not overlap), so that one slow process among
    epochs that share its state cannot make a change on its own."""
    base, cand = float(np.median(baseline)), float(np.median(candidate))
    relative = cand / base - 1.0 if base else (0.0 if cand == base else math.inf)
    tested_base, tested_cand = tested if tested is not None else (baseline, candidate)
    if len(tested_base) and len(tested_cand) and np.ptp(np.concatenate([tested_base, tested_cand])) > 0:
        p_value = float(stats.mannwhitneyu(tested_cand, tested_base, alternative="two-sided").pvalue)
        agrees = np.sign(np.median(tested_cand) - np.median(tested_base)) == np.sign(relative)
    else:
        p_value, agrees = 1.0, False
    if tested is not None:
        separated = candidate.max() < baseline.min() if relative < 0 else candidate.min() > baseline.max()
        agrees = agrees and separated
    worse = relative < 0 if higher_is_better else relative > 0
    counts = abs(relative) > threshold and p_value < alpha and bool(agrees)
    return Change(base, cand, relative, p_value, worse, counts, len(tested_base), len(tested_cand))


def judge_point(candidate: pd.DataFrame, baseline: pd.DataFrame, threshold: float, alpha: float) -> tuple:
    """(status, sps Change, unit, phases that grew, phases that shrank) for two sets of ok samples."""
    unit = choose_unit(candidate, baseline, alpha)
    sps = compare_values(sps_samples(baseline, "repeat"), sps_samples(candidate, "repeat"), True, threshold, alpha,
                         (sps_samples(baseline, unit), sps_samples(candidate, unit)))
    status = "unchanged" if not sps.counts else ("regressed" if sps.worse else "improved")
    baseline_step_seconds = 1.0 / sps.baseline if sps.baseline else 0.0
    grew, shrank = [], []
    names = [p for p in PHASES if any(p in phases for phases in pd.concat([candidate, baseline])["phases"])]
    for phase in names:
        change = compare_values(phase_samples(baseline, "repeat", phase), phase_samples(candidate, "repeat", phase),
                                False, threshold, alpha,
                                (phase_samples(baseline, unit, phase), phase_samples(candidate, unit, phase)))
        if not change.counts:
            continue
        if change.worse and change.candidate - change.baseline >= MIN_PHASE_GROWTH_SHARE * baseline_step_seconds:
            grew.append((phase, change))
        elif not change.worse:
            shrank.append((phase, change))
    grew.sort(key=lambda item: item[1].baseline - item[1].candidate)
    shrank.sort(key=lambda item: item[1].candidate - item[1].baseline)
    return status, sps, unit, grew, shrank


def judge(candidate_points: pd.DataFrame, candidate_samples: pd.DataFrame, baseline_points: pd.DataFrame,
          baseline_samples: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD,
          alpha: float = DEFAULT_ALPHA) -> list[PointVerdict]:
    """One verdict per point of either run, matched by configuration, in the candidate's order."""
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
        status, sps, unit, grew, shrank = judge_point(cand_rows, base_rows, threshold, alpha)
        verdicts.append(PointVerdict(key, label, status, "", sps, unit, grew, shrank))
    return verdicts


def _by_match_key(points: pd.DataFrame) -> dict[str, pd.Series]:
    return {match_key(row["point_key"], row["config"]): row for _, row in points.iterrows()}


def tally(verdicts: list[PointVerdict]) -> dict[str, int]:
    return {status: sum(v.status == status for v in verdicts) for status in STATUSES}


def exit_code(verdicts: list[PointVerdict]) -> int:
    return 1 if any(v.status == "regressed" for v in verdicts) else 0
