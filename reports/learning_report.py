"""The report's learning sections: SPS beside time to solve per point, the Pareto chart of cost against score,
what each knob did to learning ("faster, learns worse" named first), and, against a baseline, the points whose
time to solve changed, those that got faster but learn worse first. The statistics are decisions/learning.py's."""

from __future__ import annotations

import numpy as np
import pandas as pd

from reports import figures
from reports.formatting import fmt_sps
from decisions.learning import (FASTER_LEARNS_WORSE, LEARNING_THRESHOLD, LearningVerdict, fmt_median, fmt_share,
                              fmt_solve_change, fmt_time, judge_all, judge_learning, reading, summarize_learning)
from reports.page import Section
from decisions.rundata import RunData, knob_pairs
from decisions.verdicts import PointVerdict, judge_point
from rlperf.store import point_label

COSTS = {"seconds": "seconds to solve (end to end)", "steps": "agent steps to solve"}


def rule_text(alpha: float) -> str:
    return (f"Time to solve is judged with survival statistics, since a repeat that never solved has only a lower "
            f"bound: medians are Kaplan-Meier medians with {1 - alpha:.0%} intervals ('not reached' when fewer than "
            f"half the repeats are known to have solved), the share solved has its exact {1 - alpha:.0%} interval, "
            f"and a change of time to solve (end to end, the ratio of the medians) is regressed or improved when "
            f"the log-rank test rejects no change at {alpha:g} and the ratio lies beyond ±{LEARNING_THRESHOLD:.0%}, "
            f"unchanged when its interval (every factor on the candidate's times the log-rank test accepts) lies "
            f"within ±{LEARNING_THRESHOLD:.0%}, inconclusive otherwise. Contended repeats are left out of these "
            f"verdicts. Repeats of a point with a target train with seeds seed, seed + 1, ...")


def learning_section(run: RunData, table: pd.DataFrame, alpha: float) -> Section | None:
    learned = summarize_learning(run.points, run.samples, alpha)
    if not learned:
        return None
    sps = dict(zip(table["point_key"], table["sps_median"]))
    rows, chart = [], []
    for point in learned:
        seconds, steady, steps = (point.medians[metric] for metric in ("seconds", "steady_seconds", "steps"))
        rows.append({
            "point": point.label, "SPS (median)": fmt_sps(sps.get(point.point_key, np.nan)),
            "target": f"{point.target_return:g} over {point.window} episodes", "solved": fmt_share(point.share),
            "time to solve": fmt_median(seconds, "seconds"), "at steady speed": fmt_median(steady, "seconds"),
            "steps to solve": fmt_median(steps, "steps"),
            "final return": "–" if not np.isfinite(point.final_return) else f"{point.final_return:.3g}",
        })
        chart.append({"label": point.label, "final_return": point.final_return,
                      **{f"{cost}{part}": getattr(point.medians[cost], attribute)
                         for cost in COSTS for part, attribute in (("", "value"), ("_low", "low"), ("_high", "high"))},
                      **{f"{cost}_budget": point.budget[cost] for cost in COSTS}})
    text = ["SPS says how fast the trainer runs; time to solve says how soon it learns: the agent steps and seconds "
            "at which a repeat's smoothed episode return first reached the point's target (end to end from the "
            "trainer's start, and at its steady speed: steps / SPS). 'solved': repeats that reached the target "
            "within the budget (total_steps). 'final return': the return at the end of the run, median of repeats.",
            rule_text(alpha),
            "The charts put each point's cost of solving against its final score: the ringed points, joined, are "
            "those no other point beats on both; a triangle marks a point fewer than half of whose repeats solved, "
            "drawn at its budget (its cost lies beyond)."]
    return Section("Learning: time to solve", text, [pd.DataFrame(rows)],
                   [figures.pareto(pd.DataFrame(chart), COSTS)])


def knob_learning_section(run: RunData, threshold: float, alpha: float) -> Section | None:
    """Each point against the point that sets only some of its values (as 'What each knob changed' pairs
    them), in SPS and in time to solve; the knobs that are faster but learn worse are named first."""
    rows = []
    for knobs, reference, mine, theirs in knob_pairs(run):
        learning = judge_learning(mine, theirs, alpha=alpha)
        if learning is not None:
            rows.append(_row(knobs, point_label(reference), judge_point(mine, theirs, threshold, alpha), learning))
    if not rows:
        return None
    frame, worse = faster_but_worse_first(rows)
    headline = (f"Faster, but learns worse: {', '.join(worse)}. These knobs raise SPS and still take longer to solve "
                "(or solve less often) than the point they are compared with." if worse else
                "No knob is faster in SPS and slower to solve at once.")
    text = [headline, "Each point is compared with the point of this run that sets only some of its values: SPS by "
            "the SPS verdicts' rule, time to solve by the rule in 'Learning: time to solve'."]
    return Section("What each knob did to learning", text, [frame])


def baseline_learning_section(candidate: RunData, baseline: RunData, sps_verdicts: list[PointVerdict],
                              alpha: float) -> tuple[Section | None, list[LearningVerdict]]:
    """Time to solve against the baseline, per point measured in both with a target; points whose SPS improved
    while their time to solve regressed come first, and the section's first line names them."""
    verdicts = judge_all(candidate.points, candidate.samples, baseline.points, baseline.samples, alpha=alpha)
    if not verdicts:
        return None, verdicts
    sps_by_key = {verdict.match_key: verdict for verdict in sps_verdicts}
    frame, worse = faster_but_worse_first([_row(v.point, "the baseline", sps_by_key.get(v.match_key), v)
                                           for v in verdicts])
    headline = (f"SPS improved while time to solve regressed: {', '.join(worse)}. Faster, learns worse: the speed "
                "was bought with learning." if worse else
                "No point got faster in SPS while its time to solve regressed.")
    text = [headline, rule_text(alpha) + " Claims are weighed together over the points (Benjamini-Hochberg)."]
    frame = frame.rename(columns={"knobs": "point"}).drop(columns=["compared with"])
    return Section("Time to solve against the baseline", text, [frame]), verdicts


def faster_but_worse_first(rows: list[dict]) -> tuple[pd.DataFrame, list[str]]:
    """The rows as a table, those read FASTER_LEARNS_WORSE first (in their order), and those rows' knobs."""
    frame = pd.DataFrame(rows).sort_values("reading", key=lambda col: col != FASTER_LEARNS_WORSE, kind="stable")
    return frame, list(frame.loc[frame["reading"] == FASTER_LEARNS_WORSE, "knobs"])


def _row(knobs: str, compared_with: str, sps: PointVerdict | None, learning: LearningVerdict) -> dict:
    change, shares = learning.change, learning.shares
    sps_status = sps.status if sps is not None else None
    return {
        "knobs": knobs, "compared with": compared_with, "reading": reading(sps_status, learning.status),
        "SPS": sps_status or "–",
        "SPS change": f"{sps.sps.relative:+.1%}" if sps is not None and sps.sps is not None else "–",
        "time to solve": learning.status,
        "median time to solve": (f"{fmt_time(change.baseline.value, 'seconds')} → "
                                 f"{fmt_time(change.candidate.value, 'seconds')}") if change else "–",
        "change (interval)": fmt_solve_change(change),
        "log-rank p": f"{change.p_value:.2g}" if change else "–",
        "solved": f"{shares[0].solved}/{shares[0].n} → {shares[1].solved}/{shares[1].n}" if shares else "–",
        "note": learning.reason,
    }
