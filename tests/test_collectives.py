"""`rlperf collectives` on CPU with two gloo ranks: sane stored numbers that the report renders, bad input
refused in one line, a killed or stopped rank failing the run in time with its name, slow starts allowed,
a taken rendezvous port retried, torchrun's two-node rendezvous, and nccl on a GPU when there is one.
Nothing here waits a fixed time for a process: the tests wait for heartbeats and exits."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import psutil
import pytest
import torch
from rich.console import Console

import rlperf.processes as processes
from benches.collectives import FIRST_OP_STAGE, OPS, Settings, bus_factor, element_counts, launch
from rlperf.store import Store
from rlperf.processes import (RANK_DIR_ENV, STARTUP_GRACE_SECONDS, Heartbeat, PortTaken, heartbeat_path, port_taken,
                              with_free_port)

COLLECTIVES = [sys.executable, "-m", "rlperf", "collectives"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
SMALL = ["--max-bytes", "4M", "--iters", "5", "--warmup", "2"]


def run(command: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def two_rank_store(tmp_path_factory):
    store_path = tmp_path_factory.mktemp("collectives") / "results.sqlite"
    proc = run([*COLLECTIVES, "--world-size", "2", "--backend", "gloo", *SMALL, "--store", str(store_path),
                "--label", "two gloo ranks"])
    assert proc.returncode == 0, proc.stderr
    return store_path, proc.stdout


def test_bus_bandwidth_factors_follow_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 4) == bus_factor("reduce_scatter", 4) == pytest.approx(3 / 4)
    assert bus_factor("broadcast", 8) == 1.0
    assert bus_factor("all_reduce", 1) == 0.0


def test_sizes_double_and_split_evenly_among_ranks():
    assert element_counts("all_reduce", 8, 64, 3) == [2, 4, 8, 16]
    # 3 ranks: counts rounded down to a multiple of 3, at least one element each; repeats measured once.
    assert element_counts("all_gather", 8, 64, 3) == [3, 6, 15]
    assert element_counts("reduce_scatter", 1024, 2**20, 2)[-1] * 4 == 2**20


def test_two_gloo_ranks_store_sane_numbers(two_rank_store):
    store_path, _ = two_rank_store
    with Store.open(store_path, readonly=True) as store:
        run_id = store.latest_run()
        rows = store.collectives(run_id)
        runs = store.runs()
    assert set(rows["op"]) == set(OPS) and set(rows["backend"]) == {"gloo"} and set(rows["world_size"]) == {2}
    sizes = [2**k for k in range(3, 23)]  # 8 B to 4 MiB
    for op, frame in rows.groupby("op"):
        assert sorted(frame["bytes"].unique()) == sizes
        assert frame.groupby("bytes")["repeat"].apply(sorted).tolist() == [[0, 1, 2, 3, 4]] * len(sizes)
        assert (frame["time_us"] > 0).all() and (frame["algbw_gbps"] > 0).all()
        assert frame["algbw_gbps"].to_numpy() == pytest.approx(frame["bytes"] / frame["time_us"] / 1e3)
        assert frame["busbw_gbps"].to_numpy() == pytest.approx(frame["algbw_gbps"] * bus_factor(op, 2))
        busbw = frame.groupby("bytes")["busbw_gbps"].median()
        # Half a million times the bytes: bandwidth must grow by far, however noisy a shared machine is.
        assert busbw[sizes[-1]] > 100 * busbw[sizes[0]], op
    run_row = runs.set_index("run_id").loc[run_id]
    assert run_row["suite"] == "collectives" and run_row["status"] == "complete"
    assert run_row["label"] == "two gloo ranks"
    fingerprint = run_row["fingerprint"]
    assert fingerprint["cpu"]["cores_logical"] >= 1 and "OMP_NUM_THREADS" in fingerprint["thread_env"]
    assert fingerprint["suite_overrides"]["world_size"] == 2 and fingerprint["suite_overrides"]["backend"] == "gloo"


def test_the_table_and_the_report_show_the_run(two_rank_store, tmp_path):
    store_path, stdout = two_rank_store
    assert "gloo, 2 ranks on cpu" in stdout and "reduce_scatter" in stdout and "4 MiB" in stdout
    proc = run([sys.executable, "-m", "rlperf", "report", str(store_path), "--out", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    report = (tmp_path / "report.md").read_text()
    section = report[report.index("## Collectives"):]
    assert "| broadcast | gloo | 2 | 4,194,304 |" in section
    assert "Collectives: bus bandwidth" in (tmp_path / "report.html").read_text()


@pytest.mark.parametrize("args, needle", [
    (["--min-bytes", "12X"], "argument --min-bytes: must be a byte count"),
    (["--min-bytes", "2"], "argument --min-bytes: must be a byte count of at least 4"),
    (["--min-bytes", "1M", "--max-bytes", "64K"], "max_bytes: must be at least --min-bytes"),
    (["--iters", "0"], "argument --iters: must be a whole number of 1 or more"),
    (["--warmup", "-1"], "argument --warmup: must be a whole number of 0 or more"),
    (["--backend", "mpi"], "argument --backend: invalid choice"),
    (["--world-size", "two"], "argument --world-size"),
    # each rank a torch process: tens of thousands of them would take the machine down before one measured
    (["--backend", "gloo", "--world-size", "99999"], "world_size: 99999 CPU ranks would share the"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle, tmp_path):
    proc = run([*COLLECTIVES, *args, "--store", str(tmp_path / "results.sqlite")])
    assert proc.returncode == 2
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "results.sqlite").exists()


def test_a_file_that_is_not_a_store_is_refused_untouched(tmp_path):
    foreign = tmp_path / "notes.sqlite"
    foreign.write_bytes(b"not a database, but someone's file" * 100)
    before = foreign.read_bytes()
    proc = run([*COLLECTIVES, *SMALL, "--backend", "gloo", "--store", str(foreign)])
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert f"store: {foreign} is not an rlperf results store" in proc.stderr
    assert foreign.read_bytes() == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_nccl_without_a_gpu_is_refused(tmp_path):
    proc = run([*COLLECTIVES, "--backend", "nccl", "--store", str(tmp_path / "results.sqlite")])
    assert proc.returncode == 2
    assert "backend: nccl needs a CUDA GPU" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def start_long_run(tmp_path: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*COLLECTIVES, "--world-size", "2", "--backend", "gloo", "--max-bytes", "64M",
                             "--iters", "500", "--store", str(tmp_path / "results.sqlite"), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def measuring_rank(launcher: subprocess.Popen, rank: int) -> psutil.Process:
    """The rank's process, once it is inside a timed collective sweep (read from its heartbeat)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert launcher.poll() is None, launcher.stderr.read()
        for child in psutil.Process(launcher.pid).children():
            try:
                env = child.environ()
            except psutil.Error:
                continue
            if env.get("RANK") == str(rank) and RANK_DIR_ENV in env:
                progress = Heartbeat.read(heartbeat_path(Path(env[RANK_DIR_ENV]), rank))
                if progress is not None and progress.stage >= FIRST_OP_STAGE:
                    return child
        time.sleep(0.1)
    raise AssertionError(f"rank {rank} never started measuring")


