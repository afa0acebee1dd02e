"""Two gloo ranks on CPU: training runs, one update matches one rank, a dead rank fails the run in time."""

import contextlib
import json
import subprocess
import sys
import time

import psutil
import torch

TRAIN = [sys.executable, "-m", "rlperf", "train", "--quiet"]


def run_train(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*TRAIN, *args], capture_output=True, text=True, timeout=timeout)


def test_two_ranks_train_and_report_every_rank(tmp_path):
    out = tmp_path / "summary.json"
    proc = run_train("--env", "synthetic", "--num-envs", "16", "--horizon", "8", "--minibatch-size", "64",
                     "--hidden-size", "32", "--total-steps", "512", "--world-size", "2", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    assert summary["world_size"] == 2
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    assert all(r["sps"] > 0 and set(r["phases"]) == set(summary["phases"]) for r in summary["ranks"])


def test_two_ranks_with_half_the_envs_each_match_one_rank_after_one_update(tmp_path):
    common = ["--env", "synthetic", "--num-envs", "16", "--horizon", "8", "--minibatch-size", "128",
              "--update-epochs", "1", "--hidden-size", "32", "--total-steps", "128", "--warmup-epochs", "0"]
    for world in (1, 2):
        proc = run_train(*common, "--world-size", str(world), "--save-policy", str(tmp_path / f"w{world}.pt"))
        assert proc.returncode == 0, proc.stderr
    one, two = (torch.load(tmp_path / f"w{w}.pt") for w in (1, 2))
    initial_differs = False
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-6)
        initial_differs |= not torch.equal(one[name], torch.zeros_like(one[name]))
    assert initial_differs


def start_long_run(*extra: str) -> tuple[subprocess.Popen, psutil.Process]:
    """A two-rank run far longer than the test, and its rank 1 process once it is training."""
    launcher = subprocess.Popen(
        [*TRAIN, "--env", "synthetic", "--num-envs", "16", "--horizon", "8", "--minibatch-size", "64",
         "--total-steps", "10000000", "--world-size", "2", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for child in psutil.Process(launcher.pid).children():
            try:
                if child.environ().get("RANK") == "1":
                    time.sleep(3)  # let the ranks get into training
                    return launcher, child
            except psutil.Error:
                pass
        time.sleep(0.2)
    launcher.kill()
    raise AssertionError("rank 1 never started")


def test_a_killed_rank_fails_the_run_in_time_and_is_named():
    launcher, victim = start_long_run()
    try:
        victim.kill()
        killed_at = time.monotonic()
        _, stderr = launcher.communicate(timeout=60)
        assert time.monotonic() - killed_at < 30
    finally:
        launcher.kill()
    assert launcher.returncode == 1
    assert "rlperf train: error: rank 1 exited with code -9" in stderr
    assert len(stderr.strip().splitlines()) == 1


def test_a_silent_rank_fails_the_run_after_rank_timeout_and_is_named():
    launcher, victim = start_long_run("--rank-timeout", "3")
    try:
        victim.suspend()
        stopped_at = time.monotonic()
        _, stderr = launcher.communicate(timeout=60)
        assert 3 <= time.monotonic() - stopped_at < 20
    finally:
        launcher.kill()
        with contextlib.suppress(psutil.NoSuchProcess):
            victim.kill()
    assert launcher.returncode == 1
    assert "rank 1 made no progress for 3 s" in stderr
