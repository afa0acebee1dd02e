"""What one torch.profiler trace of the trainer says: where the device and the host spent the traced epochs.

HTA gives a GPU trace's busy / idle time and kernel breakdown, read at the trace's own resolution (its rounding to
microseconds loses sub-microsecond kernels); counts, host ranges and copy bytes are read from the trace events, for
CPU traces too (docs/profiling.md#trace-summary).
"""

from __future__ import annotations

import logging
import os
import traceback
from collections import Counter, defaultdict
from contextlib import contextmanager
from pathlib import Path

from profilers import trace_events
from profilers.trace_phases import (HOST_API_CATEGORIES, LAUNCH_CALLS, SYNC_CALLS, PhaseLocator,
                                     operator_self_times, phase_breakdown)
from reference_trainer.config import GRAPH_PHASES, PHASES, from_dict
from rlperf.summary import OTHER, PHASES as COMMAND_PHASES

TOP_N = 10
GRAPH_LAUNCH_CALLS = frozenset({"cudaGraphLaunch", "cuGraphLaunch"})
# A graph replay's prologue fills the generator's int64 seed and offset (CUDAGeneratorState::replay_prologue).
PROLOGUE_FILL_KERNEL = "FillFunctor<long>"
HTA_NS_ROUNDING_OFF = "HTA_DISABLE_NS_ROUNDING"


def summarize_trace(path: str | Path, run_summary: dict) -> dict:
    """Summary of the trace at `path`; `run_summary` is the trainer's --json summary of the same run (the
    reference trainer's, or a command's, whose traced epochs it marks `traced` and whose phases include
    `other`)."""
    path = Path(path)
    trace = trace_events.load(path)
    profiler_steps = trace_events.profiler_steps(trace)
    if run_summary.get("writer", "reference") == "reference":
        config = from_dict(run_summary["config"])
        # the trace is one rank's, so its epochs hold that rank's share of the batch
        epochs = len(profiler_steps) or config.trace_epochs
        env_steps = epochs * config.envs_per_rank * config.horizon
        phases = PHASES
        broken_down = (*PHASES, *GRAPH_PHASES)
    else:
        traced = [epoch for epoch in run_summary["epochs"] if epoch.get("traced")]
        epochs, env_steps = len(traced), sum(epoch["steps"] for epoch in traced)
        phases = broken_down = (*COMMAND_PHASES, OTHER)
    has_gpu = bool(trace_events.complete_events(trace, trace_events.GPU_ACTIVITY_CATEGORIES))

    summary = {
        "trace": str(path),
        "bytes": path.stat().st_size,
        "kind": "gpu" if has_gpu else "cpu",
        "traced_epochs": epochs,
        "env_steps": env_steps,
        "window_us": sum(step["dur"] for step in profiler_steps) or None,
        "phases_host_us": _range_totals(trace, trace_events.HOST_RANGE_CATEGORY, phases),
        "phases_device_us": _range_totals(trace, trace_events.DEVICE_RANGE_CATEGORY, phases) if has_gpu else None,
        "top_operators": _top_operators(trace),
        # the host-side analogue of launches per step: every operator dispatched pays Python and dispatcher cost
        "cpu_ops_per_env_step": _count(trace, ("cpu_op",)) / env_steps if env_steps else None,
        "by_phase": phase_breakdown(trace, broken_down, device_ranges=has_gpu),
    }
    if has_gpu:
        summary.update(_gpu_event_counts(trace, epochs, env_steps))
        summary.update(_hta_device_time(path, trace))
    else:
        summary["gpu"] = None
        summary["gpu_unavailable"] = "CPU trace: no device activity to analyse"
    return summary


def _range_totals(trace: dict, category: str, phases: tuple[str, ...]) -> dict[str, float]:
    """Each of `phases`' range time, and a whole call's phase where the trace has one."""
    totals = dict.fromkeys(phases, 0.0)
    for event in trace_events.complete_events(trace, category):
        if event["name"] in totals or event["name"] in GRAPH_PHASES:
            totals[event["name"]] = totals.get(event["name"], 0.0) + event["dur"]
    return totals


