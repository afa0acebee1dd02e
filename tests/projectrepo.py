"""A git repository holding this project's packages, for tests that measure commits (bisect, the gate): each
runs `python -m rlperf` from the copy, so the repository searched and the code that searches it are the copy."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from rlperf.machine import REPO_ROOT

PACKAGES = ("benches", "command", "decisions", "profilers", "reference_trainer", "reports", "rlperf", "studies")
STOP_GRACE_S = 60.0  # how long a command stopped at its timeout may take to clean up
GIT_ENV = {"GIT_AUTHOR_NAME": "rlperf test", "GIT_AUTHOR_EMAIL": "test@example.invalid",
           "GIT_COMMITTER_NAME": "rlperf test", "GIT_COMMITTER_EMAIL": "test@example.invalid"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True,
                          env={**os.environ, **GIT_ENV}).stdout.strip()


def commit(repo: Path, subject: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", subject)
    return git(repo, "rev-parse", "HEAD")


def note(repo: Path, line: str) -> None:
    with open(repo / "NOTES.md", "a") as notes:
        notes.write(line + "\n")


def project_repo(root: Path) -> Path:
    """A git repository holding this project's packages as they are in the working tree, in one commit."""
    repo = root / "project"
    for package in PACKAGES:
        shutil.copytree(REPO_ROOT / package, repo / package, ignore=shutil.ignore_patterns("__pycache__"))
    # Verdicts leave out repeats run on a busy machine, and a shared test machine is busy: that rule is tested
    # with the verdicts. In this history every repeat counts as quiet, so each step depends on the speeds.
    with open(repo / "profilers" / "interference.py", "a") as monitor:
        monitor.write("\n\ndef contention(account):\n    return []\n")
    (repo / ".gitignore").write_text("__pycache__/\n")
    git(repo, "init", "-q", "-b", "main")
    note(repo, "# notes")
    commit(repo, "Add the trainer")
    return repo


def plant_in_learn_step(repo: Path, line: str) -> None:
    """Adds `line` to the copy's trainer right after its learn phase begins (before each minibatch's backward and
    step); `cfg` is the run's TrainConfig there."""
    update = repo / "reference_trainer" / "epoch_calls.py"
    source = update.read_text()
    learn = re.compile(r'^([ \t]*)enter\("learn"\)[ \t]*$', re.MULTILINE)
    assert len(learn.findall(source)) == 1, "the learn phase's mark moved: update the plant's anchor"
    update.write_text(learn.sub(lambda m: f"{m.group(0)}\n{m.group(1)}{line}", source, count=1))


def environment(repo: Path, **extra: str) -> dict[str, str]:
    """The environment `python -m rlperf` gets from the copy: no PYTHONPATH to lead it back to this checkout, and
    a measurement lock of its own."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return {**env, "RLPERF_LOCK": str(repo.parent / "bench.lock"), **extra}


def rlperf(repo: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """`python -m rlperf` run from `repo`, so the repository searched and the code that searches it are the copy.
    Past `timeout` it is stopped as a CI step's timeout stops a command, by SIGTERM, so it cleans up after
    itself (its runs marked interrupted, its checkouts removed) before the test fails."""
    command = [sys.executable, "-m", "rlperf", *args]
    with subprocess.Popen(command, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=environment(repo)) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.communicate(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
