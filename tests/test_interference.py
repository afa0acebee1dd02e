"""Was the machine quiet? A real trainer repeat with a CPU hog beside it is marked contended, with the
reason; the cores a process may use honour a cgroup quota."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benches.runner import PointRunner, UtilizationProbe
from rlperf.store import PointRecord, utc_now
from benches.suite import Point
from profilers.interference import OTHERS_CORES_LIMIT, InterferenceMonitor, contention
from reference_trainer.config import TrainConfig
from rlperf.cpus import cgroup_quota, usable_cores

POINT = {**TrainConfig().to_dict(), "env": "synthetic", "num_envs": 16, "horizon": 8, "minibatch_size": 64,
         "hidden_size": 32, "total_steps": 4096, "threads": 1}


def test_a_cgroup_quota_caps_the_usable_cores(tmp_path):
    quota = tmp_path / "cpu.max"
    quota.write_text("150000 100000\n")
    assert cgroup_quota(quota) == 1.5
    quota.write_text("max 100000\n")
    assert cgroup_quota(quota) is None
    assert cgroup_quota(tmp_path / "absent") is None
    assert 1 <= usable_cores() <= len(os.sched_getaffinity(0))


def test_the_monitor_counts_a_childs_cpu_as_the_trainers_not_as_others():
    monitor = InterferenceMonitor()
    monitor.start()
    subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 1.0\n"
                    "while time.process_time() < end: pass"], check=True)
    account = monitor.stop()
    # the child burned one second of its own CPU time, however busy the machine (start-up adds a little)
    assert 0.95 <= account["trainer_cpu_s"] < 1.5
    assert account["others_cpu_s"] >= 0 and account["wall_s"] >= 1.0


@pytest.mark.slow
def test_a_repeat_beside_a_cpu_hog_is_marked_contended(tmp_path):
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        runner = PointRunner(tmp_path, 1, 300.0, UtilizationProbe(0))
        record = PointRecord("{}", POINT, "ok", utc_now(), 0.0)
        status, reason, summary = runner.run_repeat(Point("{}", {}, POINT), 0, Path(tmp_path), [], record)
    finally:
        hog.kill()
        hog.wait()
    assert status == "ok", reason
    account = summary["interference"]
    # the hog spins one whole core for the whole repeat, whatever else the machine does
    assert account["others_cores"] > max(OTHERS_CORES_LIMIT, 0.5)
    assert account["contended"] and "other processes used" in account["why"]
    assert [kind for kind, _ in contention(account)][0] == "other processes used the CPU"
    assert account["trainer_cores"] > 0.3
