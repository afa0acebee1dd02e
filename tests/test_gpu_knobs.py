"""The GPU knobs: correct first, then fast. Every test here needs CUDA and skips without it.

What the sync check cannot see: torch's sync debug mode flags the stream synchronisations torch's own
operations make (.item(), .cpu(), a blocking copy, nonzero, ...). It does not flag cudaEventSynchronize
(the designed wait on actions_ready), cudaDeviceSynchronize (torch.cuda.synchronize at
epoch boundaries), a cudaFree from the caching allocator, or anything in torch.distributed, so DDP's
reducer is outside it; DDP also needs rank processes and two GPUs, which an in-process check cannot have.
"""

import json
import math
import subprocess
import sys
import warnings
from collections import Counter

import numpy as np
import pytest
import torch

from rlperf.machine import cuda_uuid, nvml_gpus, probe
from benches.runner import config_mismatch
from profilers import trace_events
from reference_trainer import envs as envs_module
from reference_trainer import train as trainer
from reference_trainer.config import TrainConfig, validate
from reference_trainer.policy import EpisodePieces, Policy
from decisions import attribution
from reference_trainer.attribution import selfcheck_config
from reference_trainer.timing import PhaseTimer
from reference_trainer.train import Trainer, train

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BASE = dict(env="synthetic", device="cuda", num_envs=256, horizon=16, minibatch_size=1024, hidden_size=64,
            total_steps=256 * 16 * 6, warmup_epochs=2, seed=3)
# Half a millisecond or more of GPU time (at 4 GHz or less) before every rollout copy: far longer than a
# host environment step of 256 synthetic envs, so a consumer that does not wait for its copy reads the
# previous step's data.
COPY_DELAY_CYCLES = 2_000_000
SMALL_RUN = ["--env", "synthetic", "--num-envs", "64", "--horizon", "8", "--minibatch-size", "256",
             "--total-steps", str(64 * 8 * 3), "--quiet"]


def cuda_cfg(**overrides) -> TrainConfig:
    return validate(TrainConfig(**{**BASE, **overrides}))


def per_epoch_losses(summary):
    return [e["losses"] for e in summary["epochs"]]


