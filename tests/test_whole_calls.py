"""The whole rollout and the whole update (graph_scope), run uncaptured on the CPU: the same training as the step
path, the rules that refuse what they cannot capture, and the device env's positions kept on the device. What
capture itself does is in tests/test_gpu_graphs.py."""

import numpy as np
import pytest
import torch

from reference_trainer.config import GRAPH_SCOPES, PHASES, ConfigError, TrainConfig, validate
from reference_trainer.envs import DeviceSyntheticEnv, SyntheticEnv
from reference_trainer.train import train

# 16 envs stepped 144 times: every env ends an episode of 128 steps, so dones and returns are exercised
POINT = dict(env="synthetic-device", num_envs=16, horizon=16, minibatch_size=64, update_epochs=2, hidden_size=16,
             total_steps=16 * 16 * 9, seed=4, threads=1, env_groups=2)


def epochs_of(summary: dict) -> list[tuple]:
    return [(e["losses"], e["episodes"], e["mean_episode_return"]) for e in summary["epochs"]]


def test_every_scope_trains_exactly_as_the_step_path_does():
    # The same arithmetic in another order of independent calls: the env steps after every group's policy step,
    # the minibatch order and the annealed learning rate drawn and read on the device. Bit for bit.
    step = train(validate(TrainConfig(**POINT)))
    assert sum(e["episodes"] for e in step["epochs"]) > 0
    for scope in GRAPH_SCOPES[1:]:
        whole = train(validate(TrainConfig(**POINT, graph_scope=scope)))
        assert epochs_of(whole) == epochs_of(step), scope


def test_a_whole_update_trains_a_host_env_as_the_step_path_does():
    point = dict(env="memory", num_envs=16, horizon=8, minibatch_size=32, hidden_size=16, total_steps=16 * 8 * 4,
                 threads=1)
    assert epochs_of(train(validate(TrainConfig(**point, graph_scope="update")))) == \
        epochs_of(train(validate(TrainConfig(**point))))


def test_a_whole_call_is_one_phase_and_the_phases_still_tile_the_epoch():
    summary = train(validate(TrainConfig(**{**POINT, "total_steps": 16 * 16 * 3}, graph_scope="both")))
    assert list(summary["phases"]) == ["rollout_graph", "update_graph", "log"]
    assert all(summary["phases"][name] > 0 for name in ("rollout_graph", "update_graph"))
    assert summary["phase_coverage"] == pytest.approx(1.0, abs=0.05)
    assert TrainConfig().phases == PHASES
    assert TrainConfig(graph_scope="update").phases == (*PHASES[:4], "update_graph", "log")


@pytest.mark.parametrize("overrides, field, message", [
    (dict(env="memory", graph_scope="rollout"), "graph_scope",
     "rollout steps the env inside one call, and only synthetic-device steps on the device (env is memory; "
     "allowed with it: step, update)"),
    (dict(env="synthetic", graph_scope="both"), "graph_scope", "both steps the env inside one call"),
    (dict(env="synthetic-device", graph_scope="update", inject_delay={"learn": 5.0}), "inject_delay",
     "cannot be used with graph_scope=update: a whole call has no phases inside to delay"),
    (dict(env="synthetic-device", graph_scope="both", world_size=2, num_envs=64), "graph_scope",
     "is not supported with world_size > 1"),
    (dict(graph_scope="epoch"), "graph_scope", "unknown scope 'epoch' (allowed: step, rollout, update, both)"),
])
def test_what_a_whole_call_cannot_hold_is_refused_naming_the_knob(overrides, field, message):
    with pytest.raises(ConfigError) as refused:
        validate(TrainConfig(**overrides))
    assert refused.value.field_name == field and message in str(refused.value)


def test_the_device_env_steps_the_same_with_its_positions_on_the_device(monkeypatch):
    # A bank of 70 rows: 200 steps wrap both rings, the observations' and the episodes' (128 steps).
    monkeypatch.setattr(SyntheticEnv, "max_bank_rows", 70)
    args = dict(num_envs=6, seed=3, obs_shape=(3, 5), num_actions=4, env_offset=5, obs_dtype=np.dtype(np.float32),
                device=torch.device("cpu"))
    host, device = DeviceSyntheticEnv(**args), DeviceSyntheticEnv(**args, capturable=True)
    assert host.bank_size == 70 and torch.equal(host.reset(), device.reset())
    rng = np.random.default_rng(0)
    for _ in range(200):
        actions = torch.from_numpy(rng.integers(4, size=6))
        results = []
        for env in (host, device):
            obs, arrivals = torch.zeros(6, 3, 5), torch.zeros(6, 2)
            env.step_into(actions, obs, arrivals[:, 0], arrivals[:, 1])
            results.append((obs, arrivals))
        assert all(torch.equal(a, b) for a, b in zip(*results))
    cpu = torch.device("cpu")
    totals = host.episode_totals(cpu)
    assert totals[1] > 0 and torch.equal(device.episode_totals(cpu), totals)
