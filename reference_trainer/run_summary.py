"""The reference trainer's summary of a run: the shared record (rlperf/summary.py), built once at the end of a run
with every field only this trainer knows, written as the JSON of docs/results-format.md (`rlperf train --json`)."""

from __future__ import annotations

import math
import platform
from typing import Any

import numpy as np
import torch

from reference_trainer.config import TrainConfig
from reference_trainer.devices import Rank
from reference_trainer.solving import time_to_solve
from rlperf import __version__
from rlperf.machine import cuda_uuid, torch_versions
from rlperf.memory import device_peaks, host_peak_rss_bytes, memory_record
from rlperf.summary import SCHEMA, RunSummary

# the rollout's phases outside `env`: the trainer thread's work for the policy, which a group's env step can run beside
POLICY_PHASES = ("eval_forward", "eval_copy", "eval_misc")


def summary_of_run(cfg: TrainConfig, epochs: list[dict], *, wall_seconds: float, warmup_seconds: float,
                   compile_seconds: float, env_start_seconds: float, env_build_seconds: float,
                   setup_seconds: dict[str, float],
                   dtype_used: torch.dtype, device: torch.device, steady_window_unix_ns: list[int],
                   h2d_bytes_per_step: int, work: dict[str, Any], parameters: int,
                   profiler: torch.profiler.profile | None, timeline: list[tuple], rank: Rank,
                   phase_peaks: dict[str, list[int]] | None = None) -> RunSummary:
    """The summary of a run's `epochs`, its steady figures over the non-warm-up epochs. With several
    ranks, every rank calls this: they gather each other's steady figures into `ranks`. `phase_peaks`: each
    phase's device peaks in the last warm-up epoch, where the timers read them (CUDA)."""
    steady = [e for e in epochs if not e["warmup"]]
    steady_seconds = sum(e["seconds"] for e in steady)
    steady_steps = sum(e["steps"] for e in steady)
    steps = sum(e["steps"] for e in epochs)
    sps = steady_steps / steady_seconds
    phases = {name: sum(e["phases"][name] for e in steady) for name in epochs[0]["phases"]}
    tail = epochs[-max(1, math.ceil(len(epochs) / 10)):]
    tail_returns = [e["mean_episode_return"] for e in tail if e["mean_episode_return"] is not None]
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return RunSummary(
        schema=SCHEMA,
        writer="reference",
        config=cfg.to_dict(),
        sps=sps,
        sps_end_to_end=steps / wall_seconds,
        warmup_seconds=warmup_seconds,
        compile_seconds=compile_seconds,
        env_start_seconds=env_start_seconds,
        env_build_seconds=env_build_seconds,
        setup_seconds=setup_seconds,
        wall_seconds=wall_seconds,
        steps=steps,
        steady_steps=steady_steps,
        steady_seconds=steady_seconds,
        phases=phases,
        phase_coverage=sum(phases.values()) / steady_seconds if cfg.timers else None,
        env_overlap=env_overlap(cfg, steady, phases),
        epochs=epochs,
        mean_episode_return=float(np.mean(tail_returns)) if tail_returns else None,
        episodes=sum(e["episodes"] for e in epochs),
        losses=epochs[-1]["losses"],
        dtype_used=str(dtype_used).removeprefix("torch."),
        world_size=cfg.world_size,
        device_name=device_name,
        device_uuid=cuda_uuid(device) if device.type == "cuda" else None,
        versions={"python": platform.python_version(), "numpy": np.__version__, "rlperf": __version__,
                  **torch_versions()},
        trace=None if profiler is None else getattr(profiler, "trace_path", None),
        timeline=None if profiler is None else [list(mark) for mark in timeline],
        steady_window_unix_ns=steady_window_unix_ns,
        h2d_bytes_per_step=h2d_bytes_per_step,
        work=work,
        parameters=parameters,
        time_to_solve=time_to_solve(cfg, epochs, sps),
        ranks=rank.all_gather({"rank": rank.rank, "sps": sps, "phases": phases, "device_name": device_name}),
        memory=run_memory(device, phase_peaks or {}),
    )


def run_memory(device: torch.device, phase_peaks: dict[str, list[int]]) -> dict[str, Any]:
    """The summary's `memory`: the process's peak resident set, and on CUDA the allocator's peaks since the steady
    epochs began (reset then), with each phase's from the last warm-up epoch where the timers read them."""
    if device.type != "cuda":
        return memory_record(host_peak_rss_bytes())
    return memory_record(host_peak_rss_bytes(), device_peaks(device), phase_peaks)


def env_overlap(cfg: TrainConfig, steady: list[dict], phases: dict[str, float]) -> dict[str, Any] | None:
    """Over the steady epochs: the env's own busy seconds, the trainer thread's seconds spent on the env
    (starting and waiting for its steps), and the policy's (the rollout's other phases; null without
    timers); null for an env stepped on the device, which has no host step to overlap."""
    if steady[0]["env_busy_seconds"] is None:
        return None
    return {
        "env_busy_seconds": sum(e["env_busy_seconds"] for e in steady),
        "env_wait_seconds": sum(e["env_wait_seconds"] for e in steady),
        "policy_seconds": sum(phases[name] for name in POLICY_PHASES) if cfg.timers else None,
    }
