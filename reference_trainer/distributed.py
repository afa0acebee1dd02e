"""Training with several ranks: one process per rank on torch.distributed (gloo on CPU, nccl on CUDA).

`rlperf train --world-size N` either joins a job that torchrun (or another launcher) started, seen by the
RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT variables, or starts the N rank processes itself and
watches them: a rank that exits with an error, or stops reporting progress for `rank_timeout` seconds,
fails the whole run with that rank named, and the other ranks are stopped.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from reference_trainer.config import TrainConfig
from rlperf.cpus import cpu_ranks_refusal, usable_cores
from rlperf.errors import BadInput
from rlperf.processes import Heartbeat, RankFailed, launch_ranks, rank_gpu

GLOO_SETTLE_S = 0.5

__all__ = ["RankFailed", "join", "launch", "launch_or_join"]  # RankFailed: what `rlperf train` catches
SUMMARY_NAME = "summary.json"


def launch_or_join(cfg: TrainConfig, quiet: bool, save_policy: str) -> dict | None:
    if "RANK" in os.environ:
        return join(cfg, quiet, save_policy)
    return launch(cfg, save_policy)


def join(cfg: TrainConfig, quiet: bool, save_policy: str) -> dict | None:
    """Runs this process's rank; rank 0 returns the summary with every rank's phases, others None."""
    import torch
    import torch.distributed as dist

    from reference_trainer.devices import Rank, training_device
    from reference_trainer.progress import run_with_progress

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != cfg.world_size:
        raise BadInput(f"world_size: the launcher started {world} ranks but world_size is {cfg.world_size}")
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if cfg.is_cuda:
        local_rank = rank_gpu(local_rank, torch.cuda.device_count())
        torch.cuda.set_device(training_device(cfg, local_rank))  # before nccl, which binds to the current GPU
    elif not cfg.threads:
        # Ranks on one machine each taking every core oversubscribe the CPU; give each its share.
        torch.set_num_threads(max(1, usable_cores() // int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    # Collectives wait twice as long as the launcher's watchdog, so a silent rank is named by the watchdog
    # before its peers give up waiting in a collective and exit with errors of their own.
    dist.init_process_group("nccl" if cfg.is_cuda else "gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=2 * cfg.rank_timeout))
    me = Rank(rank, world, local_rank)
    heartbeat = Heartbeat.of_this_rank()
    if heartbeat is not None:
        me.beat = heartbeat.beat
    try:
        summary = run_with_progress(cfg, quiet or rank != 0, me, save_policy)  # every rank's figures in `ranks`
    finally:
        dist.destroy_process_group()
        if not cfg.is_cuda:
            # Gloo's worker threads can still hold the last collective's tensors just after destroy_process_group;
            # exiting at once then aborts the interpreter's shutdown (docs/multi-gpu.md#what-n-ranks-do).
            time.sleep(GLOO_SETTLE_S)
    return summary if rank == 0 else None


def launch(cfg: TrainConfig, save_policy: str) -> dict:
    """Starts one process per rank on this machine, watches them, and returns rank 0's summary."""
    refusal = None if cfg.is_cuda else cpu_ranks_refusal(cfg.world_size)  # CUDA ranks: one GPU each, checked
    if refusal:
        raise BadInput(f"world_size: {refusal}")

    def command_for(rank: int, directory: Path) -> list[str]:
        args = [sys.executable, "-m", "rlperf", "train", *cfg.to_args(), "--quiet"]
        if rank == 0:
            args += ["--json", str(directory / SUMMARY_NAME)] + (["--save-policy", save_policy] if save_policy else [])
        return args

    def summary(directory: Path) -> dict:
        return json.loads((directory / SUMMARY_NAME).read_text())

    return launch_ranks(cfg.world_size, command_for, summary, cfg.rank_timeout)
