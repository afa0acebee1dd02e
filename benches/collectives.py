"""All_reduce, all_gather, reduce_scatter and broadcast timed over a sweep of message sizes (`rlperf collectives`).

The ranks are launched and watched here, or joined under torchrun; each call is clocked on every rank and the
slowest kept, and sizes and bandwidths follow nccl-tests (docs/multi-gpu.md#rlperf-collectives).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from pathlib import Path
from statistics import median
from typing import Any, Callable

from rlperf.cpus import cpu_ranks_refusal
from rlperf.errors import BadInput, written_whole
from rlperf.processes import (RANK_DIR_ENV, STARTUP_GRACE_SECONDS, Heartbeat, Progress, RankFailed, launch_ranks,
                              rank_gpu)

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")
BACKENDS = ("gloo", "nccl")
ELEMENT_BYTES = 4  # float32
DEFAULT_MIN_BYTES = 8
# nccl-tests goes to a GiB on GPUs; gloo on a few CPU cores moves a few hundred MB/s to a few GB/s, and
# 64 MiB keeps the CPU default well under a minute.
DEFAULT_MAX_BYTES = {"nccl": 2**30, "gloo": 64 * 2**20}
DEFAULT_ITERS = 20
DEFAULT_WARMUP = 5
DEFAULT_RANK_TIMEOUT = 120.0
SUITE = "collectives"

RESULT_FILE = "result.json"  # where, in the ranks' directory, rank 0 leaves the results for the launcher
# Heartbeat stages before the first op; op i is stage FIRST_OP_STAGE + i.
STARTING, JOINING, AGREEING, FIRST_OP_STAGE = 0, 1, 2, 3


# ---- sizes and bandwidth ------------------------------------------------------------------------------------

def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' ratio of bus bandwidth to algorithm bandwidth."""
    if op == "all_reduce":
        return 2 * (world_size - 1) / world_size
    if op in ("all_gather", "reduce_scatter"):
        return (world_size - 1) / world_size
    return 1.0


