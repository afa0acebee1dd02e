"""A delay that is work, not a sleep: what `rlperf selfcheck` injects into a phase."""

from __future__ import annotations

import time


def spin(seconds: float) -> None:
    """Keeps the CPU busy for `seconds`. On a VM the work right after a sleep runs slower (measured here: 19% for
    10 ms after a 150 ms sleep), so a slept delay would make its phase take more than the delay."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
