"""Training with several ranks: one process per rank on torch.distributed (gloo on CPU, nccl on CUDA).

`rlperf train --world-size N` either joins a job that torchrun (or another launcher) started, seen by the
RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT variables, or starts the N rank processes itself and
watches them: a rank that exits with an error, or stops reporting progress for `rank_timeout` seconds,
fails the whole run with that rank named, and the other ranks are stopped.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from reference_trainer.config import TrainConfig
from rlperf.cpus import usable_cores
from rlperf.errors import BadInput
from rlperf.ports import PORT_ATTEMPTS, PortTaken, port_taken, with_free_port

HEARTBEAT_DIR = "RLPERF_HEARTBEAT_DIR"
POLL_SECONDS = 0.2
STARTUP_GRACE_SECONDS = 60.0  # importing torch and meeting the other ranks, before the first beat


class RankFailed(RuntimeError):
    """A rank died or hung; the message names it."""


class Heartbeat:
    """How far a rank has got (a count of beats) and when it last moved, in a small shared file the
    launcher reads. Beats come at every rollout step, every minibatch and before every collective, so
    one costs next to nothing: a store into a memory map, no system call. The file starts at count 0,
    which is not a beat: until the first one the rank is still starting up."""

    FORMAT = "qd"

    def __init__(self, path: Path):
        self.count = 0
        path.write_bytes(struct.pack(self.FORMAT, 0, time.time()))
        with open(path, "r+b") as file:
            self._map = mmap.mmap(file.fileno(), struct.calcsize(self.FORMAT))

    def beat(self) -> None:
        self.count += 1
        struct.pack_into(self.FORMAT, self._map, 0, self.count, time.time())

    @classmethod
    def read(cls, path: Path) -> tuple[int, float] | None:
        try:
            return struct.unpack(cls.FORMAT, path.read_bytes())
        except (OSError, struct.error):
            return None


def launch_or_join(cfg: TrainConfig, quiet: bool, save_policy: str) -> dict | None:
    if "RANK" in os.environ:
        return join(cfg, quiet, save_policy)
    return launch(cfg, save_policy)


def join(cfg: TrainConfig, quiet: bool, save_policy: str) -> dict | None:
    """Runs this process's rank; rank 0 returns the summary with every rank's phases, others None."""
    import torch
    import torch.distributed as dist

    from reference_trainer.progress import run_with_progress
    from reference_trainer.train import Rank, training_device

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != cfg.world_size:
        raise BadInput(f"world_size: the launcher started {world} ranks but world_size is {cfg.world_size}")
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if cfg.is_cuda:
        torch.cuda.set_device(training_device(cfg, local_rank))  # before nccl, which binds to the current GPU
    elif not cfg.threads:
        # Ranks on one machine each taking every core oversubscribe the CPU; give each its share.
        torch.set_num_threads(max(1, usable_cores() // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    # Collectives wait twice as long as the launcher's watchdog, so a silent rank is named by the watchdog
    # before its peers give up waiting in a collective and exit with errors of their own.
    dist.init_process_group("nccl" if cfg.is_cuda else "gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=2 * cfg.rank_timeout))
    me = Rank(rank, world, local_rank)
    if HEARTBEAT_DIR in os.environ:
        me.beat = Heartbeat(Path(os.environ[HEARTBEAT_DIR]) / f"rank{rank}.beat").beat
    try:
        summary = run_with_progress(cfg, quiet or rank != 0, me, save_policy)
        mine = {"rank": rank, "sps": summary["sps"], "phases": summary["phases"],
                "device_name": summary["device_name"]}
        everyone: list[dict | None] = [None] * world
        dist.all_gather_object(everyone, mine)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return None
    summary["ranks"] = everyone
    return summary


def launch(cfg: TrainConfig, save_policy: str) -> dict:
    """Starts one process per rank on this machine and returns rank 0's summary. A rendezvous port taken
    by another process between picking and binding it costs one more attempt on a new port."""
    with tempfile.TemporaryDirectory(prefix="rlperf-ranks-") as tmp:
        def attempt(port: int) -> dict:
            # fresh heartbeats for every attempt: an earlier attempt's would read as stalls
            return run_ranks(cfg, save_policy, Path(tempfile.mkdtemp(dir=tmp)), port)

        try:
            return with_free_port(attempt)
        except PortTaken as taken:
            raise RankFailed(f"{taken}, {PORT_ATTEMPTS} times in a row") from None


def run_ranks(cfg: TrainConfig, save_policy: str, tmp: Path, port: int) -> dict:
    summary_path = tmp / "summary.json"
    env = {**os.environ, "WORLD_SIZE": str(cfg.world_size), "LOCAL_WORLD_SIZE": str(cfg.world_size),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), HEARTBEAT_DIR: str(tmp)}
    ranks = []
    try:
        for rank in range(cfg.world_size):
            args = [sys.executable, "-m", "rlperf", "train", *cfg.to_args(), "--quiet"]
            if rank == 0:
                args += ["--json", str(summary_path)] + (["--save-policy", save_policy] if save_policy else [])
            with open(tmp / f"rank{rank}.log", "w") as log:
                ranks.append(subprocess.Popen(args, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                              stderr=log))
        try:
            watch(ranks, tmp, cfg.rank_timeout)
        except RankFailed:
            if any(port_taken(log.read_text(errors="replace")) for log in tmp.glob("rank*.log")):
                raise PortTaken(port) from None
            raise
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return json.loads(summary_path.read_text())


def ranks_behind(ranks: list[subprocess.Popen], progress: dict[int, tuple[int, float] | None],
                 codes: list[int | None]) -> list[int]:
    """The rank(s) that got least far. Ranks with equal progress may all sit in one collective, the
    stuck one indistinguishable from those waiting for it, unless the operating system says it is stopped."""
    counts = {rank: beat[0] if beat else -1 for rank, beat in progress.items() if codes[rank] is None}
    lowest = min(counts.values())
    behind = [rank for rank, count in counts.items() if count == lowest]
    stopped = [rank for rank in behind if psutil_status(ranks[rank].pid) == "stopped"]
    return stopped or behind


def psutil_status(pid: int) -> str | None:
    import psutil

    try:
        return psutil.Process(pid).status()
    except psutil.Error:
        return None


def watch(ranks: list[subprocess.Popen], heartbeat_dir: Path, timeout: float) -> None:
    """Waits for every rank; raises RankFailed naming the rank that failed first or went silent.

    When one rank dies or hangs its peers stop too, in their next collective. Among ranks that exited
    badly in the same poll, one killed by a signal is blamed before one that exited with an error. When
    ranks go silent, the one that got least far is blamed: its peers went on into a collective (a beat)
    and wait there for it. A rank is silent from its last beat, or from the start while it has not beaten
    yet, and then the start-up grace applies instead of the timeout."""
    started = time.time()
    while True:
        codes = [proc.poll() for proc in ranks]
        failed = sorted((code > 0, rank, code) for rank, code in enumerate(codes) if code not in (None, 0))
        if failed:
            _, rank, code = failed[0]
            log = (heartbeat_dir / f"rank{rank}.log").read_text(errors="replace")
            last_line = log.strip().splitlines()[-1:] or ["no message"]
            raise RankFailed(f"rank {rank} exited with code {code} ({last_line[0]})")
        if all(code == 0 for code in codes):
            return
        now = time.time()
        progress = {rank: Heartbeat.read(heartbeat_dir / f"rank{rank}.beat") for rank in range(len(ranks))}
        beaten = {rank: beat is not None and beat[0] > 0 for rank, beat in progress.items()}
        silence = {rank: now - (progress[rank][1] if beaten[rank] else started)
                   for rank in progress if codes[rank] is None}
        limit = {rank: timeout if beaten[rank] else max(timeout, STARTUP_GRACE_SECONDS) for rank in silence}
        if any(silence[rank] > limit[rank] for rank in silence):
            behind = ranks_behind(ranks, progress, codes)
            quietest = min(silence[rank] for rank in behind)
            names = f"rank {behind[0]}" if len(behind) == 1 else "ranks " + ", ".join(map(str, behind))
            raise RankFailed(f"{names} made no progress for {quietest:.1f} s (rank_timeout {timeout:g} s)")
        time.sleep(POLL_SECONDS)
