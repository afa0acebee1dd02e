"""`rlperf doctor` on a machine without a GPU (one line, exit 2, nothing run), and its pieces: the checks it runs
on a GPU, and how each check's process ends in one summary line (ok, or what failed and where its log is)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
import torch

from benches import suite as suites
from benches import readiness


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: the doctor would run its checks")
def test_without_a_gpu_rlperf_doctor_says_so_in_one_line_and_runs_nothing(tmp_path):
    out = tmp_path / "doctor"
    done = subprocess.run([sys.executable, "-m", "rlperf", "doctor", "--out", str(out)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and done.stderr.count("\n") == 1
    assert done.stderr.startswith("rlperf doctor: error: device: device=cuda needs a CUDA GPU; none is visible")
    assert not out.exists()


def test_each_check_ends_in_one_line_ok_or_what_failed_and_where_its_log_is(tmp_path):
    python = sys.executable
    checks = [
        readiness.Check("passes", [python, "-c", "print('fine')"], cap_s=60),
        readiness.Check("exits badly", [python, "-c", "import sys; print('the last word'); sys.exit(3)"], cap_s=60),
        readiness.Check("verified", [python, "-c", "pass"], cap_s=60, verify=lambda folder: f"no trace in {folder}"),
        readiness.Check("refused", [python, "-c", "raise SystemExit(9)"], cap_s=60, refusal="pytest is not installed"),
        readiness.Check("hangs", [python, "-c", "import time; print('waiting', flush=True); time.sleep(60)"], cap_s=1),
    ]
    said = []
    outcomes = readiness.run_checks(checks, tmp_path, said.append)
    assert said[0].startswith(f"[1/5] passes: {python} -c")
    lines = [outcome.line() for outcome in outcomes]
    assert lines[0] == "passes: ok (0 s)"
    assert lines[1] == f"exits badly: FAILED: exit 3, the last word; log {tmp_path / 'exits-badly.log'} (0 s)"
    assert lines[2] == f"verified: FAILED: no trace in {tmp_path}; log {tmp_path / 'verified.log'} (0 s)"
    assert lines[3] == f"refused: FAILED: pytest is not installed; log {tmp_path / 'refused.log'} (0 s)"
    assert lines[4] == f"hangs: FAILED: did not finish within 1 s; log {tmp_path / 'hangs.log'} (1 s)"
    assert (tmp_path / "passes.log").read_text() == "fine\n"
    assert (tmp_path / "hangs.log").read_text().startswith("waiting\n")  # its output up to the cap is kept
    assert "KeyboardInterrupt" in (tmp_path / "hangs.log").read_text()  # stopped as Ctrl-C stops it


@contextmanager
def sigint(handler):
    """SIGINT handled as `handler` says for the block, whatever this process inherited (a background job, a CI
    runner, starts it ignored)."""
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_check_at_its_cap_is_interrupted_even_where_the_doctor_ignores_sigint(tmp_path):
    hangs = readiness.Check("hangs", [sys.executable, "-c", "import time; time.sleep(60)"], cap_s=1)
    started = time.monotonic()
    with sigint(signal.SIG_IGN):
        [outcome] = readiness.run_checks([hangs], tmp_path, lambda text: None)
    assert time.monotonic() - started < readiness.STOP_GRACE_S
    assert outcome.problem == "did not finish within 1 s"
    assert "KeyboardInterrupt" in (tmp_path / "hangs.log").read_text()  # stopped by the interrupt, not killed


def test_ctrl_c_during_a_check_stops_its_process_and_reaches_the_command_line(tmp_path):
    """The command line maps KeyboardInterrupt to one line and exit 130; the check's process, in a session of
    its own (so a check at its cap can be stopped with its children), is stopped first."""
    interrupts_its_parent = ("import os, signal, time; os.kill(os.getppid(), signal.SIGINT); "
                             "print('interrupted the doctor', flush=True); time.sleep(60)")
    started = time.monotonic()
    with sigint(signal.default_int_handler), pytest.raises(KeyboardInterrupt):
        readiness.run_checks([readiness.Check("long", [sys.executable, "-c", interrupts_its_parent], cap_s=60)],
                             tmp_path, lambda text: None)
    assert time.monotonic() - started < readiness.STOP_GRACE_S
    assert "KeyboardInterrupt" in (tmp_path / "long.log").read_text()


def test_the_doctor_runs_the_gpu_tests_the_smoke_a_trace_and_a_night_of_three_nightly_points(tmp_path):
    checks = readiness.runner_checks(tmp_path, "python3")
    assert [check.name for check in checks] == ["gpu tests", "gpu smoke", "traced profile", "gate night"]
    tests, smoke, profile, night = (" ".join(check.command) for check in checks)
    assert " -m pytest -m gpu " in tests and "--suite gpu-smoke --device cuda" in smoke
    assert "profile --device cuda" in profile and "--baseline HEAD --screen-pairs 2 --refine-points 0" in night
    assert f"--suite {readiness.NIGHT_SUITE}" in night and f"--night-s {readiness.NIGHT_S}" in night
    nightly = {point.key: point.config for point in suites.load("nightly").points}
    points = suites.load(readiness.NIGHT_SUITE).points
    assert len(points) == 3 and all(nightly.get(point.key) == point.config for point in points)


def test_a_check_whose_verify_raises_ends_in_its_one_line_and_the_next_checks_still_run(tmp_path):
    python = sys.executable
    not_a_store = tmp_path / "results.sqlite"
    not_a_store.write_bytes(b"not a database " * 100)
    checks = [
        readiness.Check("gpu smoke", [python, "-c", "pass"], cap_s=60,
                        verify=lambda folder: readiness.smoke_roofline_problem(not_a_store, folder / "gpu-smoke.log")),
        readiness.Check("after it", [python, "-c", "print('ran')"], cap_s=60),
    ]
    outcomes = readiness.run_checks(checks, tmp_path, lambda text: None)
    smoke, after = (outcome.line() for outcome in outcomes)
    assert smoke.startswith("gpu smoke: FAILED: its verification raised BadInput: store: ")
    assert "is not an rlperf results store" in smoke and "\n" not in smoke
    assert after == "after it: ok (0 s)" and (tmp_path / "after-it.log").read_text() == "ran\n"


def test_a_copy_without_git_refuses_the_gate_night_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "tests").mkdir()
    monkeypatch.setattr(readiness, "REPO_ROOT", tmp_path)
    night = readiness.runner_checks(tmp_path / "out", "python3")[-1]
    assert night.name == "gate night"
    assert night.refusal == (f"no .git in {tmp_path}: the night builds HEAD beside the working tree, so it runs from "
                             f"a git checkout (a copy without .git cannot)")
    tmp_path.joinpath("out").mkdir()
    outcome, = readiness.run_checks([night], tmp_path / "out", lambda text: None)
    assert outcome.line().startswith(f"gate night: FAILED: no .git in {tmp_path}: ")
