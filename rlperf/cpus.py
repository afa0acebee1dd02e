"""How many cores this process may use: its CPU affinity, capped by a cgroup CPU quota.

Both limits are common on CI runners and containers, and torch's default thread count honours only the first:
under `docker run --cpus=1` on a 2-core host it would start two spinning OpenMP threads on one core's worth of
time, which is the oversubscription that makes a trainer many times slower.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_V2_QUOTA = Path("/sys/fs/cgroup/cpu.max")


def usable_cores() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else cores


def cgroup_quota(path: Path = CGROUP_V2_QUOTA) -> float | None:
    """Cores' worth of CPU time the cgroup may use per second; None when unlimited or unknown."""
    try:
        limit, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if limit == "max" else int(limit) / int(period)


def cpu_ranks_refusal(world_size: int) -> str | None:
    """Why `world_size` CPU ranks cannot all be started on this machine, or None when they can. Like mpirun
    without --oversubscribe: ranks beyond the cores time the scheduler, and each is a torch process of about
    320 MiB, so thousands of them exhaust the memory before any of them measures."""
    cores = usable_cores()
    if world_size <= cores:
        return None
    return f"{world_size} CPU ranks would share the {cores} cores this process may use (allowed: 1 to {cores})"
