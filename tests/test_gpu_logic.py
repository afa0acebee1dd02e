"""The GPU paths' logic that does not need a GPU: which device a rank uses, the rules that refuse knobs,
the compile-time accounting, the per-rank trace names and the collectives' bandwidth of a call timed at zero.
The CUDA behaviour itself is in tests/test_gpu_knobs.py."""

import gc
import time
import weakref
from io import StringIO

import pytest
import torch
from rich.console import Console

from benches.collectives import Settings, bandwidth_row, save, show
from reports.render import collectives_section
from decisions.rundata import load
from rlperf.machine import Machine
from rlperf.processes import RANK_DIR_ENV, rank_gpu
from rlperf.store import Store
from reference_trainer.config import ConfigError, TrainConfig, validate
from reference_trainer.config import PHASES
from reference_trainer.devices import DeviceCalls, rank_device, training_device
from reference_trainer import timing
from reference_trainer.timing import PhaseTimer
from reference_trainer.tracing import trace_file_name
from reference_trainer.train import train

SMALL = dict(env="synthetic", num_envs=8, horizon=4, minibatch_size=16, hidden_size=8, total_steps=96, threads=1)


@pytest.mark.parametrize("warmup_epochs", [0, 1])
def test_cuda_graphs_need_two_warmup_epochs_one_eager_and_one_replayed(warmup_epochs):
    cfg = TrainConfig(**{**SMALL, "device": "cuda", "cuda_graphs": True, "warmup_epochs": warmup_epochs})
    with pytest.raises(ConfigError) as refused:
        validate(cfg)
    assert refused.value.field_name == "warmup_epochs" and f"(got {warmup_epochs})" in str(refused.value)
    validate(TrainConfig(**{**SMALL, "device": "cuda", "cuda_graphs": True, "warmup_epochs": 2}))


@pytest.mark.parametrize("requested, local_rank, expected", [
    ("cpu", 3, "cpu"),
    ("cuda", 0, "cuda:0"),  # torch.cuda.set_device refuses a device without an index
    ("cuda", 3, "cuda:3"),
    ("cuda:2", 0, "cuda:2"),
    ("cuda:2", 1, "cuda:3"),  # an offset is kept for every rank: the GPUs the probe and sampler watch
])
def test_each_rank_trains_on_its_own_indexed_device(requested, local_rank, expected):
    assert rank_device(requested, local_rank) == expected


def test_the_probe_watches_the_gpus_the_ranks_use():
    machine = Machine(torch="2.13.0", cuda="12.8", cudnn=None, nccl=None,
                      gpus=[{"index": i, "name": "GPU", "uuid": f"GPU-{i}", "bf16": True} for i in range(4)])
    config = {"device": "cuda:1", "world_size": 2}
    used = [f"GPU-{torch.device(rank_device(config['device'], rank)).index}" for rank in range(2)]
    assert machine.gpu_uuids(config) == used


def test_a_cuda_device_without_cuda_is_refused_before_any_cuda_call(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without CUDA")

    def no_cuda_call(*args, **kwargs):
        raise AssertionError("a CUDA call was made before the device was checked")

    monkeypatch.setattr(torch.cuda, "set_device", no_cuda_call)
    monkeypatch.setattr(torch.cuda, "Stream", no_cuda_call)
    for device in ("cuda", "cuda:1"):
        with pytest.raises(ConfigError) as refused:
            train(validate(TrainConfig(**{**SMALL, "device": device})))
        assert refused.value.field_name == "device" and "not available" in str(refused.value)


def test_a_cuda_device_the_machine_lacks_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError) as refused:
        training_device(validate(TrainConfig(**{**SMALL, "device": "cuda:1", "world_size": 2})), local_rank=1)
    assert refused.value.field_name == "device" and "needs GPU 2, but 2 are visible" in str(refused.value)
    assert training_device(validate(TrainConfig(**{**SMALL, "device": "cuda"})), local_rank=1) == torch.device("cuda:1")


