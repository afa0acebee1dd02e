"""Cuts a Kineto trace down to what the trace summary's GPU analysis reads, so a failing trace can be kept as
test data under 1 MB: `python tests/data/trim_trace.py IN.json.gz OUT.json.gz`.

Kept: metadata, the profiler steps and phase ranges on both timelines, every device activity (kernels,
copies, memsets: HTA's breakdowns) and the host calls that launch or wait for them (the summary's counts).
Dropped: host operators, flow arrows and counter tracks, which neither HTA's breakdowns nor the device
counts read. Timestamps and durations are kept exactly, since the sub-microsecond kernels are the point.
"""

import sys

from profilers import trace_events
from profilers.trace_summary import HOST_API_CATEGORIES

KEPT_CATEGORIES = (trace_events.HOST_RANGE_CATEGORY, trace_events.DEVICE_RANGE_CATEGORY,
                   *trace_events.GPU_ACTIVITY_CATEGORIES, *HOST_API_CATEGORIES)


def trim(trace: dict) -> dict:
    events = [e for e in trace["traceEvents"]
              if e.get("ph") == "M" or (e.get("ph") == "X" and e.get("cat") in KEPT_CATEGORIES)]
    for event in events:
        # flow ids and external ids tie host operators to launches; without the operators they point nowhere
        for key in ("External id", "Sequence number", "Fwd thread id", "Record function id", "Ev Idx"):
            event.get("args", {}).pop(key, None)
    return {**trace, "traceEvents": events}


if __name__ == "__main__":
    source, target = sys.argv[1:3]
    trace_events.save(trim(trace_events.load(source)), target)
