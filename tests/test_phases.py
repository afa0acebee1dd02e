"""The phase API a user's loop calls (rlperf/phases.py): phases tile each epoch with `other` shown, warm-up
left out, steps counted, delays land in their phase, bad marks are one line naming them, and nothing is timed
unless the harness asks for a summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from rlperf import phases
from rlperf.machine import REPO_ROOT
from rlperf.summary import OTHER, RunSummary

LOOP = textwrap.dedent("""
    import time
    from rlperf import phases
    for epoch in range(4):
        for step in range(5):
            with phases.phase("eval_forward"):
                time.sleep(0.002)
            with phases.phase("env"):
                time.sleep(0.004)
            phases.steps(8)
        with phases.phase("train_forward"):
            time.sleep(0.01)
            with phases.phase("learn"):   # inside another phase: the inner one takes the time until it exits
                time.sleep(0.02)
        time.sleep(0.01)                  # claimed by no phase: other
        phases.end_epoch()
""")


def run_loop(tmp_path, source: str = LOOP, **environ: str) -> subprocess.CompletedProcess:
    script = tmp_path / "loop.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **environ}
    env.pop(phases.OWNER_VARIABLE, None)
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)


def test_a_users_loop_writes_phases_that_tile_its_epochs_with_other_shown(tmp_path):
    path = tmp_path / "summary.json"
    done = run_loop(tmp_path, RLPERF_SUMMARY=str(path))
    assert done.returncode == 0, done.stderr
    summary = RunSummary.check(json.loads(path.read_text()))
    assert summary.writer == "phases" and len(summary.epochs) == 4 and summary.epochs[0]["warmup"]
    assert summary.steady_steps == 3 * 5 * 8 and summary.steps == 4 * 5 * 8
    per_epoch = {name: seconds / 3 for name, seconds in summary.phases.items()}
    # each phase gets at least what it slept, and the sleeps' overshoot (a fraction of a millisecond each) only
    for name, slept in (("eval_forward", 0.010), ("env", 0.020), ("train_forward", 0.010), ("learn", 0.020),
                        (OTHER, 0.010)):
        assert slept <= per_epoch[name] < slept + 0.008, (name, per_epoch)
    assert sum(summary.phases.values()) == pytest.approx(summary.steady_seconds, rel=1e-3)
    assert summary.phase_coverage == pytest.approx(1 - summary.phases[OTHER] / summary.steady_seconds, rel=1e-3)
    assert summary.attached["unclaimed"] == summary.phases[OTHER] and summary.work is None


def test_without_the_harness_nothing_is_timed_or_written(tmp_path):
    done = run_loop(tmp_path, source=LOOP + "\nassert not phases.active()\n")
    assert done.returncode == 0, done.stderr
    assert not list(tmp_path.glob("*.json"))


def test_an_injected_delay_lands_in_its_phase_once_an_epoch(tmp_path):
    plain, delayed = tmp_path / "plain.json", tmp_path / "delayed.json"
    assert run_loop(tmp_path, RLPERF_SUMMARY=str(plain)).returncode == 0
    assert run_loop(tmp_path, RLPERF_SUMMARY=str(delayed), RLPERF_INJECT_DELAY="env=30,learn=30").returncode == 0
    before, after = (RunSummary.read(json.loads(p.read_text())) for p in (plain, delayed))
    for name in ("env", "learn"):
        extra = (after.phases[name] - before.phases[name]) / 3
        assert 0.95 * 0.030 <= extra < 0.030 + 0.008, (name, extra)
    assert after.attached["delays_ms"] == {"env": 30.0, "learn": 30.0}


@pytest.mark.parametrize("source, line", [
    ("phases.phase('lern')", "unknown phase 'lern' (allowed: env, eval_copy"),
    ("phases.enter('env'); phases.exit('learn')",
     "unbalanced phase mark: exit of 'learn' while 'env' is the innermost phase open"),
    ("phases.exit('env')", "unbalanced phase mark: exit of 'env' while no phase is open"),
])
def test_an_unknown_or_unbalanced_mark_is_one_line_naming_it(tmp_path, source, line):
    done = run_loop(tmp_path, source=f"from rlperf import phases\n{source}\n", RLPERF_SUMMARY=str(tmp_path / "s.json"))
    assert done.returncode == 1 and any(f"rlperf.phases.PhaseError: {line}" in text
                                        for text in done.stderr.splitlines()), done.stderr


@pytest.mark.parametrize("source, why", [
    ("phases.steps(4)", "no epoch ended"),
    ("phases.steps(4); phases.end_epoch(); phases.steps(4); phases.end_epoch()", "no phase was marked in 2 epochs"),
    ("with phases.phase('env'): pass\nphases.steps(4); phases.end_epoch()", "all 1 epochs were warm-up"),
])
def test_a_run_that_cannot_be_summarised_writes_nothing_and_says_why_in_one_line(tmp_path, source, why):
    path = tmp_path / "s.json"
    done = run_loop(tmp_path, source=f"from rlperf import phases\n{source}\n", RLPERF_SUMMARY=str(path))
    assert done.returncode == 0 and not path.exists()
    assert done.stderr.strip() == f"rlperf.phases: no summary written: {why}" or \
        done.stderr.strip().startswith(f"rlperf.phases: no summary written: {why}")


def test_bad_harness_variables_are_one_line_and_exit_2(tmp_path):
    done = run_loop(tmp_path, source="import rlperf.phases\n", RLPERF_SUMMARY=str(tmp_path / "s.json"),
                    RLPERF_INJECT_DELAY="lern=5")
    assert done.returncode == 2
    assert done.stderr == "rlperf.phases: RLPERF_INJECT_DELAY: unknown phase 'lern' (allowed: env, eval_copy, " \
                          "eval_forward, eval_misc, train_misc, train_forward, learn, log)\n"


def test_a_forked_child_times_nothing_and_a_subprocess_writes_no_summary_of_its_own(tmp_path):
    path = tmp_path / "s.json"
    source = LOOP + textwrap.dedent("""
        import os, subprocess, sys
        pid = os.fork()
        if pid == 0:
            os._exit(0 if not phases.active() else 3)
        assert os.waitpid(pid, 0)[1] == 0
        child = subprocess.run([sys.executable, "-c", "import rlperf.phases as p; print(p.active())"],
                               capture_output=True, text=True)
        assert child.stdout.strip() == "False", child
    """)
    done = run_loop(tmp_path, source=source, RLPERF_SUMMARY=str(path))
    assert done.returncode == 0, done.stderr
    assert RunSummary.check(json.loads(path.read_text())).steady_steps == 120


def test_the_clock_reads_no_device_inside_an_epoch_on_the_cpu():
    clock = phases.PhaseClock(warmup_epochs=0)
    clock.enter("env")
    time.sleep(0.002)
    clock.exit("env")
    clock.steps(1)
    assert not clock.cuda and all(isinstance(stamp, float) for _, stamp in clock.marks)
    clock.end_epoch()
    assert clock.epochs[0]["phases"]["env"] >= 0.002


def test_a_traced_epoch_names_each_range_by_the_phase_its_marks_ended_with(tmp_path):
    import gzip

    trace = tmp_path / "trace.json.gz"
    clock = phases.TracedPhaseClock(str(trace), trace_epochs=1, warmup_epochs=1)
    for epoch in range(3):  # a warm-up epoch, the traced one, one more
        clock.enter("env")
        clock.exit("env")
        clock.steps(4)
        clock.enter("train_forward", delay=False)  # opened as training, then found to be acting (attach's case)
        clock.relabel(len(clock.marks) - 1, "train_forward", "eval_forward")
        clock.exit("eval_forward")
        clock.end_epoch()
    assert [epoch.get("traced", False) for epoch in clock.epochs] == [False, True, False] and clock.trace_written
    with gzip.open(trace, "rt") as file:
        names = [event["name"] for event in sorted(json.load(file)["traceEvents"], key=lambda event: event["ts"])
                 if event.get("ph") == "X" and event.get("cat") == "user_annotation"]
    assert names == ["ProfilerStep#1", OTHER, "env", OTHER, "eval_forward", OTHER]
    assert [label for label, _, _ in clock.summary().timeline] == [OTHER, "env", OTHER, "eval_forward", OTHER]


@pytest.mark.gpu
def test_on_cuda_queued_work_is_charged_to_the_phase_that_launched_it_with_one_sync_an_epoch_boundary(monkeypatch):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    syncs = []
    real = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: (syncs.append(1), real(*args)))
    clock = phases.PhaseClock(warmup_epochs=0)
    clock.steps(1)  # begins the epoch: one synchronisation
    clock.enter("learn")
    for _ in range(20):
        a = a @ a / 4096  # queued: the host runs ahead
    clock.exit("learn")
    clock.enter("env")  # a host phase that does not wait for the device
    clock.exit("env")
    assert len(syncs) == 1 and all(isinstance(stamp, torch.cuda.Event) for _, stamp in clock.marks)
    clock.end_epoch()
    learn, env = clock.epochs[0]["phases"]["learn"], clock.epochs[0]["phases"]["env"]
    assert learn > 10 * env and env < 0.001, clock.epochs[0]["phases"]


def test_selfcheck_runs_on_a_users_loop_and_lands_each_delay_in_its_phase(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(LOOP.replace("range(4)", "range(14)"))  # a warm-up epoch and six pairs a run
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop(phases.OWNER_VARIABLE, None)
    done = subprocess.run([sys.executable, "-m", "rlperf", "selfcheck", "--no-attach", "--delay-ms", "30", "--",
                           sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    # the four phases the loop marks, alone and all at once: each ok, or not on a busy machine and said so
    rows = [line for line in done.stdout.splitlines() if any(verdict in line for verdict in (" ok ", "FAIL",
                                                                                              "undecided"))]
    assert len(rows) == 8, done.stdout + done.stderr
    assert done.returncode == 0 or (done.returncode in (1, 3) and "contended: the " in done.stdout), done.stdout
