"""One profiled trainer run: child process, sampler, optional py-spy, then merge and summarise.

Used by `rlperf profile` and by the bench harness for points marked `profile = true`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from profilers import pyspy
from profilers.sampler import Row, UtilizationSampler
from profilers.timeline import merge_timeline
from profilers.trace_summary import summarize_trace
from profilers.utilization import as_frame, summarize_utilization
from reference_trainer.config import TrainConfig
from rlperf.processes import run_to_completion

RUN_SUMMARY_NAME = "summary.json"
TRACE_NAME = "trace.json.gz"  # the file name the trainer gives its trace
PROFILE_NAME = "profile.json"
UTILIZATION_NAME = "utilization.csv"
PROFILED_SPS_NOTE = "SPS is not taken from a profiled run: the profiler's overhead distorts it"
DEFAULT_SAMPLE_HZ = 20.0
BAD_INPUT = 2  # the exit code of `rlperf train` for a config it refuses


@dataclass
class ProfileResult:
    returncode: int
    profile: dict = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)


def profile_run(cfg: TrainConfig, out_dir: Path, sample_hz: float = DEFAULT_SAMPLE_HZ,
                pyspy_rate: int | None = None, gpu_uuids: list[str] | None = None) -> ProfileResult:
    """Runs the trainer with `trace_dir=out_dir`; writes profile.json, utilization.csv and the merged trace
    there. A failed trainer gives its exit code and no profile. The trainer runs with --quiet, so its own
    (profiled, hence distorted) SPS is never shown. `gpu_uuids`: the NVML UUIDs of the run's GPUs, asked of
    the machine when not given; only those are sampled, never a neighbour's GPU."""
    out_dir = Path(out_dir)
    summary_path = out_dir / RUN_SUMMARY_NAME
    train = [sys.executable, "-m", "rlperf", "train", *cfg.to_args(leave_out=("trace_dir",)), "--trace-dir", str(out_dir),
             "--json", str(summary_path), "--quiet"]
    messages: list[str] = []
    pyspy_info: dict | None = None
    if pyspy_rate is not None:
        pyspy_info, command = _pyspy_command(out_dir, pyspy_rate, cfg.world_size > 1, train)
        if command is None:
            messages.append(pyspy_info["unavailable"])
    else:
        command = None

    if gpu_uuids is None:
        gpu_uuids = run_gpu_uuids(cfg)
    sampler = UtilizationSampler(1.0 / sample_hz, gpu_uuids)
    returncode, rows = _sampled(sampler, command or train)
    if command is not None and not summary_path.exists() and not (out_dir / pyspy.SPEEDSCOPE_NAME).exists():
        pyspy_info = {"unavailable": "py-spy could not run the trainer (its message is above); ran it without py-spy"}
        messages.append(pyspy_info["unavailable"])
        sampler = UtilizationSampler(1.0 / sample_hz, gpu_uuids)
        returncode, rows = _sampled(sampler, train)
    if returncode == BAD_INPUT:  # the trainer has said why in one line; saying it failed adds nothing
        return ProfileResult(returncode, rows=rows, messages=messages)
    if returncode != 0 or not summary_path.exists():
        messages.append(f"the trainer failed (exit code {returncode}); no profile written")
        return ProfileResult(returncode or 1, rows=rows, messages=messages)

    run_summary = json.loads(summary_path.read_text())
    trace_path = run_summary.get("trace")
    if not trace_path or not Path(trace_path).exists():
        messages.append("the trainer wrote no trace (were there steady epochs to trace?)")
        return ProfileResult(1, rows=rows, messages=messages)
    trace_summary = summarize_trace(trace_path, run_summary)
    timeline = run_summary.get("timeline") or []
    clock = merge_timeline(trace_path, rows, timeline, margin_s=sampler.interval_s)
    as_frame(rows).to_csv(out_dir / UTILIZATION_NAME, index=False)

    if pyspy_info is not None and "speedscope" in pyspy_info:
        pyspy_info.update(_render_flamegraph(out_dir))
        if "unavailable" in pyspy_info:
            messages.append(pyspy_info["unavailable"])

    profile = {
        "schema": 1,
        "note": PROFILED_SPS_NOTE,
        "config": run_summary["config"],
        "device_name": run_summary.get("device_name"),
        "trace": trace_path,
        "trace_summary": trace_summary,
        "clock_check": clock,
        "utilization": {
            "traced_epochs": _traced_window_utilization(rows, timeline, trace_summary["env_steps"]),
            "whole_run": summarize_utilization(rows, run_summary["steps"]),
            "interval_s": sampler.interval_s,
            "unavailable": sampler.unavailable,
            "unsupported": sampler.unsupported,
            "samples_csv": str(out_dir / UTILIZATION_NAME),
        },
        "pyspy": pyspy_info,
        "run_summary": str(summary_path),
    }
    (out_dir / PROFILE_NAME).write_text(json.dumps(profile, indent=1))
    return ProfileResult(0, profile, rows, messages)


def run_gpu_uuids(cfg: TrainConfig) -> list[str]:
    """The UUIDs of the GPUs this run uses (none on a CPU), as the bench harness finds them."""
    if not cfg.is_cuda:
        return []
    from rlperf.machine import probe

    return probe().gpu_uuids(cfg.to_dict())


def _pyspy_command(out_dir: Path, rate: int, follow: bool, train: list[str]) -> tuple[dict, list[str] | None]:
    executable = pyspy.find_pyspy()
    if executable is None:
        return {"unavailable": "py-spy is not installed (pip install py-spy); ran the trainer without it"}, None
    info = {"speedscope": str(out_dir / pyspy.SPEEDSCOPE_NAME), "rate_hz": rate}
    return info, pyspy.record_command(executable, out_dir, rate, follow, train)


def _render_flamegraph(out_dir: Path) -> dict:
    speedscope = out_dir / pyspy.SPEEDSCOPE_NAME
    if not speedscope.exists():
        return {"unavailable": "py-spy wrote no profile (see its message above)"}
    try:
        pyspy.write_flamegraph(speedscope, out_dir / pyspy.SVG_NAME)
    except (ValueError, KeyError) as exc:
        return {"unavailable": f"py-spy's profile could not be drawn ({exc})"}
    return {"flamegraph_svg": str(out_dir / pyspy.SVG_NAME)}


def _sampled(sampler: UtilizationSampler, command: list[str]) -> tuple[int, list[Row]]:
    sampler.start()
    try:
        returncode = run_to_completion(command)
    finally:
        rows = sampler.stop()
    return returncode, rows


def _traced_window_utilization(rows: list[Row], timeline: list, env_steps: int) -> dict | None:
    if not timeline:
        return None
    start_ns = min(mark[1] for mark in timeline)
    end_ns = max(mark[2] for mark in timeline)
    return summarize_utilization(rows, env_steps, start_ns, end_ns)