def element_counts(op: str, min_bytes: int, max_bytes: int, world_size: int) -> list[int]:
    """float32 element counts for sizes doubling from min_bytes to max_bytes. all_gather and reduce_scatter
    split their buffer evenly among the ranks, so their counts are rounded down to a multiple of the rank
    count (at least one element per rank); sizes that round to the same count are measured once."""
    counts: list[int] = []
    size = min_bytes
    while size <= max_bytes:
        count = max(1, size // ELEMENT_BYTES)
        if op in ("all_gather", "reduce_scatter"):
            count = max(world_size, count // world_size * world_size)
        if count not in counts:
            counts.append(count)
        size *= 2
    return counts


def bandwidth_row(op: str, backend: str, world_size: int, nbytes: int, repeat: int, seconds: float) -> dict:
    """One timed call. A call clocked at zero (one nccl rank's in-place call moves nothing, and its two
    events can read 0.0 ms) has no bandwidth: None, stored as NULL."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else None
    return {"op": op, "backend": backend, "world_size": world_size, "bytes": nbytes, "repeat": repeat,
            "time_us": seconds * 1e6, "algbw_gbps": algbw,
            "busbw_gbps": None if algbw is None else algbw * bus_factor(op, world_size)}


def median_bandwidth(rows: list[dict], key: str) -> str:
    """The median over the calls that have a bandwidth, or a dash when none has."""
    values = [row[key] for row in rows if row[key] is not None]
    return f"{median(values):.3f}" if values else "–"


def format_bytes(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if nbytes < 1024:
            return f"{nbytes:g} {unit}"
        nbytes /= 1024
    return f"{nbytes:g} GiB"


# ---- settings -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Settings:
    world_size: int | None  # None: chosen for the machine (every visible GPU with nccl, 2 with gloo)
    backend: str | None  # None: nccl when a GPU is visible, else gloo
    min_bytes: int
    max_bytes: int | None  # None: the backend's default, capped by free memory
    iters: int
    warmup: int
    rank_timeout: float

    def as_args(self) -> list[str]:
        args = ["--world-size", str(self.world_size), "--backend", self.backend, "--min-bytes", str(self.min_bytes),
                "--iters", str(self.iters), "--warmup", str(self.warmup), "--rank-timeout", repr(self.rank_timeout)]
        if self.max_bytes is not None:
            args += ["--max-bytes", str(self.max_bytes)]
        return args


def check_backend(backend: str, world_size: int, local_ranks: int, gpu_count: int, nccl: bool) -> None:
    if backend != "nccl":
        return
    if not gpu_count or not nccl:
        raise BadInput("backend: nccl needs a CUDA GPU and a torch built with NCCL; none here (use --backend gloo)")
    if local_ranks > gpu_count:
        raise BadInput(f"world_size: {local_ranks} nccl ranks on this machine need {local_ranks} GPUs; "
                       f"{gpu_count} visible (world size {world_size})")


# ---- the launcher -------------------------------------------------------------------------------------------

def run_launcher(asked: Settings, store_path: Path, label: str | None) -> int:
    """Starts the ranks on this machine, stores rank 0's results and shows them; exit 1 when a rank failed."""
    from rlperf.machine import probe
    from rlperf.store import Store
    from rlperf.terminal import default_console

    machine = probe()
    backend = asked.backend or ("nccl" if machine.gpus and machine.nccl else "gloo")
    world_size = asked.world_size or (len(machine.gpus) if backend == "nccl" else 2)
    check_backend(backend, world_size, world_size, len(machine.gpus), machine.nccl is not None)
    refusal = cpu_ranks_refusal(world_size) if backend == "gloo" else None
    if refusal:
        raise BadInput(f"world_size: {refusal}")
    settings = replace(asked, world_size=world_size, backend=backend)
    console = default_console()
    store_path.parent.mkdir(parents=True, exist_ok=True)
    with Store.open(store_path) as store:  # a bad store is refused before anything is measured
        try:
            result = launch(settings, console)
        except RankFailed as exc:
            sys.stderr.write(f"rlperf collectives: error: {exc}\n")
            return 1
        run_id = save(store, result, settings, machine, label)
    show(console, result, run_id, store_path)
    return 0


def launch(settings: Settings, console) -> dict:
    """Starts the rank processes, watches them, and returns rank 0's result."""
    def command_for(rank: int, directory: Path) -> list[str]:
        return [sys.executable, "-m", "rlperf", "collectives", *settings.as_args()]

    def result(directory: Path) -> dict:
        return json.loads((directory / RESULT_FILE).read_text())

    with console.status("starting ranks") as status:
        def show_progress(progress: list[Progress]) -> None:
            status.update(f"{settings.world_size} {settings.backend} ranks: {describe_stage(progress[0])}")

        return launch_ranks(settings.world_size, command_for, result, settings.rank_timeout, describe_stage,
                            show_progress)


def describe_stage(progress: Progress) -> str:
    if progress.stage == STARTING:
        return "starting"
    if progress.stage == JOINING:
        return "joining the process group"
    if progress.stage == AGREEING:
        return "agreeing on message sizes"
    return f"{OPS[progress.stage - FIRST_OP_STAGE]} of {format_bytes(progress.size)}"


# ---- the ranks ----------------------------------------------------------------------------------------------

def run_launched_rank(settings: Settings) -> int:
    """One rank that run_launcher started: rank 0 leaves the results in its directory for the launcher."""
    # The launcher's watchdog decides first; the process group's own timeout is the backstop.
    backstop = timedelta(seconds=2 * max(settings.rank_timeout, STARTUP_GRACE_SECONDS))
    result = measure(settings, Heartbeat.of_this_rank(), backstop)
    if result is not None:
        directory = Path(os.environ[RANK_DIR_ENV])
        with written_whole(directory / RESULT_FILE) as partial:
            partial.write_text(json.dumps(result))
    return 0


def run_external_rank(asked: Settings, store_path: Path, label: str | None) -> int:
    """One rank of a torchrun job (one node or several); rank 0 prints and stores."""
    import torch
    import torch.distributed as dist

    from rlperf.machine import Machine, describe_torch
    from rlperf.store import Store
    from rlperf.terminal import default_console

    world_size, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if asked.world_size is not None and asked.world_size != world_size:
        raise BadInput(f"world_size: the launcher started {world_size} ranks but --world-size is {asked.world_size}")
    nccl = torch.cuda.is_available() and dist.is_nccl_available()
    backend = asked.backend or ("nccl" if nccl else "gloo")
    gpus = torch.cuda.device_count()
    # A rank the launcher gave one GPU uses it (rank_gpu): the other local ranks have GPUs of their own.
    local_ranks = 1 if gpus == 1 else int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    check_backend(backend, world_size, local_ranks, gpus, nccl)
    settings = replace(asked, world_size=world_size, backend=backend)
    store = None
    if rank == 0:
        store_path.parent.mkdir(parents=True, exist_ok=True)
        store = Store.open(store_path)
    try:
        result = measure(settings, Heartbeat(), timedelta(seconds=settings.rank_timeout))
        if store is None:
            return 0
        run_id = save(store, result, settings, Machine(**describe_torch()), label)
    finally:
        if store is not None:
            store.close()
    show(default_console(), result, run_id, store_path)
    return 0


def measure(settings: Settings, heartbeat: Heartbeat, timeout: timedelta) -> dict | None:
    """This rank's part of the sweep; rank 0 returns the rows (slowest rank per timed iteration), others None."""
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", settings.world_size))
    on_gpu = settings.backend == "nccl"
    device = torch.device("cuda", rank_gpu(local_rank, torch.cuda.device_count())) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    heartbeat.at(JOINING)  # not progress yet: the start-up grace lasts until every rank has joined
    dist.init_process_group(settings.backend, rank=rank, world_size=settings.world_size, timeout=timeout,
                            device_id=device if on_gpu else None)
    try:
        heartbeat.enter(AGREEING)
        cap = torch.tensor([memory_cap(device, local_ranks)], dtype=torch.int64, device=device)
        dist.all_reduce(cap, op=dist.ReduceOp.MIN)
        requested = settings.max_bytes or max(DEFAULT_MAX_BYTES[settings.backend], settings.min_bytes)
        max_bytes = min(requested, int(cap.item()))
        if max_bytes < settings.min_bytes:
            raise RuntimeError(f"max_bytes: free memory allows messages up to {format_bytes(max_bytes)}, "
                               f"below --min-bytes {format_bytes(settings.min_bytes)}")
        clock = EventClock() if on_gpu else WallClock()
        rows = []
        for stage, op in enumerate(OPS, start=FIRST_OP_STAGE):
            for count in element_counts(op, settings.min_bytes, max_bytes, settings.world_size):
                nbytes = count * ELEMENT_BYTES
                heartbeat.enter(stage, nbytes)
                seconds = time_op(op, count, settings, device, clock, heartbeat)
                if rank == 0:
                    rows += [bandwidth_row(op, settings.backend, settings.world_size, nbytes, repeat, s)
                             for repeat, s in enumerate(seconds)]
        device_name = torch.cuda.get_device_name(device) if on_gpu else "cpu"
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return None
    return {"rows": rows, "device_name": device_name, "max_bytes": max_bytes, "requested_max_bytes": requested}


def memory_cap(device, local_ranks: int) -> int:
    """The largest power-of-two message every op can hold here: all_gather and reduce_scatter keep the
    full buffer plus a rank's share (under 2x the size); CPU ranks on one host share its RAM."""
    import psutil
    import torch

    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0] * 0.8
    else:
        free = psutil.virtual_memory().available * 0.6 / local_ranks
    usable = int(free // 2)
    return 1 << (usable.bit_length() - 1) if usable > 0 else 0


class WallClock:
    """gloo on CPU tensors returns when the collective is done, so a host clock reads its duration."""

    def mark(self) -> int:
        return time.perf_counter_ns()

    def seconds(self, starts: list, ends: list) -> list[float]:
        return [(end - start) / 1e9 for start, end in zip(starts, ends)]


class EventClock:
    """CUDA events on the current stream, which waits for NCCL's stream after each collective; read
    after a device synchronize."""

    def __init__(self):
        import torch

        self.cuda = torch.cuda

    def mark(self):
        event = self.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, starts: list, ends: list) -> list[float]:
        self.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in zip(starts, ends)]


