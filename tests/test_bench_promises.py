"""What the docs promise about `rlperf bench` and `rlperf train`, end to end on the CPU: SIGTERM marks a
run interrupted and --resume finishes it; --resume with nothing to resume starts afresh; --baseline and
RLPERF_BASELINE fail a bench that regressed, and a bad baseline stops it before any point runs; a
`profile = true` suite fills the traces table; every bench ends with its report; --compile runs on a CPU;
a torchrun job refuses a --world-size it did not start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from rlperf.errors import BadInput
from rlperf.store import Store
from profilers import interference
from command.cli import main

SUITE = """
    sample_hz = 0
    [fixed]
    device = "cpu"
    env = "synthetic"
    horizon = 8
    hidden_size = 16
    minibatch_size = 64
    update_epochs = 1
    threads = 1
"""


def write_suite(directory: Path, top: str, tables: str) -> Path:
    """`top`-level options, the small fixed settings, then `tables` ([axes], more of [fixed])."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "trial.toml"
    path.write_text(textwrap.dedent(top) + textwrap.dedent(SUITE) + textwrap.dedent(tables))
    return path


def bench(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlperf", "bench", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env={**os.environ, **(env or {})})


def assert_report_rendered(out: Path, run_id: str) -> None:
    report = out / run_id / "report"
    assert run_id in (report / "report.md").read_text()
    assert (report / "report.html").read_text().lstrip().lower().startswith("<!doctype html")


def test_sigterm_marks_the_run_interrupted_and_resume_finishes_it(tmp_path):
    suite = write_suite(tmp_path, "repeats = 1", """
        [axes]
        num_envs = [8, 16, 24]
        total_steps = [1024]
    """)
    store_path = tmp_path / "out" / "results.sqlite"
    sweep = subprocess.Popen([sys.executable, "-m", "rlperf", "bench", "--suite", str(suite), "--out", "out"],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_a_trainer_after_a_stored_point(sweep, store_path)
        sweep.send_signal(signal.SIGTERM)
        stdout, stderr = sweep.communicate(timeout=120)
    finally:
        sweep.kill()
    assert sweep.returncode == 130, stderr
    assert "rlperf bench: interrupted" in stderr
    with Store.open(store_path, readonly=True) as store:
        run_id = store.latest_run()
        assert store.runs()["status"].tolist() == ["interrupted"]
        stored = store.row_counts()["points"]
    assert 1 <= stored < 3
    assert f"interrupted: {stored} of 3 points are stored" in stdout

    done = bench("--suite", str(suite), "--out", "out", "--resume", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resuming run {run_id}: {stored} of 3 points already stored" in done.stdout
    with Store.open(store_path, readonly=True) as store:
        assert store.runs()["status"].tolist() == ["complete"]
        assert store.points(run_id)["status"].tolist() == ["ok"] * 3
    assert_report_rendered(tmp_path / "out", run_id)


def wait_for_a_trainer_after_a_stored_point(sweep: subprocess.Popen, store_path: Path) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert sweep.poll() is None, "the sweep ended before it could be interrupted"
        if store_path.exists():
            try:
                with Store.open(store_path, readonly=True) as store:
                    stored = store.row_counts()["points"]
            except BadInput:  # the sweep has made the file and not yet its schema
                stored = 0
            if stored and any("train" in cmdline(child) or name(child) == "rlperf train"
                              for child in psutil.Process(sweep.pid).children(recursive=True)):
                return
        time.sleep(0.05)
    raise AssertionError("no trainer in flight after a stored point within three minutes")


def cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.NoSuchProcess:
        return []


def name(process: psutil.Process) -> str:
    """The process's title: a forked trainer's is `rlperf train` (rlperf/forkserver.py)."""
    try:
        return process.name()
    except psutil.NoSuchProcess:
        return ""


@pytest.mark.slow
def test_a_regression_against_the_baseline_fails_the_bench_and_a_bad_baseline_runs_nothing(tmp_path, monkeypatch,
                                                                                            capsys):
    # Verdicts leave out repeats run on a busy machine, and a shared test machine is busy: that rule is
    # tested with the verdicts. Here every repeat counts as quiet, so the verdict depends on the speeds.
    monkeypatch.setattr(interference, "contention", lambda account: [])
    monkeypatch.chdir(tmp_path)
    # The same point twice: once as it is, once with 200 ms slept in `learn` every epoch (an injected
    # delay does not make another point), several times a tiny epoch's length. Five repeats a side is
    # enough for a test on the repeats themselves.
    axes = """
        [axes]
        num_envs = [8]
        total_steps = [640]
    """
    plain = write_suite(tmp_path / "plain", "repeats = 5", axes)
    slowed = write_suite(tmp_path / "slowed", "repeats = 5", "[fixed.inject_delay]\nlearn = 200.0\n" + axes)
    assert main(["bench", "--suite", str(plain), "--out", "out", "--resume"]) == 0
    out = capsys.readouterr().out
    assert "--resume: no unfinished run of suite trial" in out and "starting a new run" in out
    store_path = tmp_path / "out" / "results.sqlite"
    with Store.open(store_path, readonly=True) as store:
        baseline = store.latest_run()
    assert_report_rendered(tmp_path / "out", baseline)

    # a bad baseline stops the bench before anything is measured or stored
    for bad in (f"{store_path}::no-such-run", str(tmp_path / "missing.sqlite")):
        monkeypatch.setenv("RLPERF_BASELINE", bad)
        assert main(["bench", "--suite", str(slowed), "--out", "out"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("rlperf bench: error: ") and len(err.strip().splitlines()) == 1, err
        with Store.open(store_path, readonly=True) as store:
            assert store.row_counts()["runs"] == 1
    assert not (tmp_path / "missing.sqlite").exists()

    monkeypatch.setenv("RLPERF_BASELINE", f"{store_path}::{baseline}")
    assert main(["bench", "--suite", str(slowed), "--out", "out"]) == 1
    assert "regressions found" in capsys.readouterr().out
    with Store.open(store_path, readonly=True) as store:
        candidate = store.latest_run()
        assert store.points(candidate)["status"].tolist() == ["ok"]  # it ran; it was slower
    verdict_row = next(line for line in (tmp_path / "out" / candidate / "report" / "report.md").read_text().splitlines()
                       if line.startswith("| num_envs=8"))
    assert "regressed" in verdict_row and "learn" in verdict_row
    # --baseline does what the variable does, and wins over it: against the slowed run, the plain suite
    # is faster, not a regression
    assert main(["bench", "--suite", str(plain), "--out", "out", "--baseline", f"{store_path}::{candidate}"]) == 0
    assert f"against {store_path}::{candidate}" in capsys.readouterr().out.replace("\n", "")


def test_a_profile_suite_fills_the_traces_table(tmp_path):
    suite = write_suite(tmp_path, "repeats = 1\nprofile = true", """
        [axes]
        num_envs = [8]
        total_steps = [384]
    """)
    done = bench("--suite", str(suite), "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    with Store.open(tmp_path / "out" / "results.sqlite", readonly=True) as store:
        run_id = store.latest_run()
        traces = store.traces(run_id)
        samples = store.samples(run_id)
    assert len(traces) == 1 and len(samples) == 1  # the traced run is not a sample
    row = traces.iloc[0]
    assert json.loads(row["point_key"]) == {"num_envs": 8, "total_steps": 384}
    # the path is as the bench was given --out: relative to where it ran
    assert (tmp_path / row["path"]).is_file() and row["path"].endswith(".json.gz")
    summary = row["summary"] if isinstance(row["summary"], dict) else json.loads(row["summary"])
    assert summary["trace_summary"]["kind"] == "cpu" and summary["trace_summary"]["env_steps"] > 0
    assert_report_rendered(tmp_path / "out", run_id)


@pytest.mark.slow
def test_compile_runs_on_a_cpu_and_reports_its_time_apart(tmp_path):
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, "-m", "rlperf", "train", "--env", "synthetic", "--num-envs", "8",
                           "--horizon", "8", "--minibatch-size", "64", "--hidden-size", "16", "--total-steps", "256",
                           "--threads", "1", "--device", "cpu", "--compile", "--quiet", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    assert summary["config"]["compile"] is True and summary["compile_seconds"] > 0 and summary["sps"] > 0


def test_torchrun_refuses_a_world_size_it_did_not_start(tmp_path):
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "rlperf", "train", "--env", "synthetic", "--num-envs", "8", "--horizon", "8",
                           "--minibatch-size", "64", "--total-steps", "256", "--world-size", "4", "--device", "cpu", "--quiet"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode != 0
    assert "world_size: the launcher started 2 ranks but world_size is 4" in done.stdout + done.stderr
