"""The child-process contract (rlperf.processes): children die with their parent at every level, even one
killed outright; the watchdog names the rank that failed or went silent; ranks are launched with their
environment and heartbeats; a taken rendezvous port is retried. Nothing here needs torch, and nothing
waits a fixed time for a process to start: the tests wait for what the processes write."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from rlperf import processes
from rlperf.processes import (RANK_DIR_ENV, Heartbeat, PortTaken, RankFailed, heartbeat_path, launch_ranks,
                              log_path, port_taken, spawn, watch, with_free_port)

# Each level spawns the next, records its pid, and sleeps far longer than the test.
CHAIN = textwrap.dedent("""
    import os, sys, time
    from rlperf.processes import spawn
    depth, record = int(sys.argv[1]), sys.argv[2]
    if depth:
        spawn([sys.executable, __file__, str(depth - 1), record])
    with open(record, "a") as out:
        out.write(f"{os.getpid()}\\n")
    time.sleep(600)
""")


def still_running(pids: list[int], timeout: float = 60) -> list[int]:
    """Those of `pids` still running after waiting up to `timeout` seconds for them to end (a zombie, left
    for a parent that does not reap it, has ended)."""
    deadline = time.monotonic() + timeout
    while True:
        running = []
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    running.append(pid)
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.1)


def test_every_level_dies_with_the_one_above_killed_outright(tmp_path):
    script, record = tmp_path / "chain.py", tmp_path / "pids"
    script.write_text(CHAIN)
    top = subprocess.Popen([sys.executable, str(script), "2", str(record)])
    descendants: list[int] = []
    try:
        deadline = time.monotonic() + 120  # only a bound: nothing waits longer than the chain takes to start
        while len(descendants) < 2:
            assert time.monotonic() < deadline, "the chain never started"
            pids = [int(line) for line in record.read_text().split()] if record.exists() else []
            descendants = [pid for pid in pids if pid != top.pid]
            time.sleep(0.05)
        os.kill(top.pid, signal.SIGKILL)
        top.wait()
        survivors = still_running(descendants)
    finally:
        top.kill()
        for pid in descendants:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert not survivors, f"survived their parent: {survivors}"


def test_the_child_runs_in_its_directory_and_nothing_there_is_imported(tmp_path):
    """Another checkout's tree (`--against`) may hold an older rlperf: only the command may import from it."""
    (tmp_path / "rlperf").mkdir()
    (tmp_path / "rlperf" / "__init__.py").write_text("raise ImportError('the checkout in cwd was imported')\n")
    child = spawn([sys.executable, "-c", "import os; print(os.getcwd())"], cwd=tmp_path, stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE, text=True)
    stdout, stderr = child.communicate(timeout=120)
    assert child.returncode == 0, stderr
    assert Path(stdout.strip()) == tmp_path.resolve()


@pytest.fixture
def idle_ranks(tmp_path):
    """Two processes that stand for ranks which never exit, with empty logs and fresh heartbeat files."""
    ranks = []
    for rank in range(2):
        log_path(tmp_path, rank).write_text("")
        Heartbeat.create(heartbeat_path(tmp_path, rank))
        ranks.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]))
    yield ranks
    for proc in ranks:
        proc.kill()
        proc.wait()


def silence_named(failure: RankFailed, names: str = "rank 0") -> float:
    named = re.match(rf"{names} made no progress for ([0-9.]+) s \(rank_timeout [0-9.]+ s\)", str(failure))
    assert named, str(failure)
    return float(named.group(1))


def test_the_startup_grace_holds_until_a_ranks_first_beat(tmp_path, idle_ranks):
    started = time.monotonic()
    with pytest.raises(RankFailed) as failed:
        watch(idle_ranks[:1], tmp_path, timeout=0.5, startup_grace=2.0)
    assert time.monotonic() - started >= 2.0
    assert silence_named(failed.value) >= 2.0


def test_the_reported_silence_is_measured_from_the_last_beat(tmp_path, idle_ranks):
    Heartbeat(heartbeat_path(tmp_path, 0)).beat()
    time.sleep(1.5)
    with pytest.raises(RankFailed) as failed:
        watch(idle_ranks[:1], tmp_path, timeout=1.0)
    assert silence_named(failed.value) >= 1.5


def test_the_rank_that_got_least_far_is_named_with_where_each_rank_is(tmp_path, idle_ranks):
    behind, ahead = Heartbeat(heartbeat_path(tmp_path, 1)), Heartbeat(heartbeat_path(tmp_path, 0))
    behind.enter(stage=1, size=8)
    ahead.enter(stage=2, size=16)
    ahead.enter(stage=2, size=16)  # one beat ahead: it went on into the next collective and waits there
    with pytest.raises(RankFailed) as failed:
        watch(idle_ranks, tmp_path, timeout=0.5, where=lambda progress: f"op {progress.stage} of {progress.size}")
    silence_named(failed.value, "rank 1")
    assert str(failed.value).endswith(" at op 1 of 8; the other ranks wait in op 2 of 16")

    ahead.enter(stage=1, size=8)
    behind.enter(stage=1, size=8)
    behind.enter(stage=1, size=8)  # now level: both inside the same collective, neither distinguishable
    with pytest.raises(RankFailed) as failed:
        watch(idle_ranks, tmp_path, timeout=0.5, where=lambda progress: f"op {progress.stage} of {progress.size}")
    silence_named(failed.value, "ranks 0, 1")
    assert str(failed.value).endswith(", all inside op 1 of 8")


