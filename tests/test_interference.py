"""Was the machine quiet? A real trainer repeat with a CPU hog beside it is marked contended, with the
reason; so is one while another program computes on the run's GPU (NVML's process list faked on a CPU, a
second CUDA process on a GPU); the cores a process may use honour a cgroup quota."""

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from benches.runner import PointRunner, UtilizationProbe
from rlperf.store import PointRecord, utc_now
from rlperf.summary import RunSummary
from benches.suite import Point
from profilers import interference
from profilers.interference import OTHERS_CORES_LIMIT, GpuQueryUnavailable, InterferenceMonitor, contention
from reference_trainer.config import TrainConfig
from rlperf.cpus import cgroup_quota, usable_cores

POINT = {**TrainConfig().to_dict(), "env": "synthetic", "num_envs": 16, "horizon": 8, "minibatch_size": 64,
         "hidden_size": 32, "total_steps": 4096, "threads": 1, "device": "cpu"}


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
    account = summary.interference
    # the hog spins one whole core for the whole repeat, whatever else the machine does
    assert account["others_cores"] > max(OTHERS_CORES_LIMIT, 0.5)
    assert account["contended"] and "other processes used" in account["why"]
    assert [kind for kind, _ in contention(account)][0] == "other processes used the CPU"
    assert account["trainer_cores"] > 0.3


GPU = "GPU-5a1e0000-0000-0000-0000-000000000001"
ABSENT_PID = 4_194_303  # above Linux's largest PID: a process of another PID namespace, as NVML may list one


@pytest.fixture
def other_program():
    """A real process that is not this test's descendant: started in a session of its own, then orphaned by
    its short-lived parent, as another program on the machine would be."""
    pid = start_other_program(["sleep", "3600"])
    yield pid
    os.kill(pid, 9)


def fake_nvml(monkeypatch, listing):
    """NVML's process list for GPU as `listing(call)` gives it, call counting from 0."""
    calls = []

    def nvml_gpu_pids(uuid):
        assert uuid == GPU
        calls.append(uuid)
        return listing(len(calls) - 1)

    monkeypatch.setattr(interference, "nvml_gpu_pids", nvml_gpu_pids)
    return calls


def test_another_program_on_the_runs_gpu_makes_the_repeat_contended_and_ours_do_not(monkeypatch, other_program):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    try:
        fake_nvml(monkeypatch, lambda call: [os.getpid(), child.pid, other_program])
        monitor = InterferenceMonitor([GPU])
        monitor.start()
        time.sleep(0.1)
        account = monitor.stop()
    finally:
        child.wait()
    assert account["gpu_other_processes"] == [f"{other_program} sleep"]
    assert account["contended"] and f"other programs computed on the GPU ({other_program} sleep)" in account["why"]
    assert "other programs on the GPU" in [kind for kind, _ in contention(account)]
    assert account["gpu_watch_unavailable"] is None


def test_a_program_that_computes_only_midway_is_seen_by_the_poll(monkeypatch, other_program):
    monkeypatch.setattr(interference, "GPU_POLL_S", 0.05)
    # listed on the third query only: neither at the start nor at the stop
    calls = fake_nvml(monkeypatch, lambda call: [other_program] if call == 2 else [])
    monitor = InterferenceMonitor([GPU])
    monitor.start()
    deadline = time.monotonic() + 10
    while len(calls) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    account = monitor.stop()
    assert account["gpu_other_processes"] == [f"{other_program} sleep"] and account["contended"]


def test_processes_outside_this_pid_namespace_count_before_the_run_and_beyond_its_own(monkeypatch):
    # Before the trainer starts, a PID this process cannot see is another program's; once it runs, an unseen
    # PID may be the trainer's own (NVML gives host PIDs inside a container), so only those beyond its count
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        fake_nvml(monkeypatch, lambda call: [ABSENT_PID] if call == 0 else [ABSENT_PID - 1])
        monitor = InterferenceMonitor([GPU])
        monitor.start()
        early = monitor.stop()
        # this process and each of its descendants (the child, and any helper an earlier test started, such as
        # multiprocessing's resource tracker) may be one of the unseen PIDs: one more than they is another's
        ours = 1 + len(psutil.Process().children(recursive=True))
        unseen = [ABSENT_PID - k for k in range(1, ours + 2)]
        fake_nvml(monkeypatch, lambda call: [] if call == 0 else unseen)
        monitor = InterferenceMonitor([GPU])
        monitor.start()
        late = monitor.stop()
    finally:
        child.kill()
        child.wait()
    assert early["gpu_other_processes"] == [f"{ABSENT_PID} (outside this PID namespace)"]
    assert late["gpu_other_processes"] == [f"{ABSENT_PID - 1} (outside this PID namespace)"]


