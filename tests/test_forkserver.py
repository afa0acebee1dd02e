"""Trainer processes forked from a warm interpreter (rlperf/forkserver.py): a forked child is what a fresh
`python -m MODULE` would be (its argv, directory, session, output, exit code, and the same training to the
last loss), its CPU time comes back to the harness, and it dies with the server, which dies with the harness.
Nothing here waits a fixed time for a process to start: the tests wait for what the processes write."""

from __future__ import annotations

import dataclasses
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
import torch

from benches.runner import Launcher, PointRunner, UtilizationProbe
from benches.suite import Point
from reference_trainer.config import TrainConfig
from rlperf.forkserver import ForkServer, ServerGone, forkable
from rlperf.machine import probe
from test_processes import still_running

# A module the children run, in the server's directory: it says what it sees, then does what it is told.
PROBE = textwrap.dedent("""
    import json, os, sys, time
    what = sys.argv[1]
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "pid": os.getpid(), "ppid": os.getppid(),
                      "session_leader": os.getsid(0) == os.getpid(), "torch_imported": "torch" in sys.modules,
                      "comm": open("/proc/self/comm").read().strip(),
                      "stdin": os.readlink("/proc/self/fd/0"), "main": __name__}), flush=True)
    if what == "exit":
        sys.exit(int(sys.argv[2]))
    if what == "message":
        sys.exit("a message for the log")
    if what == "raise":
        raise RuntimeError("raised in the child")
    if what == "spin":
        end = time.process_time() + float(sys.argv[2])
        while time.process_time() < end:
            pass
    if what == "sleep":
        time.sleep(600)
""")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("server_cwd")
    (directory / "probe_module.py").write_text(PROBE)
    started = ForkServer(directory)
    assert started.refused is None
    yield started, directory
    started.close()


def run(server: ForkServer, log: Path, *args: str, timeout: float = 120) -> tuple[int, dict, str]:
    child = server.start([sys.executable, "-m", "probe_module", *args], log)
    code = child.wait(timeout)
    text = log.read_text()
    return code, json.loads(text.splitlines()[0]), text


def test_a_forked_child_is_the_module_run_as_python_m_in_the_servers_directory(server, tmp_path):
    started, directory = server
    code, seen, _ = run(started, tmp_path / "log", "exit", "3")
    assert code == 3
    assert seen["argv"] == ["exit", "3"] and seen["main"] == "__main__"
    assert seen["cwd"] == str(directory) and seen["ppid"] == started.process.pid
    assert seen["session_leader"] and seen["stdin"] == os.devnull
    assert seen["torch_imported"]  # the server's imports came with the fork
    assert seen["comm"] == "probe_module ex"  # the module and its first argument, as much as the kernel keeps


def test_a_child_forked_for_another_checkout_runs_that_checkouts_code_there(server, tmp_path):
    started, directory = server
    other = tmp_path / "other checkout"
    other.mkdir()
    (other / "probe_module.py").write_text(PROBE.replace('"main": __name__', '"main": __name__, "other": True'))
    child = started.start([sys.executable, "-m", "probe_module", "exit", "0"], tmp_path / "log", cwd=other)
    assert child.wait(120) == 0
    seen = json.loads((tmp_path / "log").read_text().splitlines()[0])
    assert seen["cwd"] == str(other) and seen.get("other") and seen["ppid"] == started.process.pid
    # the server's own directory is as it was for the next child
    assert "other" not in run(started, tmp_path / "again", "exit", "0")[1]


def test_launchers_beside_each_other_fork_from_one_server_each_in_its_own_checkout(tmp_path):
    checkouts = {name: tmp_path / name for name in ("working", "baseline")}
    for name, directory in checkouts.items():
        directory.mkdir()
        said = PROBE.replace('"main": __name__', f'"main": __name__, "side": "{name}"')
        (directory / "probe_module.py").write_text(said)
    with Launcher("forked", checkouts["working"]) as working, working.beside(checkouts["baseline"]) as baseline:
        seen = {}
        for name, launcher in (("working", working), ("baseline", baseline)):
            command = [sys.executable, "-m", "probe_module", "exit", "0"]
            server = launcher.prepare(command)
            with open(tmp_path / f"{name}.log", "w") as log:
                assert launcher.start(server, command, log, tmp_path / f"{name}.log").wait(120) == 0
            seen[name] = json.loads((tmp_path / f"{name}.log").read_text().splitlines()[0])
        # one interpreter instance forked both sides: whatever it does to its children's speed, both meet it
        assert seen["working"]["ppid"] == seen["baseline"]["ppid"] == working.server.process.pid
        assert baseline.server is None
        assert {name: (s["side"], s["cwd"]) for name, s in seen.items()} == {
            name: (name, str(directory)) for name, directory in checkouts.items()}
        baseline.gone()  # the server died: the next repeat of either side starts another
        assert working.server is None


