"""When a change counts: defaults and checks shared by the command line and the verdicts, kept free of heavy
imports so that `rlperf report --help` stays fast."""

from __future__ import annotations

from rlperf.errors import BadInput

# 5% is the smallest slowdown worth a person's time on a nightly run; smaller drifts are within what one
# machine does from day to day.
DEFAULT_THRESHOLD = 0.05
# One minus the confidence of every interval, and so the most often an unchanged point can be called
# regressed or improved (a claim needs an interval that excludes no change); across the points of a run,
# claims are weighed together (Benjamini-Hochberg) at this level. 1% keeps a nightly job's false alarms rare.
DEFAULT_ALPHA = 0.01


def check_criteria(threshold: float, alpha: float) -> None:
    if not 0 <= threshold < 10:
        raise BadInput(f"threshold: a relative change such as 0.05 for 5% (got {threshold})")
    if not 0 < alpha < 1:
        raise BadInput(f"alpha: a significance level between 0 and 1 such as 0.01 (got {alpha})")
