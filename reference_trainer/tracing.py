"""The torch.profiler trace of a run's steady epochs, one file per rank."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

from reference_trainer.config import TrainConfig


def trace_file_name(rank: int) -> str:
    """Rank 0 writes the trace the profiling tools read; every other rank writes its own beside it."""
    return "trace.json.gz" if rank == 0 else f"trace.rank{rank}.json.gz"


def profiler_activities(device: torch.device) -> list[torch.profiler.ProfilerActivity]:
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return activities


def start_profiler(cfg: TrainConfig, device: torch.device, rank: int) -> torch.profiler.profile:
    """Starts recording the next `trace_epochs` epochs. The profiler's warm-up step is taken here, outside
    every epoch, so its start-up cost lands in no traced or timed epoch."""
    out = Path(cfg.trace_dir)
    out.mkdir(parents=True, exist_ok=True)
    profiler = torch.profiler.profile(
        activities=profiler_activities(device),
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=cfg.trace_epochs, repeat=1),
        on_trace_ready=functools.partial(export_trace, out / trace_file_name(rank)),
    )
    profiler.start()
    profiler.step()
    return profiler


def export_trace(path: Path, prof: torch.profiler.profile) -> None:
    prof.export_chrome_trace(str(path))
    prof.trace_path = str(path)


def set_up_cupti_before_capture(device: torch.device) -> None:
    """A trace shows a graph's kernels, all of them and on time, only if the profiler set up CUPTI before
    the graph was captured (pytorch#75504); an empty profiling session first is torch's own remedy
    (pytorch#100441, torch.profiler._utils._init_for_cuda_graphs), written here with public API. CUPTI must
    then stay set up when that session ends: torch.profiler keeps it (TEARDOWN_CUPTI=0) only for inductor's
    graphs, and tearing it down under captured graphs undoes the remedy, or crashes when CUPTI is set up
    again."""
    os.environ["TEARDOWN_CUPTI"] = "0"
    with torch.profiler.profile(activities=profiler_activities(device)):
        pass