def test_a_childs_exit_is_an_interpreters_exit(server, tmp_path):
    started, _ = server
    code, _, text = run(started, tmp_path / "message", "message")
    assert code == 1 and text.splitlines()[-1] == "a message for the log"
    code, _, text = run(started, tmp_path / "raise", "raise")
    assert code == 1 and "Traceback" in text and text.splitlines()[-1] == "RuntimeError: raised in the child"
    code, _, _ = run(started, tmp_path / "ok", "nothing")
    assert code == 0


def test_a_childs_cpu_seconds_come_back_with_its_exit(server, tmp_path):
    started, _ = server
    child = started.start([sys.executable, "-m", "probe_module", "spin", "0.5"], tmp_path / "log")
    assert child.wait(120) == 0
    assert 0.5 <= child.cpu_seconds < 5


def test_a_child_killed_in_its_session_reads_as_killed_and_the_server_forks_on(server, tmp_path):
    started, _ = server
    child = started.start([sys.executable, "-m", "probe_module", "sleep"], tmp_path / "log")
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.2)
    os.killpg(child.pid, signal.SIGKILL)  # what a repeat's timeout does
    assert child.wait(120) == -signal.SIGKILL
    assert run(started, tmp_path / "after", "exit", "0")[0] == 0


def test_run_captures_standard_output_apart_from_the_log_and_kills_a_child_past_its_timeout(server):
    started, _ = server
    done = started.run([sys.executable, "-m", "probe_module", "message"], 120)
    assert done.returncode == 1 and json.loads(done.stdout)["argv"] == ["message"]
    assert done.stderr.strip() == "a message for the log"
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        started.run([sys.executable, "-m", "probe_module", "sleep"], 0.5)
    assert still_running([int(timed_out.value.cmd.removeprefix("pid "))]) == []
    assert started.run([sys.executable, "-m", "probe_module", "exit", "0"], 120).returncode == 0


def test_the_machine_probed_by_a_child_of_the_server_is_the_machine_probed_fresh():
    with Launcher("forked") as launcher:
        forked = launcher.probe_machine()
        assert launcher.server is not None  # started by the probe, kept for the repeats
    with Launcher("fresh") as launcher:
        assert launcher.probe_machine() == forked == probe()
        assert launcher.server is None


def test_only_this_interpreters_modules_are_forked():
    assert forkable([sys.executable, "-m", "rlperf", "train"])
    assert not forkable([sys.executable, "script.py"])
    assert not forkable(["/usr/bin/python3-other", "-m", "rlperf"])


def test_a_server_refuses_to_fork_an_interpreter_with_a_thread_running():
    code = ("import threading, time; from rlperf.forkserver import fork_hazard; print(fork_hazard()); "
            "threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); print(fork_hazard())")
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout
    assert said.splitlines() == ["None", "2 Python threads run after the imports"]


def test_with_the_cuda_driver_loaded_a_server_forks_only_once_a_probe_child_has_used_the_gpu():
    # A CUDA build of torch loads the driver's library on import and initializes nothing: that alone is no
    # hazard. Here (a CPU torch) the probe finds no GPU; then one whose first GPU work fails; then CUDA
    # initialized before the fork.
    code = ("import torch; from rlperf.forkserver import cuda_hazard; print(cuda_hazard()); "
            "torch.cuda.is_available = lambda: True; print(cuda_hazard()); "
            "torch.cuda.is_initialized = lambda: True; print(cuda_hazard())")
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    lines = said.stdout.splitlines()
    assert lines[0] == "None" and lines[2] == "torch initialized CUDA during the imports", said.stderr
    assert lines[1].startswith("a child forked after the imports could not use CUDA (AssertionError: Torch not "
                               "compiled with CUDA enabled")


