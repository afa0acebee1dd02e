"""The traced processes of one side of a diff, read from a profile directory: `rlperf profile --out DIR` (one
process), or a directory of such profiles, one per process (a side of `rlperf profile --against`).

Each process becomes a plain record (`TracedProcess`): its settings, phases, agent steps traced, each phase's
breakdown (profilers/trace_phases.py) and the run summary's `memory` where it carries one. A profile written before
the breakdown was kept in profile.json is broken down again from its trace, found beside profile.json.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from profilers import trace_events
from profilers.profile_run import PROFILE_NAME, RUN_SUMMARY_NAME
from profilers.trace_phases import phase_breakdown
from rlperf.errors import BadInput


@dataclass
class TracedProcess:
    name: str  # its directory, as the diff names it
    writer: str  # "reference" (the reference trainer) or a command's summary writer
    settings: dict  # the configuration it ran (a command's: its command, device, warm-up)
    kind: str  # "cpu" or "gpu": whether the trace holds device activity
    env_steps: int  # agent steps in the traced epochs
    by_phase: dict[str, dict]
    memory: dict | None
    trace: Path


def read_side(path: str | Path, field: str) -> list[TracedProcess]:
    """The processes of the profile directory at `path`, in their directories' order; bad input naming `field`
    where it holds no profile."""
    path = Path(path)
    if not path.is_dir():
        raise BadInput(f"{field}: {path} is not a directory (name a profile directory: rlperf profile --out DIR)")
    if (path / PROFILE_NAME).exists():
        return [read_process(path, field)]
    found = sorted(child for child in path.iterdir() if (child / PROFILE_NAME).exists())
    if not found:
        raise BadInput(f"{field}: {path} holds no {PROFILE_NAME}, nor directories that do (not a profile directory)")
    return [read_process(child, field) for child in found]


def read_process(directory: Path, field: str) -> TracedProcess:
    try:
        profile = json.loads((directory / PROFILE_NAME).read_text())
        summary = profile["trace_summary"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInput(f"{field}: {directory / PROFILE_NAME} is not a profile rlperf wrote ({exc})") from None
    run_summary = _run_summary(directory)
    by_phase = summary.get("by_phase")
    trace = directory / Path(profile.get("trace", "trace.json.gz")).name
    if by_phase is None:  # a profile older than the phase breakdown: read it from the trace
        if not trace.exists():
            raise BadInput(f"{field}: {directory} holds neither a phase breakdown nor its trace {trace.name}")
        by_phase = phase_breakdown(trace_events.load(trace), tuple(summary["phases_host_us"]),
                                   device_ranges=summary.get("phases_device_us") is not None)
    return TracedProcess(name=str(directory), writer=run_summary.get("writer", "reference"),
                         settings=profile.get("config") or {}, kind=summary.get("kind", "cpu"),
                         env_steps=int(summary["env_steps"]), by_phase=by_phase, memory=run_summary.get("memory"),
                         trace=trace)


def _run_summary(directory: Path) -> dict:
    try:
        return json.loads((directory / RUN_SUMMARY_NAME).read_text())
    except (OSError, ValueError):
        return {}
