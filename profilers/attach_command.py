"""How `rlperf attach` starts a command with its phases attached (profilers/attach.py runs inside it): the
environment that reaches the command's Python processes, and the command's run. Imports nothing that times:
this process is the harness, not the trainer."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from rlperf.errors import BadInput
from rlperf.machine import REPO_ROOT

BOOTSTRAP = Path(__file__).resolve().parent / "attach_boot"
# what the command's processes read (rlperf/phases.py)
SUMMARY_VARIABLE, DELAY_VARIABLE, WARMUP_VARIABLE = "RLPERF_SUMMARY", "RLPERF_INJECT_DELAY", "RLPERF_WARMUP_EPOCHS"
OWNER_VARIABLE = "RLPERF_PHASES_OWNER"
ROOT_VARIABLE = "RLPERF_ATTACH_ROOT"
TRACE_VARIABLE, TRACE_EPOCHS_VARIABLE = "RLPERF_TRACE", "RLPERF_TRACE_EPOCHS"
# what attached_environment sets, in the order a shell line shows them
ATTACH_VARIABLES = (SUMMARY_VARIABLE, WARMUP_VARIABLE, DELAY_VARIABLE, TRACE_VARIABLE, TRACE_EPOCHS_VARIABLE,
                    ROOT_VARIABLE, "PYTHONPATH")


def attached_environment(summary: Path, delays_ms: dict[str, float] | None = None, warmup_epochs: int = 1,
                         base: dict[str, str] | None = None, attach: bool = True, trace: Path | None = None,
                         trace_epochs: int = 1) -> dict[str, str]:
    """The command's environment: its summary's path, the delays and warm-up epochs, and (with `attach`) the
    bootstrap directory first on PYTHONPATH, so that `site` imports its sitecustomize in every Python process the
    command starts. Without `attach`, a loop that calls rlperf.phases itself is timed by its own marks. With
    `trace`, its first `trace_epochs` steady epochs are traced there (`rlperf profile`)."""
    env = dict(os.environ if base is None else base)
    for name in (OWNER_VARIABLE, TRACE_VARIABLE, TRACE_EPOCHS_VARIABLE):
        env.pop(name, None)
    if trace is not None:
        env.update({TRACE_VARIABLE: str(Path(trace).absolute()), TRACE_EPOCHS_VARIABLE: str(trace_epochs)})
    env[SUMMARY_VARIABLE] = str(Path(summary).absolute())
    env[WARMUP_VARIABLE] = str(warmup_epochs)
    env[DELAY_VARIABLE] = ",".join(f"{phase}={ms:g}" for phase, ms in (delays_ms or {}).items())
    if attach:
        env[ROOT_VARIABLE] = str(REPO_ROOT)
        env["PYTHONPATH"] = os.pathsep.join([str(BOOTSTRAP), *filter(None, [env.get("PYTHONPATH")])])
    return env


def resolved(command: list[str], cwd: Path | None = None) -> list[str]:
    """`command` with its program found on PATH (a path to one is taken from `cwd`, where the command runs);
    refused in one line when there is none."""
    if not command:
        raise BadInput("command: name the command to run after --, for example -- python -m pkg.train")
    program = command[0]
    if os.sep in program:
        found = program if shutil.which(str(Path(cwd or ".") / program)) is not None else None
    else:
        found = shutil.which(program)
    if found is None:
        raise BadInput(f"command: {program!r} not found (allowed: a program on PATH or a path to one)")
    return [found, *command[1:]]


def run_attached(command: list[str], summary: Path, delays_ms: dict[str, float] | None = None,
                 warmup_epochs: int = 1, timeout_s: float | None = None, attach: bool = True,
                 cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Runs `command` to its end with its output shown; its exit code in the result (124 past `timeout_s`)."""
    env = attached_environment(summary, delays_ms, warmup_epochs, attach=attach)
    try:
        return subprocess.run(resolved(command, cwd), env=env, timeout=timeout_s, cwd=cwd)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, 124)
