"""The whole rollout and the whole update captured as CUDA graphs (graph_scope): replays train like eager, draw fresh
actions at every replay, synchronise nothing with the host, zero the recurrent state at every episode start, and a
traced epoch's kernels are split between the two graphs; and, nothing patched, a graphed update trains like the
eager cuDNN path and learns the memory task as it does, and a traced replay counts one launch besides its fills. Every test needs CUDA and skips without it; the same calls
run uncaptured on a CPU in tests/test_whole_calls.py."""

import math

import pytest
import torch

from profilers import trace_events
from profilers.trace_summary import HOST_API_CATEGORIES, LAUNCH_CALLS, summarize_trace
from reference_trainer.config import TrainConfig, validate
from reference_trainer.policy import Policy
from reference_trainer.timing import PhaseTimer
from reference_trainer.train import Trainer, train

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BASE = dict(env="synthetic-device", device="cuda", num_envs=256, horizon=16, minibatch_size=1024, hidden_size=64,
            total_steps=256 * 16 * 8, warmup_epochs=2, seed=3, env_groups=2)
WHOLE = ("rollout", "update", "both")


def cuda_cfg(**overrides) -> TrainConfig:
    return validate(TrainConfig(**{**BASE, **overrides}))


def per_epoch_losses(summary: dict) -> list[dict]:
    return [e["losses"] for e in summary["epochs"]]


@pytest.fixture
def cell_stepped_in_eager_training(monkeypatch):
    """Eager training steps the cell over each sequence, as a captured update does, rather than cuDNN's pieces."""
    monkeypatch.setattr(Policy, "pieced_sequence", Policy.stepped_sequence)


@pytest.mark.parametrize("scope", WHOLE)
def test_whole_graphs_train_like_the_eager_step_path_on_every_epoch(cell_stepped_in_eager_training, scope):
    # Replays run the kernels the eager calls run, on the same data and random numbers: the tolerance of the step
    # graphs' own test (tests/test_gpu_knobs.py).
    eager = train(cuda_cfg())
    graphed = train(cuda_cfg(graph_scope=scope, cuda_graphs=True))
    assert list(graphed["phases"]) == list(cuda_cfg(graph_scope=scope).phases)
    for epoch, (got, expected) in enumerate(zip(per_epoch_losses(graphed), per_epoch_losses(eager))):
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), (scope, epoch)
    assert [e["episodes"] for e in graphed["epochs"]] == [e["episodes"] for e in eager["epochs"]]
    assert graphed["losses"]["entropy"] > 0.5 * math.log(TrainConfig().num_actions)


@pytest.mark.parametrize("scope, graphs", [("step", 2 + 2), ("rollout", 1 + 2), ("update", 2 + 1), ("both", 2)])
def test_each_scope_captures_its_graphs_and_replays_them_before_the_steady_clock(monkeypatch, scope, graphs):
    captured, replayed, steady = [], set(), []
    capture_end, replay = torch.cuda.CUDAGraph.capture_end, torch.cuda.CUDAGraph.replay

    def counted_capture_end(graph):
        capture_end(graph)
        captured.append(id(graph))

    def counted_replay(graph):
        replay(graph)
        if not steady:
            replayed.add(id(graph))

    def start_steady(trainer, start=Trainer.start_steady):
        steady.append(True)
        start(trainer)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_end", counted_capture_end)
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counted_replay)
    monkeypatch.setattr(Trainer, "start_steady", start_steady)
    train(cuda_cfg(graph_scope=scope, cuda_graphs=True, total_steps=256 * 16 * 4))
    assert len(captured) == graphs and set(captured) <= replayed


def test_consecutive_replays_of_a_whole_rollout_sample_different_actions(monkeypatch):
    # A graph that froze its random numbers at capture would replay the same actions every epoch (TorchRL's bug).
    actions = []
    end_epoch = Trainer.end_epoch

    def kept(trainer, epoch):
        actions.append(trainer.experience.actions.clone())
        return end_epoch(trainer, epoch)

    monkeypatch.setattr(Trainer, "end_epoch", kept)
    train(cuda_cfg(graph_scope="both", cuda_graphs=True))
    replays = actions[BASE["warmup_epochs"] - 1:]  # the epochs the captured rollout ran
    assert len(replays) >= 3
    assert all(not torch.equal(a, b) for a, b in zip(replays, replays[1:]))
    assert all(not torch.equal(step, following) for step, following in zip(replays[-1], replays[-1][1:]))
    assert (torch.bincount(replays[-1].flatten(), minlength=TrainConfig().num_actions) > 0).all()


