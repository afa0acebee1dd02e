"""Reading and writing gzip'd Chrome traces as torch.profiler (Kineto) exports them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from rlperf.errors import BadInput, written_whole

# Kineto categories of device activity, and of the host calls that feed the device
GPU_ACTIVITY_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_RANGE_CATEGORY = "user_annotation"
DEVICE_RANGE_CATEGORY = "gpu_user_annotation"
PROFILER_STEP_PREFIX = "ProfilerStep#"


def load(path: str | Path) -> dict:
    """The trace object; BadInput naming the file when it is not a readable Chrome trace."""
    path = Path(path)
    try:
        with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
            trace = json.load(f)
    except (OSError, EOFError, ValueError) as exc:
        raise BadInput(f"trace: {path} is not a readable Chrome trace ({exc})") from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise BadInput(f"trace: {path} has no traceEvents list (not a Chrome trace)")
    return trace


def save(trace: dict, path: str | Path) -> None:
    """Writes gzip'd JSON through a temporary file, so a reader never sees half a trace."""
    with written_whole(path) as partial, gzip.open(partial, "wt", compresslevel=6) as f:
        json.dump(trace, f, separators=(",", ":"))


def complete_events(trace: dict, category: str | tuple[str, ...]) -> list[dict]:
    categories = (category,) if isinstance(category, str) else category
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in categories]


def profiler_steps(trace: dict) -> list[dict]:
    return [e for e in complete_events(trace, HOST_RANGE_CATEGORY) if e["name"].startswith(PROFILER_STEP_PREFIX)]


def numeric_pids(trace: dict) -> set[int]:
    return {e["pid"] for e in trace["traceEvents"] if isinstance(e.get("pid"), int)}