@pytest.mark.parametrize("local_rank, visible, environ, expected", [
    # SLURM or Kubernetes gave this rank one GPU: it is GPU 0 of what the rank sees
    (3, 1, {"CUDA_VISIBLE_DEVICES": "GPU-1234"}, 0),
    (3, 1, {"CUDA_VISIBLE_DEVICES": "3", "LOCAL_WORLD_SIZE": "4"}, 0),
    (0, 1, {"LOCAL_WORLD_SIZE": "1"}, 0),
    (3, 8, {}, 3),  # torchrun on a whole node: LOCAL_RANK picks the GPU
    # two ranks torchrun started on a one-GPU machine: the second keeps its LOCAL_RANK, and is refused
    (1, 1, {"LOCAL_WORLD_SIZE": "2"}, 1),
    (1, 1, {"CUDA_VISIBLE_DEVICES": "0,1", "LOCAL_WORLD_SIZE": "2"}, 1),
    # ranks rlperf starts see the whole machine: one GPU there is all the machine has
    (1, 1, {RANK_DIR_ENV: "/tmp/ranks", "CUDA_VISIBLE_DEVICES": "0"}, 1),
    (0, 1, {RANK_DIR_ENV: "/tmp/ranks"}, 0),
])
def test_a_rank_given_one_gpu_uses_it(local_rank, visible, environ, expected):
    assert rank_gpu(local_rank, visible, environ) == expected


def test_a_one_gpu_rank_trains_on_it_and_an_offset_it_cannot_honour_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    four_ranks = dict(SMALL, device="cuda", world_size=4, num_envs=16, minibatch_size=64)
    gpu = rank_gpu(local_rank=3, visible_gpus=1, environ={"CUDA_VISIBLE_DEVICES": "GPU-1234"})
    assert training_device(validate(TrainConfig(**four_ranks)), gpu) == torch.device("cuda:0")
    with pytest.raises(ConfigError) as refused:
        training_device(validate(TrainConfig(**{**four_ranks, "device": "cuda:1"})), gpu)
    assert refused.value.field_name == "device" and "needs GPU 1, but 1 are visible" in str(refused.value)
    # two ranks on a one-GPU machine with nothing saying the GPU was given to this rank: refused, not shared
    crowded = rank_gpu(local_rank=1, visible_gpus=1, environ={"LOCAL_WORLD_SIZE": "2"})
    with pytest.raises(ConfigError) as refused:
        training_device(validate(TrainConfig(**{**four_ranks, "world_size": 2})), crowded)
    assert refused.value.field_name == "device" and "needs GPU 1, but 1 are visible" in str(refused.value)


def test_a_collective_timed_at_zero_has_no_bandwidth_and_shows_none(tmp_path):
    # One nccl rank's in-place all_reduce moves nothing: its event pair can read 0.0 ms.
    rows = [bandwidth_row("all_reduce", "nccl", 1, 4096, repeat, 0.0) for repeat in range(3)]
    rows += [bandwidth_row("broadcast", "nccl", 1, 4096, repeat, 2e-6) for repeat in range(3)]
    assert rows[0]["time_us"] == 0.0 and rows[0]["algbw_gbps"] is None and rows[0]["busbw_gbps"] is None
    assert rows[-1]["algbw_gbps"] == pytest.approx(4096 / 2e-6 / 1e9)
    result = {"rows": rows, "device_name": "GPU", "max_bytes": 4096, "requested_max_bytes": 4096}
    console = Console(file=StringIO(), width=200)
    show(console, result, "run-1", tmp_path / "results.sqlite")
    all_reduce = next(line for line in console.file.getvalue().splitlines() if "all_reduce" in line)
    assert all_reduce.count("–") == 3  # the min–max range, and no algbw, no busbw
    store_path = tmp_path / "results.sqlite"
    with Store.open(store_path) as store:
        save(store, result, Settings(1, "nccl", 4096, 4096, 3, 0, 60.0),
             Machine(torch="2.13.0", cuda="12.8", cudnn=None, nccl="2.27.3", gpus=[]), None)
    shown = collectives_section(load(str(store_path))).tables[0].set_index("op")
    assert shown.loc["all_reduce", "algbw GB/s"] == "–" and shown.loc["broadcast", "busbw GB/s"] == "2.05"