def test_a_single_gpu_run_from_the_command_line_keeps_the_requested_device(tmp_path):
    out = tmp_path / "summary.json"
    done = subprocess.run([sys.executable, "-m", "rlperf", "train", *SMALL_RUN, "--device", "cuda", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    assert summary["config"]["device"] == "cuda" and summary["device_uuid"] == cuda_uuid(0)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_ranks_use_the_requested_gpus_and_report_the_requested_device(tmp_path):
    first = torch.cuda.device_count() - 2  # cuda:N with two ranks: GPUs N and N + 1
    out = tmp_path / "summary.json"
    requested = {"device": f"cuda:{first}", "world_size": 2}
    done = subprocess.run([sys.executable, "-m", "rlperf", "train", *SMALL_RUN, "--device", requested["device"],
                           "--world-size", "2", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    assert config_mismatch(requested, summary["config"]) is None  # the bench harness's check
    assert summary["device_uuid"] == cuda_uuid(first) and [r["rank"] for r in summary["ranks"]] == [0, 1]


def test_async_copies_deliver_exactly_what_blocking_copies_do():
    # A copy read before it landed changes the data and every later loss. The delay hook holds every copy back far
    # longer than the host takes to step, so a missing wait (the host on actions_ready, the compute stream on
    # obs_ready) shows; tolerances allow for reduction order only.
    blocking = per_epoch_losses(train(cuda_cfg()))
    steady_steps = (len(blocking) - BASE["warmup_epochs"]) * BASE["horizon"]
    for knobs in (dict(pinned=True), dict(pinned=True, non_blocking=True),
                  dict(pinned=True, non_blocking=True, copy_stream=True),
                  dict(pinned=True, non_blocking=True, copy_stream=True, env_groups=2)):
        delayed = train(cuda_cfg(**knobs), copy_delay_cycles=COPY_DELAY_CYCLES)
        # the hook really ran: each action copy waited behind its delay on the compute stream
        assert delayed["phases"]["eval_copy"] >= steady_steps * COPY_DELAY_CYCLES / 4e9, knobs
        for epoch, (got, expected) in enumerate(zip(per_epoch_losses(delayed), blocking)):
            assert got == pytest.approx(expected, rel=1e-4, abs=1e-6), (knobs, epoch)


def step_the_cell_in_eager_training(monkeypatch) -> None:
    """Eager training steps the cell over each sequence, as graphs and compiled code do, instead of running
    cuDNN's kernel over the pieces."""
    monkeypatch.setattr(Policy, "pieced_sequence", Policy.stepped_sequence)


@pytest.mark.parametrize("env_groups", [1, 2])
def test_cuda_graphs_train_like_eager_on_every_epoch(monkeypatch, env_groups):
    # Replays run the kernels eager runs, on the same data and the same random numbers (the generator
    # advances by a whole graph's draws per replay), so the losses agree after capture too. A graph steps the
    # cell over the training sequences, so the eager run does too here; the next test compares the two.
    step_the_cell_in_eager_training(monkeypatch)
    eager = train(cuda_cfg(total_steps=256 * 16 * 10, env_groups=env_groups))
    graphed = train(cuda_cfg(total_steps=256 * 16 * 10, env_groups=env_groups, cuda_graphs=True))
    for epoch, (got, expected) in enumerate(zip(per_epoch_losses(graphed), per_epoch_losses(eager))):
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), epoch
    assert graphed["losses"]["entropy"] > 0.5 * math.log(TrainConfig().num_actions)
    assert graphed["compile_seconds"] > 0 and eager["compile_seconds"] == 0


def test_eager_training_through_cudnns_pieces_trains_like_stepping_the_cell(monkeypatch):
    # The same function in other kernels: rounding differs in the last bits, and on the H200 a run through the
    # pieces matched one stepping the cell to 1e-5 for four epochs, then one clipped sample of 8192 differed.
    pieces = train(cuda_cfg(total_steps=256 * 16 * 4))
    step_the_cell_in_eager_training(monkeypatch)
    cell = train(cuda_cfg(total_steps=256 * 16 * 4))
    for epoch, (got, expected) in enumerate(zip(per_epoch_losses(pieces), per_epoch_losses(cell))):
        assert got.keys() == expected.keys()
        for name in got:
            assert got[name] == pytest.approx(expected[name], rel=1e-4, abs=1e-3 if name == "clipfrac" else 1e-6), \
                (epoch, name)


class RecordingEnv:
    """An environment that keeps a copy of every action array it is stepped with."""

    def __init__(self, env, actions: list):
        self._env, self._actions = env, actions

    def __getattr__(self, name):
        return getattr(self._env, name)

    def step(self, actions):
        self._actions.append(actions.copy())
        return self._env.step(actions)


def actions_taken(monkeypatch, **knobs) -> np.ndarray:
    actions: list = []
    make_env = envs_module.make_env
    monkeypatch.setattr(envs_module, "make_env",
                        lambda *args, **kwargs: RecordingEnv(make_env(*args, **kwargs), actions))
    train(cuda_cfg(**knobs))
    monkeypatch.setattr(envs_module, "make_env", make_env)
    return np.stack(actions)  # one row per rollout step (one group)


def test_the_trainers_step_graph_draws_fresh_noise_at_every_replay(monkeypatch):
    eager = actions_taken(monkeypatch)
    graphed = actions_taken(monkeypatch, cuda_graphs=True)
    replayed = graphed[(BASE["warmup_epochs"] - 1) * BASE["horizon"]:]  # the steps the captured graph took
    assert all(not np.array_equal(a, b) for a, b in zip(replayed, replayed[1:]))
    assert (np.bincount(replayed.ravel(), minlength=TrainConfig().num_actions) > 0).all()
    # noise frozen at capture would sample other actions than eager's fresh draws from the same logits
    assert (graphed == eager).mean() > 0.99


def test_every_graph_is_replayed_before_the_steady_clock_starts(monkeypatch):
    # Capture empties the allocator's cache and a graph's first launch uploads it: both belong to the
    # warm-up epoch replaying the graphs, never to a steady one.
    log = []

    def logged(method, event: str):
        def call(graph):
            method(graph)
            log.append((event, id(graph)))
        return call

    def start_steady(trainer_self, start_steady=Trainer.start_steady):
        log.append(("steady", None))
        start_steady(trainer_self)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_end", logged(torch.cuda.CUDAGraph.capture_end, "captured"))
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", logged(torch.cuda.CUDAGraph.replay, "replayed"))
    monkeypatch.setattr(Trainer, "start_steady", start_steady)
    train(cuda_cfg(cuda_graphs=True), on_epoch=lambda record: log.append(("epoch", record["epoch"])))
    before_steady = log[:log.index(("steady", None))]
    captured = [graph for event, graph in before_steady if event == "captured"]
    assert len(captured) == 1 + 2  # the rollout step (one group) and the update's two halves
    first_capture = min(log.index(("captured", graph)) for graph in captured)
    # captured after the eager warm-up epochs, before the last warm-up epoch
    assert before_steady[first_capture - 1] == ("epoch", BASE["warmup_epochs"] - 2)
    assert set(captured) <= {graph for event, graph in before_steady if event == "replayed"}


def test_capture_is_not_traced_and_traced_replays_keep_their_kernels(tmp_path):
    # Graphs captured before the profiler first sets up CUPTI lose or mistime their kernels in a later trace
    # (pytorch#75504): every graph launch inside the traced epoch must have its kernels, inside that epoch.
    cfg = cuda_cfg(cuda_graphs=True, trace_dir=str(tmp_path))
    summary = train(cfg)
    trace = trace_events.load(summary["trace"])
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert not [name for name in names if "Capture" in name or "GraphInstantiate" in name]
    [step] = trace_events.profiler_steps(trace)  # trace_epochs = 1
    start, end = step["ts"], step["ts"] + step["dur"]
    launches = [event for event in trace_events.complete_events(trace, ("cuda_runtime", "cuda_driver"))
                if "GraphLaunch" in event["name"] and start <= event["ts"] <= end]
    minibatches = cfg.update_epochs * cfg.envs_per_rank // cfg.minibatch_sequences_per_rank
    assert len(launches) == cfg.horizon + 1 + 2 * minibatches  # every step, the bootstrap value, the updates
    kernels = Counter(event["args"]["correlation"] for event in trace_events.complete_events(trace, "kernel")
                      if start <= event["ts"] and event["ts"] + event["dur"] <= end)
    without_kernels = [launch["ts"] for launch in launches if not kernels[launch["args"]["correlation"]]]
    assert not without_kernels, f"{len(without_kernels)} of {len(launches)} graph launches show no kernel"


@pytest.mark.parametrize("dtype, expected", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_low_precision_really_computes_in_it(monkeypatch, dtype, expected):
    # What the recurrent cell returns, in the rollout (no grad) and in training, on every call of the run;
    # and for fp16, that the loss scaler really scaled: its state moves on every step it takes.
    # Training runs the sequence kernel, or the cell where a graph or compilation holds the cell loop.
    produced, scalers = [], []

    class WatchedPolicy(trainer.Policy):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.cell.register_forward_hook(
                lambda cell, inputs, output: produced.append((torch.is_grad_enabled(), output[0].dtype)))

        def pieced_sequence(self, *args):
            hidden = super().pieced_sequence(*args)
            produced.append((torch.is_grad_enabled(), hidden.dtype))
            return hidden

    class WatchedScaler(torch.amp.GradScaler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            scalers.append(self)

    monkeypatch.setattr(trainer, "Policy", WatchedPolicy)
    monkeypatch.setattr(torch.amp, "GradScaler", WatchedScaler)
    summary = train(cuda_cfg(dtype=dtype))
    assert summary["dtype_used"] == str(expected).removeprefix("torch.")
    rollout = Counter(out for training, out in produced if not training)
    training = Counter(out for training, out in produced if training)
    assert set(rollout) == {expected} and set(training) == {expected}, (rollout, training)
    cfg = cuda_cfg(dtype=dtype)
    minibatches = len(summary["epochs"]) * cfg.update_epochs * cfg.envs_per_rank // cfg.minibatch_sequences_per_rank
    assert rollout[expected] > BASE["horizon"] and training[expected] >= minibatches
    assert all(math.isfinite(v) for v in summary["losses"].values())
    [scaler] = scalers
    assert scaler.is_enabled() == (dtype == "fp16")
    if dtype == "fp16":
        state = scaler.state_dict()
        assert state["scale"] != 2.0**16 or state["_growth_tracker"] > 0, state


@pytest.mark.parametrize("knobs", [dict(), dict(cuda_graphs=True), dict(copy_stream=True, env_groups=2, cuda_graphs=True),
                                   dict(dtype="fp16"), dict(dtype="bf16", copy_stream=True, env_groups=2),
                                   dict(compile=True)],
                         ids=["eager", "graphs", "graphs-groups", "fp16", "bf16-groups", "compile"])
def test_no_host_sync_inside_rollout_and_update(monkeypatch, knobs):
    # Steady epochs only: the warm-up epochs compile and run first calls, which may synchronise. The one
    # designed read is the sequence kernel's batch sizes, once per eager minibatch (none in graphs or
    # compiled code, which step the cell instead): it is let through and counted, and nothing else is.
    enter = PhaseTimer.enter
    host_batch_sizes = EpisodePieces.host_batch_sizes
    steady = False
    reads = 0

    def counted_read(self):
        nonlocal reads
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("default")
        try:
            return host_batch_sizes(self)
        finally:
            reads += steady
            torch.cuda.set_sync_debug_mode(mode)

    def enter_with_sync_checks(self, phase):
        # Syncs are allowed only in the once-per-epoch log phase (and at epoch boundaries).
        torch.cuda.set_sync_debug_mode("default")
        enter(self, phase)
        torch.cuda.set_sync_debug_mode("error" if steady and phase != "log" else "default")

    def on_epoch(record):
        nonlocal steady
        steady = record["epoch"] + 1 >= BASE["warmup_epochs"]

    monkeypatch.setattr(PhaseTimer, "enter", enter_with_sync_checks)
    monkeypatch.setattr(EpisodePieces, "host_batch_sizes", counted_read)
    cfg = cuda_cfg(pinned=True, non_blocking=True, **knobs)
    try:
        summary = train(cfg, on_epoch=on_epoch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    steady_epochs = len(summary["epochs"]) - cfg.warmup_epochs
    assert steady and steady_epochs > 0
    minibatches = steady_epochs * cfg.update_epochs * cfg.envs_per_rank // cfg.minibatch_sequences_per_rank
    assert reads == (0 if cfg.cuda_graphs or cfg.compile else minibatches), reads


@pytest.mark.parametrize("knobs, syncs_per_step", [(dict(), 1), (dict(env_groups=2), 2),
                                                    (dict(env="synthetic-device"), 0),
                                                    (dict(env="synthetic-device", cuda_graphs=True), 0)],
                         ids=["eager", "eager-groups", "device-env", "device-env-graphs"])
def test_the_eager_rollout_blocks_once_a_step_for_the_actions_and_the_device_env_never(monkeypatch, knobs,
                                                                                        syncs_per_step):
    # The default path's pageable copies: the host waits for each group's actions (a blocking copy in
    # eval_copy) and in the rollout for nothing else, the copies in included; the device env needs no wait
    # at all. Eager training reads the pieces' batch sizes once a minibatch, graphs read nothing.
    enter = PhaseTimer.enter
    seen: list[warnings.WarningMessage] = []
    by_phase: Counter[str] = Counter()
    current = {"phase": None, "seen": 0, "steady": False}

    def enter_counting_syncs(self, phase):
        if current["steady"] and current["phase"] is not None:
            by_phase[current["phase"]] += len(seen) - current["seen"]
        enter(self, phase)
        current.update(phase=phase, seen=len(seen))

    def on_epoch(record):
        current.update(steady=record["epoch"] + 1 >= BASE["warmup_epochs"], phase=None)

    monkeypatch.setattr(PhaseTimer, "enter", enter_counting_syncs)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            summary = train(cuda_cfg(**knobs), on_epoch=on_epoch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    steady_epochs = len(summary["epochs"]) - BASE["warmup_epochs"]
    assert steady_epochs >= 1
    by_phase.pop("log", None)  # the epoch's one read of its statistics
    expected = {"eval_copy": syncs_per_step * BASE["horizon"] * steady_epochs} if syncs_per_step else {}
    cfg = cuda_cfg(**knobs)
    if not cfg.cuda_graphs:  # and the pieces' batch sizes, read once per eager minibatch
        expected["train_forward"] = (steady_epochs * cfg.update_epochs * cfg.envs_per_rank
                                     // cfg.minibatch_sequences_per_rank)
    assert {phase: n for phase, n in by_phase.items() if n} == expected


def test_compile_reports_its_time_apart():
    summary = train(cuda_cfg(compile=True))
    assert summary["compile_seconds"] > 0 and summary["warmup_seconds"] > summary["compile_seconds"]
    assert summary["sps"] > 0


def test_each_phase_receives_a_delay_injected_into_it():
    # On CUDA a phase boundary is an event on the compute stream; a host delay must still land in its phase.
    phases = tuple(selfcheck_config({}, 8, "cuda").phases)
    rows = attribution.check(phases, 40.0, lambda name, delays: train(selfcheck_config(delays, 8, "cuda"))["epochs"],
                             max_runs=4)
    assert all(row.verdict == "ok" for row in rows.values()), {row.row: (row.low, row.high) for row in rows.values()}


def test_the_probe_names_each_gpu_as_nvml_does():
    # The sampler finds a point's GPUs by these UUIDs: a format that NVML does not use samples nothing.
    nvml = nvml_gpus()
    if isinstance(nvml, str):
        pytest.skip(f"NVML unavailable: {nvml}")
    probed = probe().gpus
    assert len(probed) == torch.cuda.device_count()
    assert {gpu["uuid"] for gpu in probed} <= {gpu["uuid"] for gpu in nvml}


def test_the_probe_measures_every_kind_of_peak_a_gpu_run_needs():
    """What a GPU smoke's roofline needs, in the probe's own child process: both dtypes' roofs, memory, the
    tiny op, the four copies, and every kernel of the smoke's LSTM-128 at 1024 and 4096 envs (the heads of one
    and four outputs among them) and a convolution's, graphed in float32 and bfloat16: 42 kernels timed at once,
    more than torch's pool has streams (32). An H200 smoke's probe ended in a CUDA error among such needs."""
    from benches import peak_probe as probe
    from rlperf import peaks

    name = torch.cuda.get_device_name(0)
    dtypes = ["float32", "bfloat16"]
    kernels = [("linear", [envs, 32, 128]) for envs in (1024, 4096, 16384)] \
        + [("linear", [envs, 128, outputs]) for envs in (1024, 4096, 16384) for outputs in (1, 4)] \
        + [("linear", [envs, 128, 512]) for envs in (256, 1024, 4096)] \
        + [("mm_tn", [outputs, 16384, 128]) for outputs in (1, 4)] + [("mm_tn", [128, 16384, 32]),
                                                                       ("mm_tn", [512, 256, 128])] \
        + [("mm", [16384, outputs, 128]) for outputs in (1, 4)] + [("mm", [256, 512, 128])] \
        + [("conv", [256, 4, 84, 84, 32, 8, 4]), ("conv_backward", [256, 4, 84, 84, 32, 8, 4, 1])]
    needs = peaks.roof_needs("cuda", name, 0, dtypes)
    for dtype in dtypes:
        needs += [peaks.need("cuda", name, 0, op, dtype, shape) for op, shape in kernels]
    assert sum(need["op"] in peaks.KERNELS for need in needs) == 42
    rows = probe.measure_in_subprocess(needs)
    assert [(row["op"], row["dtype"]) for row in rows] == [(need["op"], need["dtype"]) for need in needs]
    assert all(row["value"] > 0 for row in rows)
    assert all(row["method"]["graphed"] for row in rows if row["op"] in peaks.KERNELS)


def test_flops_measures_on_the_gpu():
    done = subprocess.run([sys.executable, "-m", "benches.flops", "--device", "cuda", "--num-envs", "64", "--horizon",
                           "8", "--minibatch-size", "256", "--hidden-size", "32", "--epochs", "3"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert torch.cuda.get_device_name(0) in done.stdout and "whole epoch" in done.stdout
