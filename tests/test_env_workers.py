"""A native vector env split among worker processes (reference_trainer/env_workers.py): the same transitions
and the same training as one env in the trainer's process, one line when a worker dies, nothing left behind."""

import os

import numpy as np
import pytest
import torch

from reference_trainer.config import ConfigError, TrainConfig, from_dict, validate
from reference_trainer.env_workers import slices
from reference_trainer.envs import GymVecEnv, make_env_groups
from reference_trainer.train import train
from rlperf.errors import MachineFault

BREAKOUT = "ale_py:ALE/Breakout-v5"


def shared_blocks() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def test_the_copies_are_split_as_evenly_as_their_count_allows():
    assert slices(5, 2) == [(0, 2), (2, 5)]
    assert slices(256, 16) == [(16 * w, 16 * (w + 1)) for w in range(16)]
    assert [hi - lo for lo, hi in slices(7, 7)] == [1] * 7


def test_breakout_split_among_workers_gives_the_transitions_of_one_env():
    pytest.importorskip("ale_py")
    before = shared_blocks()
    one, split = (GymVecEnv(BREAKOUT, 5, seed=4, threads=2, workers=workers) for workers in (0, 2))
    try:
        assert split.threads == 2 and split.steps_on_its_own and split.next_step_reset == one.next_step_reset
        np.testing.assert_array_equal(split.reset(), one.reset())
        for actions in np.random.default_rng(0).integers(one.num_actions, size=(60, 5)):
            for got, expected in zip(split.step(actions), one.step(actions)):
                np.testing.assert_array_equal(got, expected)
        for got, expected in zip(split.drain_episodes(), one.drain_episodes()):
            np.testing.assert_array_equal(got, expected)
    finally:
        one.close()
        split.close()
    assert shared_blocks() <= before


@pytest.mark.parametrize("env_groups", [1, 2])
def test_training_on_workers_is_training_in_one_process(env_groups):
    pytest.importorskip("ale_py")
    cfg = dict(env=f"gym:{BREAKOUT}", encoder="cnn", cnn_channels=4, num_envs=4, horizon=4, minibatch_size=8,
               hidden_size=16, total_steps=4 * 4 * 3, threads=1, env_threads=1, env_groups=env_groups)
    alone = train(validate(TrainConfig(**cfg)))
    workers = train(validate(TrainConfig(**cfg, env_workers=2)))
    assert workers["config"]["env_workers"] == 2
    assert [e["losses"] for e in workers["epochs"]] == [e["losses"] for e in alone["epochs"]]
    assert [e["episodes"] for e in workers["epochs"]] == [e["episodes"] for e in alone["epochs"]]


def test_a_killed_worker_fails_the_next_step_in_one_line_and_the_pool_still_closes():
    pytest.importorskip("ale_py")
    before = shared_blocks()
    env = GymVecEnv(BREAKOUT, 4, seed=0, threads=2, workers=2)
    processes = list(env._env._processes)
    try:
        env.reset()
        victim = processes[1]
        victim.kill()
        victim.wait()
        with pytest.raises(MachineFault, match=rf"^env worker 1 of gym:{BREAKOUT} \(pid {victim.pid}\) died "
                                               r"\(exit code -9\)$"):
            env.step(np.zeros(4, np.int64))
    finally:
        env.close()
    assert all(process.returncode is not None for process in processes) and shared_blocks() <= before


@pytest.mark.parametrize("values", [{"env": "memory", "env_workers": 2},
                                    {"env": "gym:CartPole-v1", "env_workers": 2, "vectorization": "sync"},
                                    {"env": "gym:CartPole-v1", "env_workers": -1},
                                    {"env": "gym:CartPole-v1", "num_envs": 8, "env_groups": 2, "env_workers": 5,
                                     "minibatch_size": 32}])
def test_workers_are_refused_where_they_cannot_apply(values):
    with pytest.raises(ConfigError) as err:
        from_dict(values)
    assert err.value.field_name == "env_workers"


def test_every_groups_workers_build_at_once_while_the_trainer_goes_on_with_its_own_start_up(tmp_path, monkeypatch):
    """Two groups of two workers and the caller's own start-up work must all be under way at once: the env's
    constructor waits for all five, so a group built after another, or start-up work done after the envs, fails."""
    from rendezvous_env import rendezvous

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [os.path.dirname(__file__),
                                                                   os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("RLPERF_RENDEZVOUS_DIR", str(tmp_path))
    monkeypatch.setenv("RLPERF_RENDEZVOUS_COUNT", "5")
    cfg = validate(TrainConfig(env="gym:rendezvous_env:Rendezvous-v0", num_envs=8, env_groups=2, env_workers=2,
                               minibatch_size=8, horizon=4))
    groups = make_env_groups(cfg, 8, 0, torch.device("cpu"), meanwhile=lambda: rendezvous(tmp_path, 5))
    try:
        assert [env._env.slices for env in groups.envs] == [[(0, 2), (2, 4)]] * 2
        np.testing.assert_array_equal(np.concatenate(groups.first_obs), np.full((8, 3), 0.5, np.float32))
        assert groups.start_seconds > 0
    finally:
        for env in groups.envs:
            env.close()