def test_the_copy_delay_hook_is_refused_on_a_cpu():
    with pytest.raises(ConfigError) as refused:
        train(validate(TrainConfig(**SMALL)), copy_delay_cycles=1000)
    assert refused.value.field_name == "copy_delay_cycles"


def test_nothing_compiled_or_captured_reports_no_compile_time():
    summary = train(validate(TrainConfig(**SMALL)))
    assert summary["compile_seconds"] == 0.0
    assert summary["config"]["device"] == "cpu"


def test_each_rank_writes_its_own_trace():
    assert trace_file_name(0) == "trace.json.gz"  # the name rlperf profile reads and refuses to overwrite
    assert len({trace_file_name(rank) for rank in range(8)}) == 8


def test_captured_device_calls_keep_the_tensors_their_graphs_read_and_write_alive(monkeypatch):
    """A CUDA graph keeps addresses, never tensors; torch's graph API stood in for on a CPU (a graph holding
    nothing its capture read, a capture that collects garbage as torch's empties the allocator's cache)."""
    class Graph:
        def replay(self) -> None:
            pass

        def pool(self) -> None:
            return None

    class Capture:
        def __init__(self, graph, pool=None, stream=None):
            pass

        def __enter__(self) -> None:
            gc.collect()

        def __exit__(self, *exc) -> None:
            pass

    monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
    monkeypatch.setattr(torch.cuda, "graph", Capture)

    def writes_into(buffer: torch.Tensor):
        return lambda: buffer.add_(1.0)

    buffers = [torch.zeros(4) for _ in range(4)]
    held = [weakref.ref(buffer) for buffer in buffers]
    calls = DeviceCalls([writes_into(buffers[0]), writes_into(buffers[1])], writes_into(buffers[2]),
                        writes_into(buffers[3]), compile=False)
    del buffers
    calls.capture(stream=None)
    gc.collect()
    assert all(ref() is not None for ref in held)
    del calls
    gc.collect()
    assert all(ref() is None for ref in held)


class CountedEvent:
    """torch.cuda.Event on a CPU: records the host's clock, counts how many are made."""

    made = 0

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        CountedEvent.made += 1
        self.at = None

    def record(self) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: "CountedEvent") -> float:
        return (end.at - self.at) * 1000.0


def test_phase_events_are_made_in_the_first_epoch_and_reused_after_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", CountedEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(CountedEvent, "made", 0)
    # the allocator's peaks, read in the warm-up epoch, are not what this counts (tests/test_memory.py)
    monkeypatch.setattr(timing, "device_peaks", lambda device: (0, 0))
    monkeypatch.setattr(timing, "reset_device_peaks", lambda device: None)
    timer = PhaseTimer(torch.device("cuda"), enabled=True, delays_ms={})
    boundaries = [PHASES[step % 3] for step in range(200)]
    for epoch in range(30):
        timer.start_epoch()
        for phase in boundaries:
            timer.enter(phase)
        seconds, phases = timer.end_epoch()
        assert sum(phases.values()) == pytest.approx(seconds, abs=0.01)
        assert set(phase for phase, share in phases.items() if share > 0) <= set(PHASES[:3])
    assert CountedEvent.made == len(boundaries) + 1  # one epoch's boundaries and its end, for every epoch


def test_a_cpu_phase_timer_makes_no_events(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", CountedEvent)
    monkeypatch.setattr(CountedEvent, "made", 0)
    timer = PhaseTimer(torch.device("cpu"), enabled=True, delays_ms={})
    timer.start_epoch()
    timer.enter("env")
    time.sleep(0.01)
    seconds, phases = timer.end_epoch()
    assert CountedEvent.made == 0 and phases["env"] >= 0.01 and seconds >= phases["env"]
