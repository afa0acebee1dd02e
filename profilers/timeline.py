"""Puts utilization samples and the trainer's phase timeline into its torch.profiler trace, on the trace's clock.

Kineto writes event times in microseconds since `baseTimeNanoseconds` (unix time), so a unix-ns reading t
lands at (t - base) / 1000. The trainer's `timeline` was taken with the same unix clock as the samples, and
its phases are also named ranges in the trace: comparing the two checks the conversion. If they disagree
by more than CLOCK_TOLERANCE_US (an exporter without a usable base), the measured offset is applied
instead and the check says so.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from profilers import trace_events
from profilers.sampler import Row

CLOCK_TOLERANCE_US = 1000.0
PHASE_TRACK_NAME = "phases (trainer timeline)"


def clock_check(trace: dict, timeline: list) -> dict:
    """Compares each timeline phase start with the start of the same range in the trace (the n-th range of a
    phase with its n-th timeline entry) under the base conversion."""
    base_ns = trace.get("baseTimeNanoseconds", 0)
    ranges: dict[str, list[float]] = defaultdict(list)
    for event in sorted(trace_events.complete_events(trace, trace_events.HOST_RANGE_CATEGORY), key=lambda e: e["ts"]):
        ranges[event["name"]].append(event["ts"])
    marks: dict[str, list[int]] = defaultdict(list)
    for phase, start_ns, _ in sorted(timeline, key=lambda mark: mark[1]):
        marks[phase].append(start_ns)
    offsets_us = [
        ts - (start_ns - base_ns) / 1000.0
        for phase, starts in marks.items()
        if len(ranges[phase]) == len(starts)
        for ts, start_ns in zip(ranges[phase], starts)
    ]
    if not offsets_us:
        return {"matched_ranges": 0, "median_offset_us": None, "max_abs_offset_us": None, "corrected": False}
    median = statistics.median(offsets_us)
    return {
        "matched_ranges": len(offsets_us),
        "median_offset_us": round(median, 3),
        "max_abs_offset_us": round(max(abs(o) for o in offsets_us), 3),
        "corrected": abs(median) > CLOCK_TOLERANCE_US,
    }


def merge_timeline(trace_path: str | Path, rows: list[Row], timeline: list, margin_s: float = 0.0) -> dict:
    """Adds counter tracks (one process per sample source) and a phase track to the trace, in place.

    Samples are kept over the trace's span plus `margin_s` each side, and the last sample before it and
    the first after it, so each counter has a value across the whole window. Returns the clock check.
    """
    trace = trace_events.load(trace_path)
    check = clock_check(trace, timeline)
    base_ns = trace.get("baseTimeNanoseconds", 0)
    shift_us = check["median_offset_us"] if check["corrected"] else 0.0

    def to_ts(unix_ns: int) -> float:
        return round((unix_ns - base_ns) / 1000.0 + shift_us, 3)

    activity = [e for e in trace["traceEvents"] if e.get("ph") == "X" and isinstance(e.get("pid"), int)]
    first_us = min(e["ts"] for e in activity)
    last_us = max(e["ts"] + e["dur"] for e in activity)
    margin_us = margin_s * 1e6
    next_pid = max(trace_events.numeric_pids(trace), default=0) + 1
    added: list[dict] = []

    series: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for t_ns, source, metric, value in sorted(rows):
        series[source][metric].append((to_ts(t_ns), value))
    for sort_index, source in enumerate(sorted(series, key=lambda s: (s == "cpu", s))):
        pid = next_pid
        next_pid += 1
        added += _process_metadata(pid, _source_label(source), 1_000_000 + sort_index)
        for metric, points in series[source].items():
            for ts, value in _window(points, first_us - margin_us, last_us + margin_us):
                added.append({"ph": "C", "name": metric, "pid": pid, "tid": 0, "ts": ts, "args": {"value": value}})

    if timeline:
        pid = next_pid
        added += _process_metadata(pid, PHASE_TRACK_NAME, 999_999)
        added.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "phase"}})
        for phase, start_ns, end_ns in timeline:
            start = to_ts(start_ns)
            added.append({"ph": "X", "cat": "rlperf_phase", "name": phase, "pid": pid, "tid": 0, "ts": start,
                          "dur": round(to_ts(end_ns) - start, 3)})

    trace["traceEvents"].extend(added)
    trace_events.save(trace, trace_path)
    return check


def _window(points: list[tuple[float, float]], start_us: float, end_us: float) -> list[tuple[float, float]]:
    before = [p for p in points if p[0] < start_us][-1:]
    inside = [p for p in points if start_us <= p[0] <= end_us]
    after = [p for p in points if p[0] > end_us][:1]
    return before + inside + after


def _source_label(source: str) -> str:
    if source == "cpu":
        return "host CPU and RAM (psutil)"
    return f"NVML {source.removeprefix('gpu:')}"


def _process_metadata(pid: int, name: str, sort_index: int) -> list[dict]:
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort_index}},
    ]
