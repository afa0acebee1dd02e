"""`rlperf selfcheck`: passes when every injected delay lands in its phase, alone and all at once; exits 1
when the timer charges a delay to the wrong phase, and says `contended` rather than FAIL, with the reason,
when another process used the machine meanwhile; refuses settings it cannot check with exit 2."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from profilers import interference
from reference_trainer import attribution
from reference_trainer.config import PHASES
from reference_trainer.timing import PhaseTimer
from command.cli import main


@pytest.mark.slow
def test_every_delay_lands_in_its_phase_alone_and_all_at_once(capsys):
    # On a busy machine a phase's median can drift by 10-20 ms between runs; 400 ms keeps that inside the
    # 5% margin, and four steady epochs a run keep one descheduled epoch from setting the median.
    code = main(["selfcheck", "--device", "cpu", "--delay-ms", "400", "--epochs", "6"])
    out = capsys.readouterr().out
    for phase in PHASES:
        assert f"{phase} {attribution.ALL_AT_ONCE}" in out
    assert "FAIL" not in out
    # beside other work (other tests, other users) a share may be short: then it says so, and why
    short = 2 * len(PHASES) - out.count(" ok ")
    assert (code, short) == (0, 0) or (code == 1 and out.count("contended") >= short + 1
                                       and "contended: the " in out), out


def charge_the_delay_before_the_boundary(monkeypatch):
    original = PhaseTimer.enter

    def sleeps_before_the_boundary(self, phase):
        # the attribution bug selfcheck exists to catch: the work happens before the phase's mark
        if phase in self.delays and phase not in self.delayed_this_epoch:
            self.delayed_this_epoch.add(phase)
            time.sleep(self.delays[phase])
        original(self, phase)

    monkeypatch.setattr(PhaseTimer, "enter", sleeps_before_the_boundary)


def test_a_delay_charged_to_the_phase_before_fails_with_exit_1(monkeypatch, capsys):
    charge_the_delay_before_the_boundary(monkeypatch)
    # the verdict on a short share is the point here, so whatever else this machine runs counts as quiet
    monkeypatch.setattr(interference, "OTHERS_CORES_LIMIT", float("inf"))
    monkeypatch.setattr(interference, "STEAL_SHARE_LIMIT", float("inf"))
    assert main(["selfcheck", "--device", "cpu", "--delay-ms", "40", "--epochs", "4"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "contended" not in out


def test_a_short_share_beside_a_cpu_hog_says_contended_and_why(monkeypatch, capsys):
    charge_the_delay_before_the_boundary(monkeypatch)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert main(["selfcheck", "--device", "cpu", "--delay-ms", "40", "--epochs", "4"]) == 1
    finally:
        hog.kill()
        hog.wait()
    out = capsys.readouterr().out
    # the hog spins a whole core through every run, so every short share is contended, none a FAIL
    assert "contended" in out and "FAIL" not in out
    assert "run: other processes used" in out and "cores" in out
    assert "run selfcheck again on a quiet machine" in out


@pytest.mark.parametrize("args, needle", [
    (["--epochs", "3"], "--epochs: must be a whole number of 4 or more"),
    (["--delay-ms", "0"], "--delay-ms: must be a number above 0 and at most 60000"),
    (["--delay-ms", "-5"], "--delay-ms: must be a number above 0"),
    (["--delay-ms", "nan"], "--delay-ms: must be a number above 0"),
    (["--delay-ms", "inf"], "--delay-ms: must be a number above 0"),
    (["--epochs", "many"], "--epochs: must be a whole number of 4 or more"),
    (["--graph-scope", "both"], "--graph-scope: both makes a whole rollout or update one call, with no phase inside "
                                "it to delay or attribute (allowed: step)"),
])
def test_refusals_are_one_line_and_exit_2(args, needle, capsys):
    assert exit_code(["selfcheck", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_without_a_gpu_is_refused(capsys):
    assert exit_code(["selfcheck", "--device", "cuda", "--epochs", "4"]) == 2
    err = capsys.readouterr().err
    assert "device: cuda requested but CUDA is not available" in err and len(err.strip().splitlines()) == 1
def exit_code(argv: list[str]) -> int:
    """main's return value, or the code argparse exits with."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)
