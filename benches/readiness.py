"""Whether a GPU machine is ready to be a benchmark runner (`rlperf doctor`): the checks, each a process of its own
with its log, and what each one's outcome says."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlperf.layout import STORE_FILE
from rlperf.lock import duration
from rlperf.machine import REPO_ROOT

NIGHT_SUITE = "doctor-night"
# what the night may take, screen to confirmation (the gate's --night-s): the screen's 12 processes, then
# whatever a suspect's confirmation gets of the rest
NIGHT_S = 180
STOP_GRACE_S = 20.0  # after an interrupt at a check's cap, the seconds its process gets to end itself


@dataclass
class Check:
    """One check: a command run from the repository's root, its output into `log` under the run's folder, at most
    `cap_s` seconds; after it exits 0, `verify(folder)` says what is still wrong, or None."""

    name: str
    command: list[str]
    cap_s: float
    verify: Callable[[Path], str | None] | None = None
    refusal: str | None = None  # why the check cannot run here at all: it fails without running

    @property
    def log(self) -> str:
        return f"{self.name.replace(' ', '-')}.log"


@dataclass
class Outcome:
    name: str
    problem: str | None  # None: passed
    wall_s: float
    log: Path

    def line(self) -> str:
        state = "ok" if self.problem is None else f"FAILED: {self.problem}; log {self.log}"
        return f"{self.name}: {state} ({duration(self.wall_s)})"


def runner_checks(folder: Path, python: str) -> list[Check]:
    """The four checks, in the order a runner needs them (docs/gpu-runner.md sizes each from measured walls)."""
    store = folder / "store"
    tests = REPO_ROOT / "tests"
    refusal = None
    if not tests.is_dir():
        refusal = f"no tests at {tests}: rlperf doctor runs from a checkout of the repository"
    elif importlib.util.find_spec("pytest") is None:
        refusal = f"pytest is not installed for {python} (pip install -e '.[test]')"
    night_refusal = refusal
    if not (REPO_ROOT / ".git").exists():
        night_refusal = (f"no .git in {REPO_ROOT}: the night builds HEAD beside the working tree, so it runs from a "
                         f"git checkout (a copy without .git cannot)")
    rlperf = [python, "-m", "rlperf"]
    return [
        Check("gpu tests", [python, "-m", "pytest", "-m", "gpu", "-rs", "-p", "no:cacheprovider", str(tests)],
              cap_s=480, refusal=refusal),
        Check("gpu smoke", [*rlperf, "bench", "--suite", "gpu-smoke", "--device", "cuda", "--out", str(store)],
              cap_s=300, verify=lambda folder: smoke_roofline_problem(store / STORE_FILE, folder / "gpu-smoke.log")),
        Check("traced profile", [*rlperf, "profile", "--device", "cuda", "--env", "synthetic", "--num-envs", "1024",
                                 "--horizon", "64", "--minibatch-size", "8192", "--hidden-size", "128",
                                 "--total-steps", "262144", "--quiet", "--out", str(folder / "profile")],
              cap_s=180, verify=lambda _: trace_problem(folder / "profile")),
        Check("gate night", [*rlperf, "gate", "--suite", NIGHT_SUITE, "--baseline", "HEAD", "--screen-pairs", "2",
                             "--refine-points", "0", "--night-s", str(NIGHT_S), "--out", str(store),
                             "--summary", str(folder / "gate.json")],
              cap_s=480, refusal=night_refusal),
    ]


def run_checks(checks: list[Check], folder: Path, say: Callable[[str], None]) -> list[Outcome]:
    """Each check in turn, whatever the ones before it did: a runner's every fault is worth knowing at once."""
    outcomes = []
    for number, check in enumerate(checks, start=1):
        log = folder / check.log
        say(f"[{number}/{len(checks)}] {check.name}: {' '.join(check.command)}")
        started = time.monotonic()
        if check.refusal:
            log.write_text(check.refusal + "\n")
        stage = "command"
        try:
            problem = check.refusal or run_logged(check, log)
            if problem is None and check.verify is not None:
                stage = "verification"
                problem = check.verify(folder)
        except Exception as exc:  # one check's fault is its line; Ctrl-C (not an Exception) still ends the run
            problem = f"its {stage} raised {one_line(exc)}"
        outcomes.append(Outcome(check.name, problem, time.monotonic() - started, log))
    return outcomes


def run_logged(check: Check, log: Path) -> str | None:
    """Runs the check's command with its output into `log`: None when it exits 0, else what happened. At its cap
    it is interrupted as Ctrl-C would (the commands then say what they have), and killed STOP_GRACE_S later."""
    with open(log, "w") as file:
        process = subprocess.Popen(check.command, cwd=REPO_ROOT, stdout=file, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                                   start_new_session=True, preexec_fn=interruptible)
        try:
            code = process.wait(timeout=check.cap_s)
        except subprocess.TimeoutExpired:
            stop(process)
            return f"did not finish within {duration(check.cap_s)}"
        except KeyboardInterrupt:
            stop(process)
            raise
    if code == 0:
        return None
    last = last_line(log)
    return f"exit {code}" + (f", {last}" if last else "")


def one_line(exc: Exception) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def interruptible() -> None:
    """In the check's process before it starts: SIGINT's default back, so the interrupt at its cap stops it even
    where the doctor was started with SIGINT ignored (a background job, a CI runner), which children inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop(process: subprocess.Popen) -> None:
    """Its whole process group (a bench's trainers, pytest's children): SIGINT, then SIGKILL if it stays."""
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def last_line(log: Path, width: int = 160) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:width] if lines else ""


def smoke_roofline_problem(store_path: Path, log: Path) -> str | None:
    """Whether the smoke's newest run has a whole roofline (benches.peak_probe.roofline_problem); where the probe
    failed, its own line from the smoke's log says how."""
    from benches.peak_probe import roofline_problem
    from rlperf.store import Store

    if not store_path.is_file():
        return f"no store at {store_path}"
    with Store.open(store_path, readonly=True) as store:
        runs = store.runs()
        smoke = runs[runs["suite"] == "gpu-smoke"]
        if smoke.empty:
            return f"no gpu-smoke run in {store_path}"
        problem = roofline_problem(store, smoke.iloc[-1]["run_id"])
    if problem is None:
        return None
    failures = [line.strip() for line in log.read_text(errors="replace").splitlines()
                if line.startswith("peaks: ") and " failed" in line]
    return f"the smoke's roofline: {problem}" + (f" ({failures[0]})" if failures else "")


def trace_problem(profile_dir: Path) -> str | None:
    from profilers.profile_run import TRACE_NAME

    trace = profile_dir / TRACE_NAME
    return None if trace.is_file() and trace.stat().st_size > 0 else f"no trace at {trace}"
