"""How `rlperf attach` starts a command with its phases attached (profilers/attach.py runs inside it): the
environment that reaches the command's Python processes, and the command's run. Imports nothing that times:
this process is the harness, not the trainer."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rlperf.errors import BadInput
from rlperf.machine import REPO_ROOT

BOOTSTRAP = Path(__file__).resolve().parent / "attach_boot"
# what the command's processes read (rlperf/phases.py)
SUMMARY_VARIABLE, DELAY_VARIABLE, WARMUP_VARIABLE = "RLPERF_SUMMARY", "RLPERF_INJECT_DELAY", "RLPERF_WARMUP_EPOCHS"
OWNER_VARIABLE = "RLPERF_PHASES_OWNER"
DELAY_EVERY_VARIABLE = "RLPERF_INJECT_DELAY_EVERY"
ROOT_VARIABLE = "RLPERF_ATTACH_ROOT"
# what profilers/attach.py reads: the env steps the user named, and their agents per step
ENV_STEP_VARIABLE, AGENTS_VARIABLE = "RLPERF_ATTACH_ENV_STEP", "RLPERF_ATTACH_AGENTS"
TRACE_VARIABLE, TRACE_EPOCHS_VARIABLE = "RLPERF_TRACE", "RLPERF_TRACE_EPOCHS"
# what attached_environment sets, in the order a shell line shows them
ATTACH_VARIABLES = (SUMMARY_VARIABLE, WARMUP_VARIABLE, DELAY_VARIABLE, DELAY_EVERY_VARIABLE, TRACE_VARIABLE,
                    TRACE_EPOCHS_VARIABLE, ENV_STEP_VARIABLE, AGENTS_VARIABLE, ROOT_VARIABLE, "PYTHONPATH")
ENV_STEP_PATTERN = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*\.[A-Za-z_]\w*")


@dataclass(frozen=True)
class EnvStepNames:
    """The env steps a user names for attach (`--env-step MODULE:CLASS.METHOD`, repeatable) and the agents each
    step counts (`--agents-per-step`: a number, or the env's attribute holding it; empty: attach's defaults)."""

    steps: tuple[str, ...] = ()
    agents: str = ""

    def environment(self) -> dict[str, str]:
        return {ENV_STEP_VARIABLE: ",".join(self.steps), AGENTS_VARIABLE: self.agents} if self.steps else {}


def env_step_name(text: str) -> str:
    """One `--env-step` value, refused in one line when it is not MODULE:CLASS.METHOD."""
    if not ENV_STEP_PATTERN.fullmatch(text):
        raise ValueError(f"{text!r} is not MODULE:CLASS.METHOD (for example mysim.envs:BatchEnv.step, or "
                         f"__main__:Env.step for a class of the script itself)")
    return text


def agents_per_step(text: str) -> str:
    """One `--agents-per-step` value: a whole number of 1 or more, or an attribute's name."""
    if (text.isdigit() and int(text) >= 1) or text.isidentifier():
        return text
    raise ValueError(f"must be a whole number of 1 or more, or the name of the env's attribute that holds it "
                     f"(got {text!r})")


def attached_environment(summary: Path, delays_ms: dict[str, float] | None = None, warmup_epochs: int = 1,
                         base: dict[str, str] | None = None, attach: bool = True, trace: Path | None = None,
                         trace_epochs: int = 1, env_steps: EnvStepNames = EnvStepNames(),
                         delay_every: int = 1) -> dict[str, str]:
    """The command's environment: its summary's path, the delays and warm-up epochs, and (with `attach`) the
    bootstrap directory first on PYTHONPATH, so that `site` imports its sitecustomize in every Python process the
    command starts. Without `attach`, a loop that calls rlperf.phases itself is timed by its own marks. With
    `trace`, its first `trace_epochs` steady epochs are traced there (`rlperf profile`). With `delay_every` N, the
    delays land in every Nth epoch only (`rlperf selfcheck` pairs each with its neighbour)."""
    env = dict(os.environ if base is None else base)
    for name in (OWNER_VARIABLE, TRACE_VARIABLE, TRACE_EPOCHS_VARIABLE, ENV_STEP_VARIABLE, AGENTS_VARIABLE,
                 DELAY_EVERY_VARIABLE):
        env.pop(name, None)
    if trace is not None:
        env.update({TRACE_VARIABLE: str(Path(trace).absolute()), TRACE_EPOCHS_VARIABLE: str(trace_epochs)})
    env[SUMMARY_VARIABLE] = str(Path(summary).absolute())
    env[WARMUP_VARIABLE] = str(warmup_epochs)
    env[DELAY_VARIABLE] = ",".join(f"{phase}={ms:g}" for phase, ms in (delays_ms or {}).items())
    if delay_every != 1:
        env[DELAY_EVERY_VARIABLE] = str(delay_every)
    if attach:
        env.update(env_steps.environment())
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
                 cwd: Path | None = None, env_steps: EnvStepNames = EnvStepNames(), delay_every: int = 1,
                 **output) -> subprocess.CompletedProcess:
    """Runs `command` to its end with its output shown (or sent where `output` says); its exit code in the result
    (124 past `timeout_s`)."""
    env = attached_environment(summary, delays_ms, warmup_epochs, attach=attach, env_steps=env_steps,
                               delay_every=delay_every)
    try:
        return subprocess.run(resolved(command, cwd), env=env, timeout=timeout_s, cwd=cwd, **output)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, 124)
