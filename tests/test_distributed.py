"""Two gloo ranks on CPU: training runs, one update matches one rank (on two GPUs too, over nccl), a dead or
silent rank fails the run and is named, a taken rendezvous port is retried. No test here depends on how fast a
process starts. The watchdog's own rules are tested in test_processes.py."""

import contextlib
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from reference_trainer import distributed
from reference_trainer.config import from_dict
from reference_trainer.policy import Policy
from rlperf import processes
from rlperf.machine import probe
from rlperf.processes import RANK_DIR_ENV, Heartbeat, heartbeat_path

TRAIN = [sys.executable, "-m", "rlperf", "train", "--quiet"]


def run_train(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*TRAIN, *args], capture_output=True, text=True, timeout=timeout)


def test_two_ranks_train_and_report_every_rank_and_trace_apart(tmp_path):
    out, traces = tmp_path / "summary.json", tmp_path / "traces"
    proc = run_train("--env", "synthetic", "--num-envs", "16", "--horizon", "8", "--minibatch-size", "64",
                     "--hidden-size", "32", "--total-steps", "512", "--world-size", "2", "--json", str(out),
                     "--trace-dir", str(traces))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    assert summary["world_size"] == 2 and summary["config"]["device"] == "cpu"
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert all(r["sps"] > 0 and set(r["phases"]) == set(summary["phases"]) for r in summary["ranks"])
    assert sorted(p.name for p in traces.iterdir()) == ["trace.json.gz", "trace.rank1.json.gz"]
    assert summary["trace"] == str(traces / "trace.json.gz")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")])])
def test_two_ranks_with_half_the_envs_each_match_one_rank_after_one_update(tmp_path, device):
    # gloo on CPUs, nccl and DDP's bucketed all-reduce of CUDA gradients on GPUs
    common = ["--env", "synthetic", "--num-envs", "16", "--horizon", "8", "--minibatch-size", "128",
              "--update-epochs", "1", "--hidden-size", "32", "--total-steps", "128", "--warmup-epochs", "0",
              "--device", device]
    for world in (1, 2):
        proc = run_train(*common, "--world-size", str(world), "--save-policy", str(tmp_path / f"w{world}.pt"))
        assert proc.returncode == 0, proc.stderr
    one, two = (torch.load(tmp_path / f"w{w}.pt", map_location="cpu") for w in (1, 2))
    torch.manual_seed(1)  # the trainer's default seed: the policy both runs started from
    untrained = Policy(32, 4, 32, use_lstm=True, fused_cell=True).state_dict()
    moved = 0.0
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-6)
        moved = max(moved, (one[name] - untrained[name]).abs().max().item())
    # One Adam step moves each weight by about the learning rate (3e-3) at most: the update happened,
    # and the untrained policy above is really where both runs started.
    assert 1e-4 < moved < 6e-3


def first_beat(rank: psutil.Process, deadline: float) -> None:
    """Waits for the rank's first beat (it is training), read from the heartbeat file the launcher watches."""
    beat_file = heartbeat_path(Path(rank.environ()[RANK_DIR_ENV]), 1)
    while time.monotonic() < deadline:
        progress = Heartbeat.read(beat_file)
        if progress is not None and progress.count > 0:
            return
        time.sleep(0.05)
    raise AssertionError("rank 1 never beat")


def start_long_run(*extra: str) -> tuple[subprocess.Popen, psutil.Process]:
    """A two-rank run far longer than the test, and its rank 1 process once it is training."""
    launcher = subprocess.Popen(
        [*TRAIN, "--env", "synthetic", "--num-envs", "16", "--horizon", "8", "--minibatch-size", "64",
         "--total-steps", "10000000", "--world-size", "2", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 120  # only a bound: a slow machine waits longer, a fast one does not wait
    try:
        while time.monotonic() < deadline:
            assert launcher.poll() is None, launcher.communicate()[1]
            for child in psutil.Process(launcher.pid).children():
                with contextlib.suppress(psutil.Error):
                    if child.environ().get("RANK") == "1":
                        first_beat(child, deadline)
                        return launcher, child
            time.sleep(0.1)
        raise AssertionError("rank 1 never started")
    except BaseException:
        launcher.kill()
        raise


def test_more_cpu_ranks_than_cores_are_refused_before_any_starts():
    proc = subprocess.run([sys.executable, "-m", "rlperf", "train", "--device", "cpu", "--world-size", "99999",
                           "--num-envs", "99999", "--horizon", "1", "--minibatch-size", "99999", "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "world_size: 99999 CPU ranks would share the" in proc.stderr
    # a suite's point asking for them is skipped, with the reason, rather than failed
    assert "99999 CPU ranks" in probe().skip_reason({"device": "cpu", "world_size": 99999, "dtype": "fp32"})
    assert probe().skip_reason({"device": "cpu", "world_size": 1, "dtype": "fp32"}) is None


def test_a_killed_rank_fails_the_run_in_time_and_is_named():
    launcher, victim = start_long_run()
    try:
        victim.kill()
        killed_at = time.monotonic()
        _, stderr = launcher.communicate(timeout=120)
        assert time.monotonic() - killed_at < 60
    finally:
        launcher.kill()
    assert launcher.returncode == 1
    assert "rlperf train: error: rank 1 was killed by SIGKILL" in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_a_silent_rank_fails_the_run_after_rank_timeout_and_is_named():
    launcher, victim = start_long_run("--rank-timeout", "3")
    try:
        victim.suspend()
        stopped_at = time.monotonic()
        _, stderr = launcher.communicate(timeout=120)
        # the silence counts from the last beat, before the suspend: the bound is only generous
        assert time.monotonic() - stopped_at < 60
    finally:
        launcher.kill()
        with contextlib.suppress(psutil.NoSuchProcess):
            victim.kill()
    assert launcher.returncode == 1
    named = re.search(r"rank 1 made no progress for ([0-9.]+) s \(rank_timeout 3 s\)", stderr)
    assert named and float(named.group(1)) >= 3, stderr


def still_running(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Those of `processes` still running after waiting up to `timeout` seconds for them to end (a zombie,
    left for a parent that does not reap it, has ended)."""
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    running = []
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            if process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
    return running


def test_the_ranks_die_with_a_launcher_killed_outright():
    launcher, rank1 = start_long_run()
    try:
        ranks = [child for child in psutil.Process(launcher.pid).children() if child.pid != rank1.pid] + [rank1]
        launcher.kill()  # SIGKILL: the launcher can clean nothing up
        launcher.wait()
        survivors = still_running(ranks, timeout=60)
    finally:
        for rank in ranks:
            with contextlib.suppress(psutil.NoSuchProcess):
                rank.kill()
    assert len(ranks) == 2 and not survivors, survivors


def test_a_taken_rendezvous_port_is_retried_on_a_new_one(monkeypatch):
    picked = []
    with socket.socket() as squatter:  # another process listening on the port the launcher picks first
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken, pick = squatter.getsockname()[1], processes.free_local_port

        def taken_first() -> int:
            picked.append(pick() if picked else taken)
            return picked[-1]

        monkeypatch.setattr(processes, "free_local_port", taken_first)
        summary = distributed.launch(from_dict(dict(env="synthetic", num_envs=16, horizon=8, minibatch_size=64,
                                                    hidden_size=32, total_steps=256, world_size=2)), "")
    assert len(picked) == 2 and picked[0] == taken != picked[1]
    assert summary["world_size"] == 2 and [r["rank"] for r in summary["ranks"]] == [0, 1]