def assert_ranks_gone(pids: list[int]) -> None:
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_killed_rank_fails_the_run_in_time_and_is_named(tmp_path):
    # The exit is seen at once, not after a stall: with a rank timeout of 10 minutes, failing within the
    # 2 minutes this test waits can only come from the dead rank's exit status.
    launcher = start_long_run(tmp_path, "--rank-timeout", "600")
    try:
        victim = measuring_rank(launcher, 1)
        peers = [child.pid for child in psutil.Process(launcher.pid).children()]
        victim.kill()
        _, stderr = launcher.communicate(timeout=120)
    finally:
        launcher.kill()
    assert launcher.returncode == 1
    assert stderr.startswith("rlperf collectives: error: rank 1 was killed by SIGKILL"), stderr
    assert len(stderr.strip().splitlines()) == 1
    assert_ranks_gone(peers)
    with Store.open(tmp_path / "results.sqlite", readonly=True) as store:
        assert store.row_counts()["runs"] == 0  # nothing half-measured is stored


RANK_TIMEOUT = 8.0  # long enough that a healthy rank descheduled on a busy machine is not named


def test_a_stopped_rank_fails_the_run_after_rank_timeout(tmp_path):
    launcher = start_long_run(tmp_path, "--rank-timeout", f"{RANK_TIMEOUT:g}")
    try:
        victim = measuring_rank(launcher, 1)
        peers = [child.pid for child in psutil.Process(launcher.pid).children()]
        victim.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        _, stderr = launcher.communicate(timeout=120)
        waited = time.monotonic() - stopped_at
    finally:
        launcher.kill()
    assert launcher.returncode == 1 and len(stderr.strip().splitlines()) == 1
    # Stopped between collectives, rank 1 is behind and named alone; stopped inside one, its peer waits in
    # the same collective and both are named. The silence stated is the one measured, at least the limit.
    found = re.match(r"rlperf collectives: error: (rank 1|ranks 0, 1) made no progress for (\d+\.\d) s "
                     rf"\(rank_timeout {RANK_TIMEOUT:g} s\)", stderr)
    assert found, stderr
    silence = float(found.group(2))
    # the silence began at most one collective before the stop (a few ms here), and was read before the exit
    assert RANK_TIMEOUT <= silence <= waited + 1.0, (silence, waited)
    assert_ranks_gone(peers)