def test_a_stopped_rank_is_named_among_ranks_level_with_it(tmp_path, idle_ranks):
    for rank in range(2):
        Heartbeat(heartbeat_path(tmp_path, rank)).beat()
    idle_ranks[1].send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(RankFailed) as failed:
            watch(idle_ranks, tmp_path, timeout=0.5)
    finally:
        idle_ranks[1].send_signal(signal.SIGCONT)
    silence_named(failed.value, "rank 1")


def test_ranks_that_exited_badly_are_all_named_the_killed_one_first(tmp_path):
    log_path(tmp_path, 0).write_text("starting\nRuntimeError: Connection closed by peer\n\n")
    ranks = [subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]),
             subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])]
    for proc in ranks:
        proc.wait()  # both gone before the first poll, as when a killed rank's peer fails at once
    with pytest.raises(RankFailed) as failed:
        watch(ranks, tmp_path, timeout=60)
    assert str(failed.value) == ("rank 1 was killed by SIGKILL; "
                                 "rank 0 exited with code 3 (RuntimeError: Connection closed by peer)")


RANK = textwrap.dedent("""
    import json, os
    from pathlib import Path
    from rlperf.processes import RANK_DIR_ENV, Heartbeat, heartbeat_path
    heartbeat = Heartbeat.of_this_rank()
    for _ in range(3):
        heartbeat.beat()
    directory = Path(os.environ[RANK_DIR_ENV])
    if os.environ["RANK"] == "0":
        names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
        seen = {name: os.environ[name] for name in names}
        seen["beats"] = Heartbeat.read(heartbeat_path(directory, 0)).count
        (directory / "result.json").write_text(json.dumps(seen))
""")


def test_launched_ranks_get_their_environment_and_heartbeats_and_the_result_is_collected():
    directories: list[Path] = []

    def result(directory: Path) -> dict:
        directories.append(directory)
        return json.loads((directory / "result.json").read_text())

    seen = launch_ranks(2, lambda rank, directory: [sys.executable, "-c", RANK], result, rank_timeout=60)
    assert seen["RANK"] == seen["LOCAL_RANK"] == "0" and seen["WORLD_SIZE"] == seen["LOCAL_WORLD_SIZE"] == "2"
    assert seen["MASTER_ADDR"] == "127.0.0.1" and int(seen["MASTER_PORT"]) > 0 and seen["beats"] == 3
    assert not directories[0].exists()  # the ranks' directory is removed with their heartbeats and logs
    assert RANK_DIR_ENV not in os.environ


RANK_0_RUNS_ON = textwrap.dedent("""
    import os, sys, time
    with open(sys.argv[1] + ".part", "w") as out:
        out.write(str(os.getpid()))
    os.rename(sys.argv[1] + ".part", sys.argv[1])
    time.sleep(600)
""")
# fails once rank 0 is up, so that there is a peer to stop
RANK_1_FAILS = textwrap.dedent("""
    import os, sys, time
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    print("loading")
    sys.exit("bad input on rank 1")
""")


def test_a_failed_rank_fails_the_launch_with_its_last_words_and_its_peer_is_stopped(tmp_path):
    pid_file = tmp_path / "rank0.pid"
    with pytest.raises(RankFailed) as failed:
        launch_ranks(2, lambda rank, directory: [sys.executable, "-c", (RANK_0_RUNS_ON, RANK_1_FAILS)[rank],
                                                 str(pid_file)],
                     lambda directory: None, rank_timeout=60)
    assert str(failed.value) == "rank 1 exited with code 1 (bad input on rank 1)"
    assert not still_running([int(pid_file.read_text())], timeout=10)


def test_port_helpers():
    port = processes.free_local_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # free when handed out
    assert port_taken("RuntimeError: The server socket has failed to listen on any local network address. "
                      "port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
    assert not port_taken("RuntimeError: Connection reset by peer")
    calls: list[int] = []

    def collide_twice(port: int) -> int:
        calls.append(port)
        if len(calls) < 3:
            raise PortTaken(port)
        return port

    assert with_free_port(collide_twice) == calls[-1] and len(calls) == 3

    def always(port: int) -> int:
        raise PortTaken(port)

    with pytest.raises(PortTaken):
        with_free_port(always, attempts=2)
    with pytest.raises(RankFailed):  # other failures are not retried
        with_free_port(lambda port: (_ for _ in ()).throw(RankFailed("rank 1 was killed by SIGKILL")))


def test_a_port_taken_every_time_fails_the_launch_in_one_line(monkeypatch):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        monkeypatch.setattr(processes, "free_local_port", lambda: taken)
        command = [sys.executable, "-c", f"import socket; socket.create_server(('127.0.0.1', {taken}))"]
        with pytest.raises(RankFailed, match=rf"^port {taken} was taken before the ranks could bind it, 5 times"):
            launch_ranks(1, lambda rank, directory: command, lambda directory: None, rank_timeout=60)