def test_without_nvml_the_gpu_is_not_watched_and_the_account_says_why(monkeypatch):
    def unavailable(uuid):
        raise GpuQueryUnavailable("NVML unavailable (NVML Shared Library Not Found)")

    monkeypatch.setattr(interference, "nvml_gpu_pids", unavailable)
    monitor = InterferenceMonitor([GPU])
    monitor.start()
    result = monitor.stop()
    assert result["gpu_other_processes"] == []
    assert result["gpu_watch_unavailable"] == ("other programs on the GPU are not watched: NVML unavailable "
                                              "(NVML Shared Library Not Found)")
    assert "GPU" not in result["why"]


def test_the_real_nvml_query_names_a_gpu_it_cannot_see():
    # no driver, or a driver that knows no such GPU: either way a reason, never an exception
    with pytest.raises(GpuQueryUnavailable, match=r"NVML unavailable|NVML does not see|nvidia-ml-py"):
        interference.nvml_gpu_pids("GPU-00000000-0000-0000-0000-000000000000")


def test_a_sweep_repeat_beside_another_gpu_program_is_contended_with_the_reason(monkeypatch, tmp_path, other_program):
    fake_nvml(monkeypatch, lambda call: [other_program])
    runner = PointRunner(tmp_path, 1, 300.0, UtilizationProbe(0))
    point = {**POINT, "total_steps": 512}
    record = PointRecord("{}", point, "ok", utc_now(), 0.0)
    status, reason, summary = runner.run_repeat(Point("{}", {}, point), 0, Path(tmp_path), [GPU], record)
    assert status == "ok", reason
    account = summary.interference
    assert account["contended"] and f"other programs computed on the GPU ({other_program} sleep)" in account["why"]


def test_a_gate_or_against_pair_beside_another_gpu_program_says_contended_and_why(monkeypatch, other_program):
    from benches.pairing import pair_contention

    fake_nvml(monkeypatch, lambda call: [other_program])
    records = {side: PointRecord("{}", POINT, "ok", utc_now(), 0.0) for side in ("ref", "new")}
    for side, uuids in (("ref", [GPU]), ("new", [])):
        monitor = InterferenceMonitor(uuids)
        monitor.start()
        account = monitor.stop()
        # the CPU is taken as quiet here, so the GPU alone decides
        account["others_cores"] = account["steal_share"] = 0.0
        account["contended"] = bool(contention(account))
        account["why"] = "; ".join(detail for _, detail in contention(account))
        records[side].samples.append((0, RunSummary.read({"sps": 1000.0, "interference": account})))
    assert pair_contention(records, 0, {"ref": "baseline", "new": "new"}) == \
        f"contended (baseline: other programs computed on the GPU ({other_program} sleep))"


def start_other_program(command: list[str]) -> int:
    """Starts `command` as another program would run: in a session of its own, orphaned by its short-lived
    parent, so it is no descendant of this test. Returns its PID."""
    # the program gets no handle on the parent's pipe, so reading the parent's output ends with the parent
    parent = subprocess.run([sys.executable, "-c", "import subprocess, sys\n"
                             f"p = subprocess.Popen({command!r}, start_new_session=True, stdin=subprocess.DEVNULL, "
                             "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\nprint(p.pid)"],
                            capture_output=True, text=True, check=True, timeout=60)
    return int(parent.stdout)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_second_cuda_process_on_the_runs_gpu_is_named(tmp_path):
    from rlperf.machine import cuda_uuid

    torch.ones(1, device="cuda")  # this process on the GPU too: it is the run's, never another program's
    ready = tmp_path / "ready"
    pid = start_other_program([sys.executable, "-c", "import pathlib, time, torch\n"
                               "x = torch.ones(1024, device='cuda'); torch.cuda.synchronize()\n"
                               f"pathlib.Path({str(ready)!r}).touch()\n"
                               "while True: x.mul_(1.0); time.sleep(0.01)"])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert ready.exists(), "the second CUDA process did not start"
        monitor = InterferenceMonitor([cuda_uuid(0)])
        monitor.start()
        time.sleep(0.5)
        account = monitor.stop()
    finally:
        os.kill(pid, 9)
    assert account["gpu_watch_unavailable"] is None, account["gpu_watch_unavailable"]
    names = {int(entry.split()[0]) for entry in account["gpu_other_processes"]}
    assert pid in names and os.getpid() not in names
    assert account["contended"] and "other programs computed on the GPU" in account["why"]