def test_no_host_sync_inside_a_replayed_whole_rollout_or_update(monkeypatch):
    # Steady epochs only, every phase but the epoch's one read of its statistics (log) under "error".
    enter = PhaseTimer.enter
    steady = False

    def enter_with_sync_checks(timer, phase):
        torch.cuda.set_sync_debug_mode("default")
        enter(timer, phase)
        torch.cuda.set_sync_debug_mode("error" if steady and phase != "log" else "default")

    def on_epoch(record):
        nonlocal steady
        steady = record["epoch"] + 1 >= BASE["warmup_epochs"]

    monkeypatch.setattr(PhaseTimer, "enter", enter_with_sync_checks)
    try:
        summary = train(cuda_cfg(graph_scope="both", cuda_graphs=True), on_epoch=on_epoch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert steady and len(summary["epochs"]) > BASE["warmup_epochs"]


def test_no_reset_leaks_through_the_captured_rollout(monkeypatch):
    # The same epoch replayed twice from the same env positions, from two far-apart carried states: every value
    # from an env's first episode start on is the same bit for bit (values do not depend on the sampled actions),
    # and values before it differ, so the state did reach them.
    cfg = cuda_cfg(graph_scope="both", cuda_graphs=True)
    results = []
    end_epoch = Trainer.end_epoch

    def replayed_twice(trainer, epoch):
        record = end_epoch(trainer, epoch)
        if epoch == cfg.warmup_epochs and not results:
            x, envs = trainer.experience, trainer.envs
            saved = [env._positions.clone() for env in envs], x.obs[-1].clone(), x.starts[-1].clone()
            for sign in (1.0, -1.0):
                for env, positions in zip(envs, saved[0]):
                    env._positions.copy_(positions)
                x.obs[-1].copy_(saved[1])
                x.starts[-1].copy_(saved[2])
                state = torch.Generator(device=x.h.device).manual_seed(5)
                x.h.copy_(sign * 3 * torch.randn(x.h.shape, generator=state, device=x.h.device))
                x.c.copy_(sign * 3 * torch.randn(x.c.shape, generator=state, device=x.c.device))
                trainer.calls.rollout()
                torch.cuda.synchronize()
                results.append((x.values.clone(), x.starts[:-1].clone()))
        return record

    monkeypatch.setattr(Trainer, "end_epoch", replayed_twice)
    train(cfg)
    (first, starts), (second, starts_again) = results
    assert torch.equal(starts, starts_again)
    started = starts.cumsum(0) > 0  # steps from each env's first start in the epoch on
    assert started.any() and (~started).any()
    assert torch.equal(first[started], second[started])
    assert not torch.equal(first[~started], second[~started])


def test_a_traced_whole_graph_epoch_splits_its_kernels_by_the_graph_that_ran_them(tmp_path):
    cfg = cuda_cfg(graph_scope="both", cuda_graphs=True, trace_dir=str(tmp_path))
    summary = train(cfg)
    traced = summarize_trace(summary["trace"], summary)
    by_phase = traced["kernels_by_phase"]
    # one launch of each graph in the traced epoch, each holding every kernel it ran
    assert by_phase["rollout_graph"]["launches"] == by_phase["update_graph"]["launches"] == 1
    assert by_phase["rollout_graph"]["kernels"] > cfg.horizon and by_phase["update_graph"]["kernels"] > 0
    assert sum(phase["kernels"] for phase in by_phase.values()) == \
        round(traced["kernels_per_env_step"] * traced["env_steps"])
    assert by_phase["rollout_graph"]["kernel_us"] > 0 and by_phase["update_graph"]["kernel_us"] > 0


@pytest.mark.parametrize("scope", ["update", "both"])
def test_a_graphed_whole_update_trains_like_the_eager_cudnn_path_users_run(scope):
    # Nothing patched: eager runs cuDNN's pieces, the graphed run steps the cell from its warm-up on. fp32 pieces
    # run in full float32, so the two differ by summation order only; a different function (TF32, a lost reset,
    # a warm-up on another implementation) is off by more than this within 5 epochs.
    epochs = 5
    eager = train(cuda_cfg(total_steps=256 * 16 * epochs))
    graphed = train(cuda_cfg(total_steps=256 * 16 * epochs, graph_scope=scope, cuda_graphs=True))
    assert len(eager["epochs"]) == len(graphed["epochs"]) == epochs
    for epoch, (got, expected) in enumerate(zip(per_epoch_losses(graphed), per_epoch_losses(eager))):
        assert got == pytest.approx(expected, rel=2e-3, abs=2e-4), (scope, epoch)


MEMORY = dict(env="memory", device="cuda", num_envs=256, horizon=16, minibatch_size=1024, hidden_size=64,
              total_steps=256 * 16 * 150, warmup_epochs=2, target_return=0.99, target_window=100)


@pytest.mark.parametrize("seed", [1, 2])
def test_the_same_seed_learns_the_memory_task_eager_and_with_a_graphed_update(seed):
    # memory's blind guess scores 0.25: a smoothed return of 0.99 is the cue remembered, in both modes
    for graphed in (False, True):
        cfg = validate(TrainConfig(**MEMORY, seed=seed, cuda_graphs=graphed,
                                   **({"graph_scope": "update"} if graphed else {})))
        solved = train(cfg)["time_to_solve"]
        assert solved["solved"] and solved["smoothed_return"] >= 0.99, (seed, graphed, solved)


def test_a_traced_whole_graph_epochs_launches_are_counted_as_the_trace_shows_them(tmp_path):
    # Each replay is one cudaGraphLaunch, preceded by its generator's seed and offset fills (both graphs draw random
    # numbers): the summary's launches are the graph launches in the phase, its fills every other launch there.
    cfg = cuda_cfg(graph_scope="both", cuda_graphs=True, trace_dir=str(tmp_path))
    summary = train(cfg)
    traced = summarize_trace(summary["trace"], summary)
    trace = trace_events.load(summary["trace"])
    calls = [call for call in trace_events.complete_events(trace, HOST_API_CATEGORIES) if call["name"] in LAUNCH_CALLS]
    for phase in ("rollout_graph", "update_graph"):
        ranges = [(e["ts"], e["ts"] + e["dur"]) for e in trace_events.complete_events(trace, "user_annotation")
                  if e["name"] == phase]
        inside = [call for call in calls if any(start <= call["ts"] <= end for start, end in ranges)]
        graph_launches = [call for call in inside if "Graph" in call["name"]]
        counted = traced["kernels_by_phase"][phase]
        assert len(ranges) == traced["traced_epochs"] == len(graph_launches) == counted["launches"], phase
        assert counted["replay_prologue_fills"] == len(inside) - len(graph_launches) >= 2 * len(ranges), phase
        assert counted["replay_prologue_fills"] % 2 == 0, phase  # a seed and an offset for each generator
