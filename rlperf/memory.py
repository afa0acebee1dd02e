"""Peak memory of a run: the summary's `memory` field (docs/results-format.md), read where the writers already stop.

The host's figure is the process's peak resident set (its own, not its env workers'). A device's figures are the
CUDA caching allocator's peak counters, which live on the host: reading or resetting them never waits for the GPU.
Importing this module does not import torch.
"""

from __future__ import annotations

import resource
import sys
from typing import Any

HOST_KEY = "host_peak_rss_bytes"
DEVICE_KEYS = ("device_peak_allocated_bytes", "device_peak_reserved_bytes")


def host_peak_rss_bytes() -> int:
    """The process's peak resident set size so far, in bytes (Linux reports kibibytes, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def device_peaks(device: Any) -> tuple[int, int]:
    """The allocator's peak allocated and reserved bytes on a CUDA `device` since its peaks were last reset. The
    nested dict, not `max_memory_allocated`, which flattens every counter into strings on each call."""
    import torch

    stats = torch.cuda.memory_stats_as_nested_dict(device)
    if not stats:  # no allocation yet on this device
        return 0, 0
    return int(stats["allocated_bytes"]["all"]["peak"]), int(stats["reserved_bytes"]["all"]["peak"])


def reset_device_peaks(device: Any) -> None:
    import torch

    torch.cuda.reset_peak_memory_stats(device)


def fold_peaks(into: dict[str, list[int]], phase: str, peaks: tuple[int, int]) -> None:
    """Keeps in `into[phase]` the larger of its [allocated, reserved] peaks and `peaks`."""
    held = into.setdefault(phase, [0, 0])
    held[0], held[1] = max(held[0], peaks[0]), max(held[1], peaks[1])


def memory_record(host_peak: int, device: tuple[int, int] | None = None,
                  phases: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """The summary's `memory` object: device figures None off CUDA, per-phase ones None where not measured."""
    return {
        HOST_KEY: int(host_peak),
        DEVICE_KEYS[0]: None if device is None else int(device[0]),
        DEVICE_KEYS[1]: None if device is None else int(device[1]),
        "phases": None if not phases else {name: dict(zip(DEVICE_KEYS, map(int, peaks)))
                                           for name, peaks in phases.items()},
    }


def memory_problem(memory: Any) -> str | None:
    """What is wrong with a summary's `memory` value, in a few words naming the key; None when it is well formed
    (or absent: not measured)."""
    if memory is None:
        return None
    if not isinstance(memory, dict):
        return f"must be an object or null, not {type(memory).__name__}"
    if not is_bytes(memory.get(HOST_KEY)):
        return f"{HOST_KEY} must be a whole number of bytes, 0 or more"
    for key in DEVICE_KEYS:
        if memory.get(key) is not None and not is_bytes(memory[key]):
            return f"{key} must be a whole number of bytes, 0 or more, or null"
    phases = memory.get("phases")
    if phases is None:
        return None
    if not isinstance(phases, dict):
        return "phases must map phase names to their device peaks, or be null"
    for name, peaks in phases.items():
        if not isinstance(peaks, dict) or not all(is_bytes(peaks.get(key)) for key in DEVICE_KEYS):
            return f"phases.{name} must hold {' and '.join(DEVICE_KEYS)} as whole numbers of bytes"
    return None


def is_bytes(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0

