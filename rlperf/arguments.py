"""argparse types and limits shared by the commands, so one bad value reads the same everywhere."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

# A repeat longer than a day is a hung process, not a measurement; a sampler above 100 Hz measures itself
# (each NVML PCIe reading blocks 20 ms) and floods the store.
MAX_TIMEOUT_S = 86400.0
MAX_SAMPLE_HZ = 100.0
# --until-decided and bisect: at most this many pairs of processes per point, within this many seconds each.
# On two cores a small point's processes' SPS vary by about 12% and a pair takes about 14 s: 600 s reaches the
# design's last looks for such a point.
DEFAULT_MAX_REPEATS = 40
DEFAULT_BUDGET_S = 600.0


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of 1 or more (got {text!r})")
    return int(text)


def number_in(low: float, high: float, low_included: bool) -> Callable[[str], float]:
    """An argparse type for a number in [low, high] (or (low, high]); one message for every value outside."""
    allowed = f"{'from' if low_included else 'above'} {low:g}"
    if math.isfinite(high):
        allowed += f" {'to' if low_included else 'and at most'} {high:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (low <= value <= high) or (value == low and not low_included):
            raise argparse.ArgumentTypeError(f"must be a number {allowed} (got {text!r})")
        return value

    return parse


positive_float = number_in(0, math.inf, low_included=False)
