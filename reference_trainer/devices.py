"""Where and how one rank computes: its place among the ranks, its device, the stream and precision it
computes in, and the calls the training loop makes into the device (eager, compiled, or replayed as CUDA
graphs)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from reference_trainer.config import ConfigError, TrainConfig

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def no_progress_report() -> None:
    pass


@dataclass
class Rank:
    """Where this process sits among the ranks: its share of the environments, its GPU (`local_rank`, its
    index on this machine), its collectives, and `beat`, called as work progresses so a launcher can tell
    a hung rank from a waiting one."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    beat: Callable[[], None] = no_progress_report

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            self.beat()  # entering a collective counts as progress: peers that wait here are not stuck
            torch.distributed.all_reduce(tensor)
        return tensor

    def any_rank(self, flag: bool, device: torch.device) -> bool:
        """Whether `flag` holds on any rank (one collective, and one read of its result, with several)."""
        if self.world_size == 1:
            return flag
        return bool(self.all_reduce_sum(torch.tensor([float(flag)], device=device)).item())

    def all_gather(self, record: Any) -> list[Any] | None:
        """Every rank's `record`, in rank order; None for a run of one rank."""
        if self.world_size == 1:
            return None
        self.beat()
        everyone: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(everyone, record)
        return everyone


def rank_device(requested: str, local_rank: int) -> str:
    """The device one rank trains on. `cuda` and `cuda:N` name the first GPU of this machine's ranks and
    local rank r takes the r-th one after it, so `cuda:2` with two ranks uses GPUs 2 and 3 (the GPUs the
    bench probe and sampler assign to the point). The config keeps the device as requested."""
    if requested == "cpu":
        return "cpu"
    return f"cuda:{int(requested.partition(':')[2] or 0) + local_rank}"


def training_device(cfg: TrainConfig, local_rank: int) -> torch.device:
    """This rank's device, checked before anything creates a CUDA context."""
    name = rank_device(cfg.device, local_rank)
    if name == "cpu":
        return torch.device(name)
    if not torch.cuda.is_available():
        raise ConfigError("device", f"{cfg.device} requested but CUDA is not available (allowed here: cpu)")
    index, visible = torch.device(name).index, torch.cuda.device_count()
    if index >= visible:
        raise ConfigError("device", f"{cfg.device} with local rank {local_rank} needs GPU {index}, but {visible} "
                                    f"are visible (allowed: cuda:0 to cuda:{visible - 1})")
    return torch.device(name)


def open_compute_stream(cfg: TrainConfig, device: torch.device) -> torch.cuda.Stream | None:
    """A graphed run computes on a side stream from its first kernel, so the eager warm-up epochs and the
    capture run on one stream, as torch's CUDA-graph notes prescribe: state created lazily per stream
    (cuBLAS workspaces, autograd's stream bookkeeping) exists before capture instead of inside it."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not cfg.cuda_graphs:
        return None
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream())
    return stream


class Autocast:
    """The autocast context of forward passes and losses at the configured precision."""

    def __init__(self, device: torch.device, cfg: TrainConfig):
        self.device_type = device.type
        self.dtype = AUTOCAST_DTYPES[cfg.dtype]
        # Cached weight casts would outlive a CUDA graph capture; casts must be part of each replay.
        self.cache_enabled = not cfg.cuda_graphs

    def __call__(self) -> torch.autocast:
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.dtype is not None,
                              cache_enabled=self.cache_enabled)


class DeviceCalls:
    """The calls the loop makes into the device, each reading and writing only fixed buffers: each group's
    policy step (`steps`), the update's forward and loss (`forward`), and its backward and optimizer step
    (`learn`), or a whole rollout (`rollout`) made of the steps and a whole update (`update`) made of the two
    halves. Eager, or compiled by torch.compile
    (`compile=True`; a whole call's parts are), until `capture()` replaces them with CUDA graphs."""

    def __init__(self, steps: list[Callable[[], None]], forward: Callable[[], None], learn: Callable[[], None],
                 compile: bool):
        self.steps, self.forward, self.learn = steps, forward, learn
        self.rollout: Callable[[], None] | None = None
        self.update: Callable[[], None] | None = None
        self.first_calls: list[FirstCallTimed] = []
        self.capture_seconds = 0.0
        if compile:
            self.steps = [self.first_call_timed(torch.compile(fn)) for fn in self.steps]
            self.forward = self.first_call_timed(torch.compile(self.forward))
            self.learn = self.first_call_timed(self.learn)  # the compiled backward is built on its first use

    def cover_rollout(self, whole_rollout: Callable[[list[Callable[[], None]]], Callable[[], None]]) -> None:
        """Makes the rollout one call, `whole_rollout` of the (compiled) steps: captured whole, not step by step."""
        self.rollout = whole_rollout(self.steps)

    def cover_update(self, whole_update: Callable[[Callable[[], None], Callable[[], None]], Callable[[], None]]) -> None:
        """Makes the update one call, `whole_update` of the (compiled) forward and learn halves."""
        self.update = whole_update(self.forward, self.learn)

    def first_call_timed(self, fn: Callable[[], None]) -> FirstCallTimed:
        timed = FirstCallTimed(fn)
        self.first_calls.append(timed)
        return timed

    @property
    def compile_seconds(self) -> float:
        return self.capture_seconds + sum(call.seconds for call in self.first_calls)

    def capture(self, stream: torch.cuda.Stream) -> None:
        """Replaces the eager calls with CUDA graphs captured on `stream`, the one the eager calls ran on. Capture
        records kernels without running them, so no state advances here. A step-by-step update is two graphs
        (forward+loss, then backward+optimizer) so their phases stay separately timed; they share a memory pool
        because the backward graph reads what the forward graph saved."""
        capture_start = time.perf_counter()
        # A graph keeps addresses, not tensors: what the replaced calls read and write stays referenced here
        # for as long as the graphs can be replayed, whoever else holds it.
        self.captured_calls = (self.steps, self.forward, self.learn, self.rollout, self.update)
        if self.rollout is not None:
            self.rollout = captured(self.rollout, stream).replay
        else:
            self.steps = [captured(step, stream).replay for step in self.steps]
        if self.update is not None:
            self.update = captured(self.update, stream).replay
        else:
            forward_graph = captured(self.forward, stream)
            self.learn = captured(self.learn, stream, pool=forward_graph.pool()).replay
            self.forward = forward_graph.replay
        self.capture_seconds += time.perf_counter() - capture_start


def captured(call: Callable[[], None], stream: torch.cuda.Stream, pool: Any = None) -> torch.cuda.CUDAGraph:
    """`call` captured as a CUDA graph on `stream`, in memory of its own or of `pool`'s."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        call()
    return graph


class FirstCallTimed:
    """torch.compile compiles on the first call; that call's time is kept in `seconds` as compile time."""

    def __init__(self, fn: Callable[[], None]):
        self.fn, self.called, self.seconds = fn, False, 0.0

    def __call__(self) -> None:
        if self.called:
            return self.fn()
        self.called = True
        start = time.perf_counter()
        self.fn()
        self.seconds = time.perf_counter() - start
