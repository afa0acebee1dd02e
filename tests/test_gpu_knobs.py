"""The GPU knobs: correct first, then fast. Every test here needs CUDA and skips without it."""

import math

import pytest
import torch

from reference_trainer.config import TrainConfig, validate
from reference_trainer.timing import PhaseTimer
from reference_trainer.train import sample_actions, train

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BASE = dict(env="synthetic", device="cuda", num_envs=256, horizon=16, minibatch_size=1024, hidden_size=64,
            total_steps=256 * 16 * 6, warmup_epochs=2, seed=3)


def cuda_cfg(**overrides) -> TrainConfig:
    return validate(TrainConfig(**{**BASE, **overrides}))


def per_epoch_losses(summary):
    return [e["losses"] for e in summary["epochs"]]


def test_async_copies_deliver_exactly_what_blocking_copies_do():
    # The synthetic env's observations and rewards depend on the step and on the actions taken: an
    # observation read before its copy landed, or an action read before it reached the host, changes
    # the data and so every loss after it.
    # Tolerances allow for reduction order only; a stale read changes losses by far more.
    blocking = per_epoch_losses(train(cuda_cfg()))
    for knobs in (dict(pinned=True), dict(pinned=True, non_blocking=True),
                  dict(pinned=True, non_blocking=True, copy_stream=True),
                  dict(pinned=True, non_blocking=True, copy_stream=True, env_groups=2)):
        for got, expected in zip(per_epoch_losses(train(cuda_cfg(**knobs))), blocking):
            assert got == pytest.approx(expected, rel=1e-4, abs=1e-6), knobs


def test_graph_replays_draw_fresh_random_numbers():
    logits = torch.zeros(4096, 6, device="cuda")
    actions = torch.zeros(4096, dtype=torch.long, device="cuda")

    def step():
        actions.copy_(sample_actions(logits, torch.rand(4096, 6, device="cuda")))

    step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    draws = []
    for _ in range(3):
        graph.replay()
        draws.append(actions.clone())
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])
    counts = torch.bincount(draws[0], minlength=6).float()
    assert counts.min() > 4096 / 6 * 0.8  # uniform logits: every action drawn about equally


@pytest.mark.parametrize("env_groups", [1, 2])
def test_cuda_graphs_train_like_eager_and_keep_entropy(env_groups):
    eager = train(cuda_cfg(total_steps=256 * 16 * 10))
    graphed = train(cuda_cfg(total_steps=256 * 16 * 10, cuda_graphs=True, env_groups=env_groups))
    full_entropy = math.log(TrainConfig().num_actions)
    assert graphed["losses"]["entropy"] > 0.5 * full_entropy
    # same data and same arithmetic until the first captured epoch; close afterwards
    for got, expected in zip(per_epoch_losses(graphed)[:2], per_epoch_losses(eager)[:2]):
        assert got == pytest.approx(expected, rel=1e-4, abs=1e-6)
    for a, b in zip(per_epoch_losses(graphed)[2:], per_epoch_losses(eager)[2:]):
        assert a["entropy"] == pytest.approx(b["entropy"], rel=0.05, abs=0.02)
    assert graphed["compile_seconds"] > 0


@pytest.mark.parametrize("dtype, expected", [("bf16", "bfloat16"), ("fp16", "float16")])
def test_low_precision_really_computes_in_it(dtype, expected):
    summary = train(cuda_cfg(dtype=dtype))
    assert summary["dtype_used"] == expected
    assert all(math.isfinite(v) for v in summary["losses"].values())


def test_no_host_sync_inside_rollout_and_update(monkeypatch):
    enter = PhaseTimer.enter

    def enter_with_sync_checks(self, phase):
        # Syncs are allowed only in the once-per-epoch log phase (and at epoch boundaries).
        torch.cuda.set_sync_debug_mode("default")
        enter(self, phase)
        torch.cuda.set_sync_debug_mode("default" if phase == "log" else "error")

    monkeypatch.setattr(PhaseTimer, "enter", enter_with_sync_checks)
    try:
        for knobs in (dict(), dict(cuda_graphs=True), dict(copy_stream=True, env_groups=2, cuda_graphs=True)):
            train(cuda_cfg(pinned=True, non_blocking=True, **knobs))
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_compile_reports_its_time_apart():
    summary = train(cuda_cfg(compile=True))
    assert summary["compile_seconds"] >= 0 and summary["warmup_seconds"] > 0 and summary["sps"] > 0
