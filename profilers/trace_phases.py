"""Each phase of one trace broken down: its host and device time, the CPU operators (by self time) and GPU kernels
that ran inside it, and its launches, synchronisations and copied bytes. A traced diff compares these phase by
phase (docs/profiling.md#traced-diffs).

An operator belongs to the phase whose host range holds its start; a kernel, a copy or a synchronisation to the
phase whose host range holds the host call that issued it (found by correlation id), what no phase holds to `other`.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from profilers import trace_events
from rlperf.summary import OTHER

# Host API calls that put work on the device; a CUDA graph replay counts once, like any launch, its prologue's
# fills apart.
LAUNCH_CALLS = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cuLaunchKernel",
    "cuLaunchKernelEx", "cudaGraphLaunch", "cuGraphLaunch",
})
# Host API calls that block the host until the device catches up. cudaMemcpy without Async always
# waits for the copy; `.item()` and `.cpu()` show up as cudaMemcpyAsync followed by cudaStreamSynchronize.
SYNC_CALLS = frozenset({
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D",
    "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
})
HOST_API_CATEGORIES = ("cuda_runtime", "cuda_driver")


class PhaseLocator:
    """Which of `names`' host ranges holds a host timestamp (phases do not nest); `other` where none does."""

    def __init__(self, trace: dict, names: tuple[str, ...]):
        self.ranges = sorted((e["ts"], e["ts"] + e["dur"], e["name"])
                             for e in trace_events.complete_events(trace, trace_events.HOST_RANGE_CATEGORY)
                             if e["name"] in names)
        self.starts = [start for start, _, _ in self.ranges]

    def __call__(self, ts: float) -> str:
        index = bisect.bisect_right(self.starts, ts) - 1
        return self.ranges[index][2] if index >= 0 and ts <= self.ranges[index][1] else OTHER


def operator_self_times(trace: dict) -> list[tuple[dict, float]]:
    """Every CPU operator with its self time (its time less that of the events nested in it on its thread), so
    that wrappers such as autograd's engine do not crowd out the operators that do the work."""
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for event in trace["traceEvents"]:
        if event.get("ph") == "X" and isinstance(event.get("pid"), int) and event.get("cat") not in (
            trace_events.GPU_ACTIVITY_CATEGORIES + (trace_events.DEVICE_RANGE_CATEGORY,)
        ):
            by_thread[(event["pid"], event["tid"])].append(event)
    found: list[tuple[dict, float]] = []
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_events: list[list] = []  # [event, time spent in its direct children]
        for event in events:
            while open_events and open_events[-1][0]["ts"] + open_events[-1][0]["dur"] <= event["ts"]:
                _close(open_events.pop(), found)
            if open_events:
                open_events[-1][1] += event["dur"]
            open_events.append([event, 0.0])
        while open_events:
            _close(open_events.pop(), found)
    return found


def _close(entry: list, found: list) -> None:
    event, children_us = entry
    if event.get("cat") == "cpu_op":
        found.append((event, max(event["dur"] - children_us, 0.0)))


def phase_breakdown(trace: dict, phases: tuple[str, ...], device_ranges: bool) -> dict[str, dict]:
    """Per phase (and `other`): `host_us`, `device_us` (None without device ranges), `operators` and `kernels`
    ({name: [us, calls]}), `launches`, `syncs` and `copy_bytes`. A phase's range time is summed over its
    ranges; operators and kernels that ran in no phase land in `other`."""
    locate = PhaseLocator(trace, phases)
    names = (*phases, *([OTHER] if OTHER not in phases else []))
    breakdown = {name: {"host_us": 0.0, "device_us": 0.0 if device_ranges else None, "operators": {}, "kernels": {},
                        "launches": 0, "syncs": 0, "copy_bytes": 0} for name in names}

    def entry(name: str) -> dict:
        return breakdown[name if name in breakdown else OTHER]

    for category, key in ((trace_events.HOST_RANGE_CATEGORY, "host_us"),
                          (trace_events.DEVICE_RANGE_CATEGORY, "device_us")):
        for event in trace_events.complete_events(trace, category):
            if event["name"] in phases and (key == "host_us" or device_ranges):
                breakdown[event["name"]][key] += event["dur"]
    for event, self_us in operator_self_times(trace):
        _add(entry(locate(event["ts"]))["operators"], event["name"], self_us)
    phase_of_call = {}
    for call in trace_events.complete_events(trace, HOST_API_CATEGORIES):
        phase = locate(call["ts"])
        phase_of_call[call.get("args", {}).get("correlation")] = phase
        entry(phase)["launches"] += call["name"] in LAUNCH_CALLS
        entry(phase)["syncs"] += call["name"] in SYNC_CALLS
    for event in trace_events.complete_events(trace, trace_events.GPU_ACTIVITY_CATEGORIES):
        owner = entry(phase_of_call.get(event.get("args", {}).get("correlation"), OTHER))
        if event.get("cat") == "kernel":
            _add(owner["kernels"], event["name"], event["dur"])
        elif event.get("cat") == "gpu_memcpy":
            owner["copy_bytes"] += int(event.get("args", {}).get("bytes", 0))
    for phase in breakdown.values():
        for table in (phase["operators"], phase["kernels"]):
            for figures in table.values():
                figures[0] = round(figures[0], 3)
    return breakdown


def _add(table: dict, name: str, us: float) -> None:
    figures = table.setdefault(name, [0.0, 0])
    figures[0] += us
    figures[1] += 1