def _kernels_by_phase(trace: dict) -> dict[str, dict]:
    """Each phase's launches, and the kernels and kernel time they issued. A kernel carries the correlation id of
    the host call that launched it, and a CUDA graph's kernels all carry their graph launch's, so each is charged to
    the phase whose host range holds that call: inside a whole graph (rollout_graph, update_graph) no finer. What
    no phase holds is `other`. A graph replay's seed and offset fills are its `replay_prologue_fills`, not launches
    (docs/profiling.md#trace-summary); their kernels count among the phase's kernels."""
    names = (*PHASES, *GRAPH_PHASES)
    phase_at = PhaseLocator(trace, names)

    by_phase: dict[str, dict] = defaultdict(
        lambda: {"launches": 0, "replay_prologue_fills": 0, "kernels": 0, "kernel_us": 0.0})
    calls = trace_events.complete_events(trace, HOST_API_CATEGORIES)
    prologue = _replay_prologue_fills(trace, calls)
    phase_of_call = {}
    for call in calls:
        phase = phase_at(call["ts"])
        correlation = call.get("args", {}).get("correlation")
        phase_of_call[correlation] = phase
        if correlation in prologue:
            by_phase[phase]["replay_prologue_fills"] += 1
        elif call["name"] in LAUNCH_CALLS:
            by_phase[phase]["launches"] += 1
    for kernel in trace_events.complete_events(trace, "kernel"):
        entry = by_phase[phase_of_call.get(kernel.get("args", {}).get("correlation"), OTHER)]
        entry["kernels"] += 1
        entry["kernel_us"] += kernel["dur"]
    return {phase: by_phase[phase] for phase in (*names, OTHER) if phase in by_phase}


def _replay_prologue_fills(trace: dict, calls: list[dict]) -> set:
    """The correlation ids of the launches CUDAGraph::replay makes before a graph that draws random numbers: an
    int64 fill of the generator's seed and one of its offset, the launches on a thread right before its
    cudaGraphLaunch."""
    fills = {kernel.get("args", {}).get("correlation") for kernel in trace_events.complete_events(trace, "kernel")
             if PROLOGUE_FILL_KERNEL in kernel["name"]} - {None}
    by_thread: dict[tuple, list[dict]] = defaultdict(list)
    for call in calls:
        if call["name"] in LAUNCH_CALLS:
            by_thread[(call.get("pid"), call.get("tid"))].append(call)
    prologue = set()
    for launches in by_thread.values():
        launches.sort(key=lambda call: call["ts"])
        for index, call in enumerate(launches):
            if call["name"] not in GRAPH_LAUNCH_CALLS:
                continue
            before = index - 1
            while before >= 0 and launches[before].get("args", {}).get("correlation") in fills:
                prologue.add(launches[before]["args"]["correlation"])
                before -= 1
    return prologue


def _count(trace: dict, categories: tuple[str, ...], names: frozenset[str] | None = None) -> int:
    return sum(1 for e in trace_events.complete_events(trace, categories) if names is None or e["name"] in names)


def _top_operators(trace: dict) -> list[dict]:
    """CPU operators by self time (profilers/trace_phases.py), so wrappers such as autograd's engine do not crowd
    out the operators that do the work."""
    self_us: Counter[str] = Counter()
    total_us: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    for event, own_us in operator_self_times(trace):
        self_us[event["name"]] += own_us
        total_us[event["name"]] += event["dur"]
        calls[event["name"]] += 1
    return [
        {"name": name, "calls": calls[name], "self_us": round(self_us[name], 3), "total_us": round(total_us[name], 3)}
        for name, _ in sorted(((n, self_us[n]) for n in calls), key=lambda item: -item[1])[:TOP_N]
    ]


def _gpu_event_counts(trace: dict, epochs: int, env_steps: int) -> dict:
    copies: dict[str, dict] = {}
    for event in trace_events.complete_events(trace, "gpu_memcpy"):
        # Kineto names copies "Memcpy HtoD (Pageable -> Device)"; the second word is the direction
        words = event["name"].split()
        direction = words[1] if len(words) > 1 else event["name"]
        entry = copies.setdefault(direction, {"count": 0, "bytes": 0, "us": 0.0})
        entry["count"] += 1
        entry["bytes"] += int(event.get("args", {}).get("bytes", 0))
        entry["us"] += event["dur"]
    for entry in copies.values():
        entry["gb_per_s"] = entry["bytes"] / entry["us"] / 1e3 if entry["us"] else None
    by_phase = _kernels_by_phase(trace)
    return {
        # a graph replay counts once, without its prologue's fills
        "launches_per_env_step": sum(phase["launches"] for phase in by_phase.values()) / env_steps,
        "kernels_per_env_step": _count(trace, ("kernel",)) / env_steps,
        "kernels_by_phase": by_phase,
        "host_syncs_per_epoch": _count(trace, HOST_API_CATEGORIES, SYNC_CALLS) / epochs,
        "sync_calls": dict(Counter(
            e["name"] for e in trace_events.complete_events(trace, HOST_API_CATEGORIES) if e["name"] in SYNC_CALLS
        )),
        "copies": copies,
    }