def time_op(op: str, count: int, settings: Settings, device, clock, heartbeat: Heartbeat) -> list[float]:
    """The slowest rank's seconds for each timed iteration of one op at one size."""
    import torch
    import torch.distributed as dist

    world, rank = settings.world_size, dist.get_rank()
    call, check = collective(op, count, world, rank, device)
    heartbeat.beat()
    call()
    if not check():
        raise RuntimeError(f"{op} of {format_bytes(count * ELEMENT_BYTES)} gave a wrong result on rank {rank}")
    for _ in range(settings.warmup):
        heartbeat.beat()
        call()
    dist.barrier()
    starts, ends = [], []
    for _ in range(settings.iters):
        heartbeat.beat()
        starts.append(clock.mark())
        call()
        ends.append(clock.mark())
    slowest = torch.tensor(clock.seconds(starts, ends), dtype=torch.float64, device=device)
    heartbeat.beat()
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return slowest.tolist()


def collective(op: str, count: int, world: int, rank: int, device) -> tuple[Callable[[], Any], Callable[[], bool]]:
    """The call to time and a check of its first result. Ranks contribute rank + 1, so a sum over ranks is
    world (world + 1) / 2; after the check the buffers are zeroed, so repeated in-place sums stay finite."""
    import torch
    import torch.distributed as dist

    # The *_single names replace the *_tensor ones in newer torch.
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    total = world * (world + 1) / 2
    if op == "all_reduce":
        data = torch.full((count,), rank + 1.0, device=device)
        return lambda: dist.all_reduce(data), lambda: zeroed(bool(data.eq(total).all()), data)
    if op == "all_gather":
        share = torch.full((count // world,), rank + 1.0, device=device)
        gathered = torch.empty(count, device=device)
        expected = torch.arange(1, world + 1, device=device, dtype=torch.float32).unsqueeze(1)
        return (lambda: all_gather(gathered, share),
                lambda: zeroed(bool(gathered.view(world, -1).eq(expected).all()), share))
    if op == "reduce_scatter":
        data = torch.full((count,), rank + 1.0, device=device)
        share = torch.empty(count // world, device=device)
        return lambda: reduce_scatter(share, data), lambda: zeroed(bool(share.eq(total).all()), data)
    data = torch.full((count,), 1.0 if rank == 0 else 0.0, device=device)
    return lambda: dist.broadcast(data, src=0), lambda: zeroed(bool(data.eq(1.0).all()), data)


def zeroed(ok: bool, data) -> bool:
    data.zero_()
    return ok


# ---- storing and showing ------------------------------------------------------------------------------------

def save(store, result: dict, settings: Settings, machine, label: str | None) -> str:
    """Adds one run holding the rows, with the fingerprint bench runs carry; the settings are its
    `suite_overrides` and their hash its `suite_hash`."""
    from rlperf.machine import collect, machine_key

    described = {**asdict(settings), "max_bytes": result["max_bytes"], "ops": list(OPS),
                 "element": "float32", "device_name": result["device_name"]}
    suite_hash = hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]
    fingerprint = collect(machine, suite_hash, described)
    run_id = store.create_run(SUITE, suite_hash, fingerprint, machine_key(fingerprint), label)
    store.add_collectives(run_id, result["rows"])
    store.finish_run(run_id, "complete")
    return run_id


def show(console, result: dict, run_id: str, store_path: Path) -> None:
    from rich.table import Table

    rows = result["rows"]
    first = rows[0]
    capped = ""
    if result["max_bytes"] < result["requested_max_bytes"]:
        capped = f"; sizes capped at {format_bytes(result['max_bytes'])} by free memory"
    table = Table(title=f"{first['backend']}, {first['world_size']} ranks on {result['device_name']}: "
                        f"median of {len({r['repeat'] for r in rows})} timed iterations, each the slowest rank's "
                        f"time{capped}")
    for column in ("op", "size", "time µs", "min–max µs", "algbw GB/s", "busbw GB/s"):
        table.add_column(column, justify="left" if column == "op" else "right")
    grouped: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        grouped.setdefault((row["op"], row["bytes"]), []).append(row)
    previous_op = None
    for (op, nbytes), group in grouped.items():
        if previous_op is not None and op != previous_op:
            table.add_section()
        times = [row["time_us"] for row in group]
        table.add_row(op if op != previous_op else "", format_bytes(nbytes), f"{median(times):,.1f}",
                      f"{min(times):,.1f}–{max(times):,.1f}", median_bandwidth(group, "algbw_gbps"),
                      median_bandwidth(group, "busbw_gbps"))
        previous_op = op
    console.print(table)
    console.print(f"stored run {run_id} in {store_path} ({len(rows)} rows); `rlperf report {store_path}` renders it")