# The harness: a server and one sleeping child, their pids recorded, then it sleeps until killed.
HARNESS = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from rlperf.forkserver import ForkServer
    record, directory = Path(sys.argv[1]), Path(sys.argv[2])
    server = ForkServer(directory)
    child = server.start([sys.executable, "-m", "probe_module", "sleep"], directory / "child.log")
    record.write_text(f"{server.process.pid} {child.pid}")
    time.sleep(600)
""")


def test_the_server_and_its_children_die_with_a_harness_killed_outright(tmp_path):
    (tmp_path / "probe_module.py").write_text(PROBE)
    (tmp_path / "harness.py").write_text(HARNESS)
    record = tmp_path / "pids"
    harness = subprocess.Popen([sys.executable, str(tmp_path / "harness.py"), str(record), str(tmp_path)],
                               cwd=Path(__file__).parents[1])
    try:
        deadline = time.monotonic() + 180
        while not (record.exists() and record.read_text()) or not (tmp_path / "child.log").exists():
            assert harness.poll() is None and time.monotonic() < deadline, "the harness did not start its child"
            time.sleep(0.05)
        pids = [int(pid) for pid in record.read_text().split()]
        assert all(psutil.pid_exists(pid) for pid in pids)
        harness.kill()
        harness.wait()
        assert still_running(pids) == []
    finally:
        if harness.poll() is None:
            harness.kill()


def test_a_killed_server_fails_its_childs_wait_in_one_line_and_takes_the_child_along(tmp_path):
    (tmp_path / "probe_module.py").write_text(PROBE)
    doomed = ForkServer(tmp_path)
    try:
        child = doomed.start([sys.executable, "-m", "probe_module", "sleep"], tmp_path / "log")
        doomed.process.kill()
        with pytest.raises(ServerGone, match=r"^the fork server \(pid \d+\) ended \(killed by SIGKILL\)$"):
            child.wait(120)
        assert still_running([child.pid]) == []
    finally:
        doomed.close()


def test_forked_and_fresh_trainers_train_alike_and_the_account_says_how_each_started(tmp_path):
    config = {"env": "synthetic", "device": "cpu", "num_envs": 8, "horizon": 8, "hidden_size": 16,
              "minibatch_size": 32, "total_steps": 256, "warmup_epochs": 1, "threads": 1}
    point = Point(key="k", axes={}, config=dataclasses.asdict(TrainConfig(**config)))
    summaries = {}
    for method in ("forked", "fresh"):
        with Launcher(method) as launcher:
            runner = PointRunner(tmp_path / method, 1, 300.0, UtilizationProbe(0), launcher=launcher)
            record = runner.run(0, point, [])
            assert record.status == "ok", record.reason
            summaries[method] = record.samples[0][1]
    forked, fresh = summaries["forked"], summaries["fresh"]
    assert forked.losses == fresh.losses and forked.episodes == fresh.episodes
    assert forked.interference["launch"] == "forked" and fresh.interference["launch"] == "fresh"
    # the forked trainer's CPU time is the trainer's (its harness cannot wait for it: the server reports it), not
    # another program's; whether the machine was quiet besides is the monitor's to say
    assert forked.interference["trainer_cpu_s"] > 0.1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_a_forked_trainer_trains_as_a_fresh_one_does(tmp_path):
    """torch's imports load the CUDA driver's library and must initialize nothing, or the server refuses and
    every repeat starts fresh (on an H100 with torch 2.11 every GPU repeat did, refused for the library alone):
    the forked trainer must have been forked, and train on the GPU to a fresh trainer's losses."""
    config = {"env": "synthetic", "device": "cuda", "num_envs": 256, "horizon": 16, "hidden_size": 64,
              "minibatch_size": 1024, "total_steps": 256 * 16 * 3, "warmup_epochs": 1}
    point = Point(key="k", axes={}, config=dataclasses.asdict(TrainConfig(**config)))
    summaries = {}
    for method in ("forked", "fresh"):
        with Launcher(method) as launcher:
            record = PointRunner(tmp_path / method, 1, 300.0, UtilizationProbe(0), launcher=launcher).run(0, point, [])
            assert record.status == "ok", record.reason
            assert launcher.refused is None
            summaries[method] = record.samples[0][1]
    assert summaries["forked"]["interference"]["launch"] == "forked"
    assert summaries["forked"]["device_name"] == summaries["fresh"]["device_name"]
    for name, value in summaries["fresh"]["losses"].items():
        assert summaries["forked"]["losses"][name] == pytest.approx(value, rel=1e-4, abs=1e-6)
