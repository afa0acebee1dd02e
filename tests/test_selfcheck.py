"""`rlperf selfcheck`: passes when every injected delay lands in its phase, alone and all at once, by an interval
inside the band; exits 1 when the timer charges a delay to the wrong phase (too little or too much), 3 when the
budget ends undecided, and says `contended`, with the reason, when another process used the machine meanwhile;
refuses settings it cannot check with exit 2."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from decisions import attribution
from profilers import interference
from reference_trainer.config import PHASES
from reference_trainer.timing import PhaseTimer
from rlperf.phases import delayed_epoch
from command.cli import main


@pytest.mark.slow
def test_every_delay_lands_in_its_phase_alone_and_all_at_once(capsys):
    # six pairs a run: one run of each gives a row its interval
    code = main(["selfcheck", "--device", "cpu", "--delay-ms", "100", "--epochs", "14", "--max-runs", "3"])
    out = capsys.readouterr().out
    for phase in PHASES:
        assert f"{phase} (all" in out
    # beside other work (other tests, other users) a share may fall outside or stay undecided: then it says so, and why
    short = 2 * len(PHASES) - out.count(" ok ")
    assert (code, short) == (0, 0) or (code in (1, 3) and out.count("contended") >= short + 1
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
    assert main(["selfcheck", "--device", "cpu", "--delay-ms", "40", "--epochs", "10", "--max-runs", "2"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "contended" not in out


def test_a_short_share_beside_a_cpu_hog_says_contended_and_why(monkeypatch, capsys):
    charge_the_delay_before_the_boundary(monkeypatch)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert main(["selfcheck", "--device", "cpu", "--delay-ms", "40", "--epochs", "10", "--max-runs", "2"]) == 1
    finally:
        hog.kill()
        hog.wait()
    out = capsys.readouterr().out
    # the hog spins a whole core through every run, so every share that is not ok is contended
    assert "FAIL contended" in out and out.count("contended") >= out.count("FAIL")
    assert "run: other processes used" in out and "cores" in out
    assert "run selfcheck again on a quiet machine" in out


@pytest.mark.parametrize("args, needle", [
    (["--epochs", "5"], "--epochs: must be a whole number of 6 or more"),
    (["--max-runs", "0"], "--max-runs: must be a whole number of 1 or more"),
    (["--env-step", "sim:Sim.step"], "--env-step: names an env step of a command; give the command after --"),
    (["--delay-ms", "0"], "--delay-ms: must be a number above 0 and at most 60000"),
    (["--delay-ms", "-5"], "--delay-ms: must be a number above 0"),
    (["--delay-ms", "nan"], "--delay-ms: must be a number above 0"),
    (["--delay-ms", "inf"], "--delay-ms: must be a number above 0"),
    (["--epochs", "many"], "--epochs: must be a whole number of 6 or more"),
    (["--graph-scope", "both"], "--graph-scope: both makes a whole rollout or update one call, with no phase inside "
                                "it to delay or attribute (allowed: step)"),
])
def test_refusals_are_one_line_and_exit_2(args, needle, capsys):
    assert exit_code(["selfcheck", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_without_a_gpu_is_refused(capsys):
    assert exit_code(["selfcheck", "--device", "cuda", "--epochs", "6"]) == 2
    err = capsys.readouterr().err
    assert "device: cuda requested but CUDA is not available" in err and len(err.strip().splitlines()) == 1
def exit_code(argv: list[str]) -> int:
    """main's return value, or the code argparse exits with."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def test_the_interval_is_wilcoxons_and_needs_six_pairs_at_95_percent():
    values = [0.97, 1.02, 0.99, 1.01, 1.00, 0.98, 1.03, 1.04]
    estimate, low, high = attribution.walsh_interval(values)
    walsh = sorted((a + b) / 2 for i, a in enumerate(values) for b in values[i:])
    # n = 8: P(T <= 3) = 5/256 <= 2.5% < P(T <= 4) = 7/256, so the interval drops three Walsh averages a side
    assert (low, high) == (walsh[3], walsh[-4]) and low < estimate < high
    assert attribution.walsh_interval(values[:5])[1:] == (None, None)
    assert attribution.walsh_interval(values[:6])[1:] == (min(values[:6]), max(values[:6]))


@pytest.mark.parametrize("shares, verdict", [
    ([1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99], "ok"),
    ([0.5, 0.52, 0.49, 0.51, 0.5, 0.48], "FAIL"),  # charged elsewhere in part
    ([2.0, 1.98, 2.01, 2.02, 1.99, 2.0], "FAIL"),  # counted twice: over-attribution fails as under-attribution does
    ([1.0, 1.2, 0.8, 1.1, 0.9, 1.05], "undecided"),  # the interval crosses the band's edges
    ([1.0, 1.0, 1.0], "undecided"),  # too few pairs for an interval
])
def test_a_share_is_ok_inside_the_band_fail_outside_and_undecided_across_it(shares, verdict):
    row = attribution.RowVerdict("learn", "learn", list(shares))
    assert row.judge() == verdict


def test_pairs_are_adjacent_steady_epochs_one_delayed_and_one_not():
    def epoch(index, delayed, seconds, warmup=False):
        return {"epoch": index, "warmup": warmup, "delayed": ["learn"] if delayed else [], "phases": {"learn": seconds}}

    epochs = [epoch(0, False, 9.0, True), epoch(1, True, 0.55, True), epoch(2, False, 0.1), epoch(3, True, 0.6),
              epoch(4, False, 0.12), epoch(5, True, 0.61), epoch(6, False, 0.1)]
    # warm-up epochs are left out; (2, 3) and (4, 5) pair, 6 has no partner
    assert attribution.paired_shares(epochs, "learn", 0.5) == pytest.approx([1.0, 0.98])


def test_a_steady_drift_across_the_run_cancels_between_pairs():
    # each epoch 2% slower than the one before; the delay lands in full: pairs in both orders centre on 100%
    epochs = [{"warmup": index == 0, "delayed": ["learn"] if delayed_epoch(index, attribution.DELAY_EVERY, 1) else [],
               "phases": {"learn": 1.0 * 1.02 ** index + (0.5 if delayed_epoch(index, attribution.DELAY_EVERY, 1) else 0)}}
              for index in range(25)]
    shares = attribution.paired_shares(epochs, "learn", 0.5)
    assert min(shares) < 0.95 and max(shares) > 1.05  # each pair is biased by the drift, in turn either way
    estimate, low, high = attribution.walsh_interval(shares)
    assert estimate == pytest.approx(1.0, abs=0.01)


def test_rows_take_more_runs_until_decided_and_stop_at_the_budget():
    calls = []

    def run(name, delays):
        calls.append(name)
        noisy = "env" in delays and len(delays) == 1  # env's own runs: shares all over the place
        epochs = []
        for index in range(8):
            delayed = index % 2 == 1
            extra = {phase: (0.1 * (1 + (0.5 if noisy and index % 4 == 1 else -0.5 if noisy else 0)) if delayed
                             and phase in delays else 0.0) for phase in ("env", "learn")}
            epochs.append({"warmup": index == 0, "delayed": sorted(delays) if delayed else [],
                           "phases": {phase: 0.2 + extra[phase] for phase in ("env", "learn")}})
        return epochs

    rows = attribution.check(("env", "learn"), 100.0, run, max_runs=3)
    assert rows["learn"].verdict == "ok" and rows["learn"].runs == ["learn #1", "learn #2"]
    assert rows["env"].verdict == "undecided" and len(rows["env"].runs) == 3
    assert calls.count("env #3") == 1 and "learn #3" not in calls
