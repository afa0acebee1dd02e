"""Sweeps: failures become stored points and the sweep goes on; the real trainer end to end; SIGKILL and
--resume. The stand-in command is used only where a crash, a hang or a lie is the point of the test."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from rlperf.machine import Machine
from rlperf.store import Store
from benches.options import ProcessOptions
from benches.sweep import Sweep
from rlperf.processes import RANK_DIR_ENV, Heartbeat, heartbeat_path

CPU_MACHINE = Machine(torch="2.13.0+cpu", cuda=None, cudnn=None, nccl=None, gpus=[])
# Tiny real-trainer settings: a few epochs of a small synthetic-env policy, seconds per process.
TINY_SETTINGS = """
    env = "synthetic"
    horizon = 8
    hidden_size = 16
    minibatch_size = 64
    update_epochs = 1
    total_steps = 512
"""
TINY = '\n[fixed]\ndevice = "cpu"\n' + textwrap.dedent(TINY_SETTINGS)
STAND_IN = textwrap.dedent("""
    import json, sys, time
    behaviour, config, summary_path = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    if behaviour == "crash":
        print("RuntimeError: CUDA out of memory (pretend)", file=sys.stderr)
        sys.exit(3)
    if behaviour == "hang":
        print("started", flush=True)
        time.sleep(120)
    if behaviour == "lie":
        config = {**config, "dtype": "fp32"}
    epoch = {"steps": 100, "seconds": 0.1, "warmup": False, "phases": {"learn": 0.05}}
    summary = {"schema": 2, "sps": 1000.0 + config["num_envs"], "sps_end_to_end": 900.0, "warmup_seconds": 0.1,
               "wall_seconds": 0.2, "steps": 200, "steady_steps": 100, "steady_seconds": 0.1, "epochs": [epoch],
               "phases": {"learn": 0.05}, "mean_episode_return": 1.0, "config": config}
    open(summary_path, "w").write(json.dumps(summary))