def test_slow_starting_ranks_get_the_startup_grace(tmp_path):
    """Ranks that take longer than --rank-timeout to start (here every interpreter sleeps first, as if
    importing torch on a loaded machine) are not a stall: the grace lasts until they have joined."""
    (tmp_path / "sitecustomize.py").write_text("import time\ntime.sleep(5)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([*COLLECTIVES, "--world-size", "2", "--backend", "gloo", "--max-bytes", "64K", "--iters",
                           "3", "--warmup", "1", "--rank-timeout", "3", "--store", str(tmp_path / "results.sqlite")],
                          capture_output=True, text=True, timeout=STARTUP_GRACE_SECONDS * 2, env=env)
    assert proc.returncode == 0, proc.stderr


def test_a_taken_rendezvous_port_costs_a_retry_not_the_run(monkeypatch):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        real = processes.free_local_port
        handed: list[int] = []

        def first_one_taken() -> int:
            handed.append(taken if not handed else real())
            return handed[-1]

        monkeypatch.setattr(processes, "free_local_port", first_one_taken)
        result = launch(Settings(2, "gloo", 8, 1024, 2, 1, 60.0), Console(file=StringIO()))
    assert handed[0] == taken and len(handed) == 2
    assert {row["op"] for row in result["rows"]} == set(OPS)


def test_torchrun_two_node_rendezvous_runs_and_rank_0_stores(tmp_path):
    """Two torchrun agents meeting over c10d on one host: the multi-node path without a second node."""

    def rendezvous(port: int) -> list[subprocess.Popen]:
        for stale in tmp_path.glob("node*.sqlite"):
            stale.unlink()
        agents = [subprocess.Popen([*TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                                    "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "collectives-test",
                                    "-m", "rlperf", "collectives", "--backend", "gloo", "--max-bytes", "64K",
                                    "--iters", "3", "--warmup", "1", "--store", str(tmp_path / f"node{node}.sqlite")],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})
                  for node in range(2)]
        try:
            outputs = [agent.communicate(timeout=120)[0] for agent in agents]
        finally:
            for agent in agents:
                agent.kill()
        if any(agent.returncode for agent in agents) and any(port_taken(output) for output in outputs):
            raise PortTaken(port)
        assert [agent.returncode for agent in agents] == [0, 0], outputs
        return agents

    with_free_port(rendezvous)
    stored = [path for path in tmp_path.glob("node*.sqlite")]
    assert len(stored) == 1, "exactly one node holds rank 0"
    with Store.open(stored[0], readonly=True) as store:
        rows = store.collectives(store.latest_run())
    assert set(rows["world_size"]) == {2} and set(rows["op"]) == set(OPS) and (rows["busbw_gbps"] > 0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_nccl_on_one_gpu(tmp_path):
    store_path = tmp_path / "results.sqlite"
    proc = run([*COLLECTIVES, "--backend", "nccl", "--world-size", "1", "--max-bytes", "64M", "--iters", "5",
                "--store", str(store_path)])
    assert proc.returncode == 0, proc.stderr
    with Store.open(store_path, readonly=True) as store:
        run_id = store.latest_run()
        rows = store.collectives(run_id)
        fingerprint = store.fingerprint(run_id)
    assert set(rows["backend"]) == {"nccl"} and (rows["time_us"] >= 0).all()
    # An in-place call on one rank can move nothing and read 0.0 ms: such a call has no bandwidth.
    timed = rows[rows["time_us"] > 0]
    assert rows.loc[rows["time_us"] == 0, ["algbw_gbps", "busbw_gbps"]].isna().all().all()
    assert timed[["algbw_gbps", "busbw_gbps"]].notna().all().all()
    # One rank moves nothing over a bus: all-reduce, all-gather and reduce-scatter busbw is 0 by convention.
    assert (timed.loc[timed["op"] != "broadcast", "busbw_gbps"] == 0).all()
    broadcast = timed[timed["op"] == "broadcast"]
    assert broadcast["busbw_gbps"].to_numpy() == pytest.approx(broadcast["algbw_gbps"].to_numpy())
    # the out-of-place gather and scatter copy the whole buffer, however little a bus carries
    assert timed.loc[timed["bytes"] == timed["bytes"].max(), "algbw_gbps"].median() > 1.0
    assert fingerprint["nccl"] and fingerprint["cuda_devices"]