@contextmanager
def _hta_at_trace_resolution():
    """HTA quiet, and reading timestamps as they are (see the module's docstring); HTA reads the setting from
    the environment when it parses, so it is set for the parse alone."""
    hta_logger = logging.getLogger("hta")
    level = hta_logger.level
    rounding = os.environ.get(HTA_NS_ROUNDING_OFF)
    hta_logger.setLevel(logging.ERROR)
    os.environ[HTA_NS_ROUNDING_OFF] = "1"
    try:
        yield
    finally:
        hta_logger.setLevel(level)
        if rounding is None:
            os.environ.pop(HTA_NS_ROUNDING_OFF, None)
        else:
            os.environ[HTA_NS_ROUNDING_OFF] = rounding


def _drop_device_ranges(analysis) -> None:
    """HTA 0.5 keeps the phase ranges Kineto draws on the GPU rows, and when they carry a stream its
    temporal breakdown counts them as kernels: a phase would read as busy for its whole length."""
    category = analysis.t.symbol_table.get_sym_id_map().get(trace_events.DEVICE_RANGE_CATEGORY)
    if category is not None:
        for rank, frame in analysis.t.traces.items():
            analysis.t.traces[rank] = frame[frame["cat"] != category]


def _hta_device_time(path: Path, trace: dict) -> dict:
    from hta.trace_analysis import TraceAnalysis

    try:
        with _hta_at_trace_resolution():
            analysis = TraceAnalysis(trace_files={0: str(path)}, trace_dir=str(path.parent),
                                     include_last_profiler_step=True)
    except Exception as exc:  # HTA raises whatever its parser meets; the host-side summary still stands
        return {"gpu": None, "gpu_unavailable": f"HTA could not read the trace ({_exception_text(exc)})",
                "top_kernels": []}
    _drop_device_ranges(analysis)
    result = {"gpu": None, "top_kernels": []}
    unavailable = []
    try:
        with _hta_at_trace_resolution():
            _, kernels = analysis.get_gpu_kernel_breakdown(visualize=False, num_kernels=TOP_N, duration_ratio=1.0,
                                                           include_memory_kernels=True)
        result["top_kernels"] = _top_kernels(kernels, trace)
    except Exception as exc:
        unavailable.append(f"HTA's kernel breakdown failed ({_exception_text(exc)})")
    try:
        with _hta_at_trace_resolution():
            temporal = analysis.get_temporal_breakdown(visualize=False).iloc[0]
        span = float(temporal["kernel_time(us)"])
        idle = float(temporal["idle_time(us)"])
        result["gpu"] = {
            "span_us": span,
            "busy_us": span - idle,
            "idle_us": idle,
            "busy_fraction": (span - idle) / span if span else None,
            "compute_us": float(temporal["compute_time(us)"]),
            "non_compute_us": float(temporal["non_compute_time(us)"]),
        }
    except Exception as exc:
        unavailable.append(f"HTA's time breakdown failed ({_exception_text(exc)}); device time per phase, "
                           "kernel counts and copies are read from the trace events")
    if unavailable:
        result["gpu_unavailable"] = "; ".join(unavailable)
    return result


def _exception_text(exc: Exception) -> str:
    """The exception in a line, with where it was raised when it has no message (HTA's bare asserts)."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    if frames and not str(exc):
        where = frames[-1]
        text += f" at {Path(where.filename).name}:{where.lineno} `{where.line}`"
    return text.replace("\n", " ")


def _top_kernels(kernels, trace: dict) -> list[dict]:
    """HTA's kernel breakdown, with call counts from the trace events: once HTA folds the kernels past its
    top N into "others", its mean is over kernel names, not calls."""
    from hta.utils.utils import get_kernel_type

    calls = Counter(e["name"] for e in trace_events.complete_events(trace, trace_events.GPU_ACTIVITY_CATEGORIES))
    named = set(kernels["name"]) - {"others"}
    others_calls: Counter[str] = Counter()
    for name, count in calls.items():
        if name not in named:
            others_calls[get_kernel_type(name)] += count
    top = kernels.sort_values("sum (us)", ascending=False).head(TOP_N)
    return [
        {"name": row["name"], "kind": row["kernel_type"], "total_us": float(row["sum (us)"]),
         "calls": others_calls[row["kernel_type"]] if row["name"] == "others" else calls[row["name"]]}
        for _, row in top.iterrows()
    ]