""")


def write_suite(tmp_path, options, axes, fixed=TINY):
    """A suite of top-level `options`, the `fixed` settings (TINY's, on the CPU) and `axes` (TOML sections)."""
    path = tmp_path / "trial.toml"
    path.write_text("\n".join(textwrap.dedent(part) for part in (options, fixed, axes)))
    return path


def console():
    return Console(file=io.StringIO(), width=200)


def test_crash_hang_and_ignored_setting_become_stored_points_and_the_sweep_goes_on(tmp_path):
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(STAND_IN)
    behaviours = {8: "ok", 16: "crash", 24: "hang", 32: "lie", 40: "ok"}

    def command_for(config, summary_path):
        behaviour = behaviours[config["num_envs"]]
        return [sys.executable, str(stand_in), behaviour, json.dumps(config), str(summary_path)]

    suite = write_suite(tmp_path, "", """
        [axes]
        num_envs = [8, 16, 24, 32, 40]
        dtype = ["bf16"]
        [[sweep]]
        [[sweep]]
        device = ["cuda"]
        [[exclude]]
        device = "cuda"
        num_envs = [16, 24, 32, 40]
    """, fixed="[fixed]\n" + textwrap.dedent(TINY_SETTINGS))  # a stand-in trainer: the device is the axis
    out = tmp_path / "out"
    screen = console()
    # The timeout must cover interpreter start-ups on a busy machine; the hang (120 s) is what it must cut.
    sweep = Sweep(ProcessOptions(suite=str(suite), out_dir=out, repeats=2, timeout_s=15.0, sample_hz=20), screen,
                  command_for=command_for, machine=CPU_MACHINE)
    started = time.monotonic()
    assert sweep.run() == 1  # some points failed: the exit status says so
    assert time.monotonic() - started < 100  # the hang was cut at the timeout, not waited out

    with Store.open(out / "results.sqlite", readonly=True) as store:
        run_id = store.latest_run()
        points = store.points(run_id).set_index("point_key")
        samples = store.samples(run_id)
        assert store.runs().loc[0, "status"] == "complete"
        utilization = store.utilization(run_id)
    status = {json.loads(key).get("device", json.loads(key)["num_envs"]): row.status for key, row in points.iterrows()}
    assert status == {8: "ok", 16: "failed", 24: "timeout", 32: "failed", 40: "ok", "cuda": "skipped"}
    reasons = {json.loads(key).get("device", json.loads(key)["num_envs"]): row.reason for key, row in points.iterrows()}
    assert "repeat 1 of 2: exit code 3\n" in reasons[16] and "CUDA out of memory (pretend)" in reasons[16]
    assert reasons[24].startswith("repeat 1 of 2: killed after 15 s\n") and "started" in reasons[24]
    assert "the trainer ran dtype='fp32' but the point asked for 'bf16'" in reasons[32]
    assert "device=cuda needs a CUDA GPU" in reasons["cuda"]
    assert sorted(samples.groupby("point_key").size().tolist()) == [2, 2]
    assert set(samples["sps"]) == {1008.0, 1040.0}
    assert set(utilization["source"]) == {"cpu"} and set(utilization["repeat"]) == {0, 1}
    # the hanging stand-in was killed with its whole process group, not left behind
    assert not [p for p in psutil.process_iter(["cmdline"]) if "hang" in (p.info["cmdline"] or [])]
    text = screen.file.getvalue()
    assert "[5/5] num_envs=40, dtype=bf16: 1,040 SPS" in text and "timeout" in text


def run_bench(*args, cwd):
    return subprocess.run([sys.executable, "-m", "rlperf", "bench", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


@pytest.mark.slow
def test_real_trainer_sweep_stores_every_sample_and_exports(tmp_path):
    suite = write_suite(tmp_path, "repeats = 2", """
        [axes]
        num_envs = [8]
        lstm = [true, false]
    """)
    done = run_bench("--suite", str(suite), "--out", "out", "--export", "out/samples.csv", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[2/2] num_envs=8, lstm=false:" in done.stdout and "SPS" in done.stdout
    # its tables fit a CI log's 160 columns, every header whole and every row on one line
    table_lines = [line for line in done.stdout.splitlines() if line.startswith(("┃", "│"))]
    assert table_lines and max(map(len, table_lines)) <= 160
    assert all(f" {header} ┃" in done.stdout for header in ("num_envs", "contended", "detects", "h2d MB/s", "learn"))
    assert sum(line.startswith("│ 8 ") for line in table_lines) == 4  # 2 points, in each of the two tables
    with Store.open(tmp_path / "out" / "results.sqlite", readonly=True) as store:
        run_id = store.latest_run()
        counts = store.row_counts()
        samples = store.samples(run_id)
    assert counts["points"] == 2 and counts["samples"] == 4 and counts["utilization"] > 0
    assert (samples["sps"] > 0).all() and (samples["wall_seconds"] > samples["warmup_seconds"]).all()
    assert [s.config["lstm"] for s in samples["summary"]] == [True, True, False, False]
    assert all(set(phases) <= {"env", "eval_copy", "eval_forward", "eval_misc", "train_misc", "train_forward",
                               "learn", "log"} for phases in samples["phases"])
    assert (tmp_path / "out" / "samples.csv").read_text().count("\n") == 5
    # 32 float32 observation values, a reward and a done flag per agent step
    assert [s.h2d_bytes_per_step for s in samples["summary"]] == [136] * 4
    report = (tmp_path / "out" / run_id / "report" / "report.md").read_text()
    assert "| host→device B/step | host→device MB/s |" in report and report.count("| 136 |") == 2
    logs = sorted((tmp_path / "out" / run_id / "points").glob("*/repeat-*.log"))
    assert len(logs) == 4 and logs[0].read_text().startswith("$ ")


@pytest.mark.slow
def test_sigkill_loses_at_most_the_point_in_flight_and_resume_finishes_the_run(tmp_path):
    suite = write_suite(tmp_path, "repeats = 1\nsample_hz = 0", """
        [axes]
        num_envs = [8, 16, 24, 32]
    """)
    store_path = tmp_path / "out" / "results.sqlite"
    sweep = subprocess.Popen([sys.executable, "-m", "rlperf", "bench", "--suite", str(suite), "--out", "out"],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    trainers = trainers_in_flight_after_a_stored_point(sweep, store_path)
    os.kill(sweep.pid, signal.SIGKILL)
    sweep.wait()
    # the trainer in flight dies with the harness rather than loading the machine during the resumed run
    wait_until_gone(trainers)

    with Store.open(store_path, readonly=True) as store:
        run_id = store.latest_run()
        before = store.row_counts()
        assert store.runs().loc[0, "status"] == "running"
    with sqlite3.connect(store_path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert 1 <= before["points"] < 4 and before["samples"] == before["points"]

    done = run_bench("--suite", str(suite), "--out", "out", "--resume", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resuming run {run_id}: {before['points']} of 4 points already stored" in done.stdout
    with Store.open(store_path, readonly=True) as store:
        after = store.row_counts()
        assert list(store.runs()["status"]) == ["complete"] and store.latest_run() == run_id
        assert store.points(run_id)["status"].tolist() == ["ok"] * 4
    assert after["runs"] == 1 and after["points"] == 4 and after["samples"] == 4


TWO_RANKS = """
    repeats = 1
    sample_hz = 0
    timeout_s = 600

    [fixed]
    env = "synthetic"
    device = "cpu"
    num_envs = 16
    horizon = 8
    hidden_size = 16
    minibatch_size = 64
    total_steps = 100000000
    world_size = 2
"""


def test_sigkill_of_the_harness_ends_the_ranks_of_a_multi_rank_point(tmp_path):
    """harness -> trainer launcher -> ranks: each dies with the one that started it, so nothing trains on."""
    suite = tmp_path / "two_ranks.toml"
    suite.write_text(textwrap.dedent(TWO_RANKS))
    sweep = subprocess.Popen([sys.executable, "-m", "rlperf", "bench", "--suite", str(suite), "--out", "out"],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    descendants: list[psutil.Process] = []
    try:
        training_ranks(sweep, 2)
        descendants = psutil.Process(sweep.pid).children(recursive=True)
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait()
        wait_until_gone(descendants)
    finally:
        sweep.kill()
        for process in descendants:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def training_ranks(sweep: subprocess.Popen, world_size: int) -> list[psutil.Process]:
    """The sweep's rank processes once each has beaten (it is training), read from their heartbeat files."""
    deadline = time.monotonic() + 180  # only a bound: a slow machine waits longer, a fast one does not wait
    while time.monotonic() < deadline:
        assert sweep.poll() is None, "the sweep ended before its ranks trained"
        ranks = []
        for child in psutil.Process(sweep.pid).children(recursive=True):
            try:
                env = child.environ()
            except psutil.Error:
                continue
            if RANK_DIR_ENV in env:
                progress = Heartbeat.read(heartbeat_path(Path(env[RANK_DIR_ENV]), int(env["RANK"])))
                if progress is not None and progress.count > 0:
                    ranks.append(child)
        if len(ranks) == world_size:
            return ranks
        time.sleep(0.1)
    raise AssertionError(f"{world_size} training ranks did not appear within three minutes")


def stored_points(store_path) -> int:
    if not store_path.exists():
        return 0
    with sqlite3.connect(f"file:{store_path}?mode=ro", uri=True) as db:
        try:
            return db.execute("SELECT COUNT(*) FROM points").fetchone()[0]
        except sqlite3.OperationalError:
            return 0


def trainer_processes(harness_pid: int) -> list[psutil.Process]:
    """The harness's `rlperf train` descendants, started fresh or forked (titled so by the fork server), not
    its utilization sampler, fork server or other helpers."""
    found = []
    for child in psutil.Process(harness_pid).children(recursive=True):
        try:
            if "train" in child.cmdline() or child.name() == "rlperf train":
                found.append(child)
        except psutil.NoSuchProcess:  # a repeat that ended between listing and reading
            continue
    return found


def trainers_in_flight_after_a_stored_point(sweep: subprocess.Popen, store_path) -> list[psutil.Process]:
    """Waits until a point is stored and the next point's trainer is running, and returns that trainer:
    a kill between points would check nothing."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert sweep.poll() is None, "the sweep ended before it could be killed"
        if stored_points(store_path) >= 1:
            trainers = trainer_processes(sweep.pid)
            if trainers:
                return trainers
        time.sleep(0.05)
    raise AssertionError("no trainer in flight after a stored point within three minutes")


def wait_until_gone(processes: list[psutil.Process], timeout: float = 60) -> None:
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    left = []
    for process in alive:
        try:
            if process.status() != psutil.STATUS_ZOMBIE:
                left.append(process)
        except psutil.NoSuchProcess:
            continue
    assert not left, left

