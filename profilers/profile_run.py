"""One profiled trainer run: child process, sampler, optional py-spy, then merge and summarise.

Used by `rlperf profile` and by the bench harness for points marked `profile = true`: the reference trainer's run
(`profile_run`), or a command's in `rlperf attach`'s environment (`profile_command`), which traces its own steady
epochs through rlperf.phases.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from profilers import pyspy
from profilers.attach_command import attached_environment, resolved
from profilers.sampler import Row, UtilizationSampler
from profilers.timeline import merge_timeline
from profilers.trace_summary import summarize_trace
from profilers.utilization import as_frame, summarize_utilization
from reference_trainer.config import TrainConfig
from rlperf.errors import BadInput
from rlperf.processes import run_to_completion
from rlperf.summary import RunSummary

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
                pyspy_rate: int | None = None, gpu_uuids: list[str] | None = None,
                cwd: Path | None = None) -> ProfileResult:
    """Runs the trainer with `trace_dir=out_dir`; writes profile.json, utilization.csv and the merged trace
    there. A failed trainer gives its exit code and no profile. The trainer runs with --quiet, so its own
    (profiled, hence distorted) SPS is never shown. `gpu_uuids`: the NVML UUIDs of the run's GPUs, asked of
    the machine when not given; only those are sampled, never a neighbour's GPU. `cwd`: the checkout whose
    trainer runs (default: this process's)."""
    out_dir = Path(out_dir).absolute()
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
    returncode, rows = _sampled(sampler, command or train, cwd=cwd)
    if command is not None and not summary_path.exists() and not (out_dir / pyspy.SPEEDSCOPE_NAME).exists():
        pyspy_info = {"unavailable": "py-spy could not run the trainer (its message is above); ran it without py-spy"}
        messages.append(pyspy_info["unavailable"])
        sampler = UtilizationSampler(1.0 / sample_hz, gpu_uuids)
        returncode, rows = _sampled(sampler, train, cwd=cwd)
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
    profile = _finish_profile(run_summary, summary_path, rows, sampler, out_dir, pyspy_info, messages)
    (out_dir / PROFILE_NAME).write_text(json.dumps(profile, indent=1))
    return ProfileResult(0, profile, rows, messages)


def profile_command(config: dict, out_dir: Path, sample_hz: float = DEFAULT_SAMPLE_HZ,
                    pyspy_rate: int | None = None, gpu_uuids: list[str] | None = None, trace_epochs: int = 1,
                    timeout_s: float | None = None, cwd: Path | None = None,
                    log: Path | None = None) -> ProfileResult:
    """A command point's run (`config`: its `command`, `attach`, `warmup_epochs` and `device`), traced: in `rlperf
    attach`'s environment with a trace asked for (RLPERF_TRACE), so that its first `trace_epochs` steady epochs are
    traced with each phase a range (rlperf/phases.py); the same files as `profile_run`, its samples merged into
    the trace, the command's output in `log` if named. A command that fails, writes no summary or no trace gives a
    message and no profile."""
    out_dir = Path(out_dir).absolute()  # the command runs from its repository's root
    summary_path = out_dir / RUN_SUMMARY_NAME
    env = attached_environment(summary_path, {}, config["warmup_epochs"], attach=config["attach"],
                               trace=out_dir / TRACE_NAME, trace_epochs=trace_epochs)
    command = resolved(config["command"], cwd)
    messages: list[str] = []
    pyspy_info, wrapped = _pyspy_command(out_dir, pyspy_rate, True, command) if pyspy_rate is not None else (None, None)
    if pyspy_info is not None and wrapped is None:
        messages.append(pyspy_info["unavailable"])
    if gpu_uuids is None:
        gpu_uuids = run_gpu_uuids(config)
    sampler = UtilizationSampler(1.0 / sample_hz, gpu_uuids)
    with contextlib.ExitStack() as stack:
        output = {} if log is None else {"stdout": stack.enter_context(open(log, "w")), "stderr": subprocess.STDOUT}
        returncode, rows = _sampled(sampler, wrapped or command, timeout_s=timeout_s, env=env, cwd=cwd,
                                    stdin=subprocess.DEVNULL, **output)
    why = f"; its last lines are in {log}" if log is not None else ""
    if returncode == 124 and timeout_s is not None:
        messages.append(f"the command ran past its timeout ({timeout_s:g} s) and was ended; no profile written{why}")
        return ProfileResult(1, rows=rows, messages=messages)
    if returncode != 0:
        messages.append(f"the command exited with code {returncode}; no profile written{why}")
        return ProfileResult(returncode if 0 < returncode < 256 else 1, rows=rows, messages=messages)
    try:
        run_summary = RunSummary.check(json.loads(summary_path.read_text()))
    except (OSError, ValueError, BadInput) as exc:
        messages.append(f"the command wrote no summary it could be profiled by ({exc}){why or '; its last lines say why'}")
        return ProfileResult(1, rows=rows, messages=messages)
    if not run_summary.trace or not Path(run_summary.trace).exists() or \
            not any(epoch.get("traced") for epoch in run_summary.epochs):
        messages.append("the command's trace holds no whole steady epoch (were there steady epochs to trace, "
                        "after --warmup-epochs?)")
        return ProfileResult(1, rows=rows, messages=messages)
    profile = _finish_profile(run_summary.to_dict(), summary_path, rows, sampler, out_dir, pyspy_info, messages)
    profile["config"] = config
    (out_dir / PROFILE_NAME).write_text(json.dumps(profile, indent=1))
    return ProfileResult(0, profile, rows, messages)


def run_gpu_uuids(cfg: TrainConfig | dict) -> list[str]:
    """The UUIDs of the GPUs this run uses (none on a CPU), as the bench harness finds them: a reference trainer's
    config, or a command point's (its `device`)."""
    config = cfg if isinstance(cfg, dict) else cfg.to_dict()
    if not str(config.get("device", "cpu")).startswith("cuda"):
        return []
    from rlperf.machine import probe

    return probe().gpu_uuids({"world_size": 1, **config})


def _finish_profile(run_summary: dict, summary_path: Path, rows: list[Row], sampler: UtilizationSampler,
                    out_dir: Path, pyspy_info: dict | None, messages: list[str]) -> dict:
    """The trace summarised, the samples and the phase timeline merged into it, py-spy's flame graph drawn: the
    profile (profile.json's content)."""
    trace_path = run_summary["trace"]
    trace_summary = summarize_trace(trace_path, run_summary)
    timeline = run_summary.get("timeline") or []
    clock = merge_timeline(trace_path, rows, timeline, margin_s=sampler.interval_s)
    as_frame(rows).to_csv(out_dir / UTILIZATION_NAME, index=False)

    if pyspy_info is not None and "speedscope" in pyspy_info:
        pyspy_info.update(_render_flamegraph(out_dir))
        if "unavailable" in pyspy_info:
            messages.append(pyspy_info["unavailable"])

    return {
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


def _sampled(sampler: UtilizationSampler, command: list[str], **run_options) -> tuple[int, list[Row]]:
    sampler.start()
    try:
        returncode = run_to_completion(command, **run_options)
    finally:
        rows = sampler.stop()
    return returncode, rows


def _traced_window_utilization(rows: list[Row], timeline: list, env_steps: int) -> dict | None:
    if not timeline:
        return None
    start_ns = min(mark[1] for mark in timeline)
    end_ns = max(mark[2] for mark in timeline)
    return summarize_utilization(rows, env_steps, start_ns, end_ns)
