"""Gymnasium environments through GymVecEnv: native vector entry points, sync and async copies, the three
autoreset modes, and the trainer's masking of the reset-only steps of next-step envs."""

import json
import os
import subprocess
import sys
import threading
import time

import gymnasium
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import reference_trainer.envs as envs_module
from reference_trainer.config import ConfigError, TrainConfig, from_dict, validate
from reference_trainer.envs import GymVecEnv, make_env_groups
from rlperf.cpus import usable_cores
from reference_trainer.train import train


def countdown_start(rng: np.random.Generator) -> tuple[int, int]:
    """A new episode: its length (3 to 6 steps) and its cue (0 or 1)."""
    return 3 + int(rng.integers(4)), int(rng.integers(2))


class CountdownEnv(gymnasium.Env):
    """One copy: observation [steps left, cue]; reward 1 for each action equal to the cue."""

    observation_space = gymnasium.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, autoreset_mode: str = "", poisoned: bool = False):
        # the autoreset mode and the poison belong to the vector env registered beside this one
        self._left = self._cue = 0

    def _obs(self):
        return np.array([self._left, self._cue], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._left, self._cue = countdown_start(self.np_random)
        return self._obs(), {}

    def step(self, action):
        reward = float(action == self._cue)
        self._left -= 1
        return self._obs(), reward, self._left == 0, False, {}


class CountdownVectorEnv(gymnasium.vector.VectorEnv):
    """The same dynamics natively vectorized, resetting as `autoreset_mode` says. `poisoned` makes the
    next-step mode's by-products loud: the last observation of an episode is shifted by 50 and the
    reset-only step pays 100, so training on either would show in the losses."""

    def __init__(self, num_envs: int, autoreset_mode: str = "NextStep", poisoned: bool = False):
        self.num_envs = num_envs
        self.single_observation_space = CountdownEnv.observation_space
        self.single_action_space = CountdownEnv.action_space
        self.observation_space = gymnasium.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gymnasium.vector.utils.batch_space(self.single_action_space, num_envs)
        self.mode = AutoresetMode(autoreset_mode)
        self.metadata = {"autoreset_mode": self.mode}
        self.poisoned = poisoned
        self._rngs = [np.random.default_rng(i) for i in range(num_envs)]
        self._left = np.zeros(num_envs, np.int64)
        self._cue = np.zeros(num_envs, np.int64)
        self._pending = np.zeros(num_envs, bool)

    def _start(self, i: int) -> None:
        self._left[i], self._cue[i] = countdown_start(self._rngs[i])

    def _obs(self):
        return np.stack([self._left, self._cue], axis=1).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        mask = (options or {}).get("reset_mask", np.ones(self.num_envs, bool))
        for i in np.flatnonzero(mask):
            if seed is not None:
                self._rngs[i] = np.random.default_rng(seed + i)
            self._start(i)
        self._pending[mask] = False
        return self._obs(), {}

    def step(self, actions):
        rewards = (actions == self._cue).astype(np.float64)
        self._left -= 1
        if self.mode == AutoresetMode.NEXT_STEP:  # the step after an end only resets
            for i in np.flatnonzero(self._pending):
                self._start(i)
            rewards[self._pending] = 100.0 if self.poisoned else 0.0
        terminated = self._left == 0
        obs = self._obs()
        if self.mode == AutoresetMode.NEXT_STEP:
            self._pending = terminated.copy()
            if self.poisoned:
                obs[terminated] += 50.0
        elif self.mode == AutoresetMode.SAME_STEP:
            for i in np.flatnonzero(terminated):
                self._start(i)
            obs = self._obs()
        return obs, rewards, terminated, np.zeros(self.num_envs, bool), {}


class ThreadedCountdownVectorEnv(CountdownVectorEnv):
    """The native countdown with a thread count to take, as ale-py's vector env takes one."""

    def __init__(self, num_envs: int, num_threads: int = 0):
        super().__init__(num_envs)
        self.num_threads = num_threads


@pytest.fixture(scope="module", autouse=True)
def countdown_ids():
    ids = {}
    for mode in AutoresetMode:
        for poisoned in (False, True):
            env_id = f"rlperf-test/Countdown{mode.value}{'Poisoned' if poisoned else ''}-v0"
            gymnasium.register(env_id, entry_point=CountdownEnv, vector_entry_point=CountdownVectorEnv,
                               kwargs={"autoreset_mode": mode.value, "poisoned": poisoned})
            ids[mode, poisoned] = env_id
    gymnasium.register("rlperf-test/CountdownVectorOnly-v0", vector_entry_point=CountdownVectorEnv)
    gymnasium.register("rlperf-test/CountdownSingleOnly-v0", entry_point=CountdownEnv)
    gymnasium.register("rlperf-test/CountdownThreaded-v0", entry_point=CountdownEnv,
                       vector_entry_point=ThreadedCountdownVectorEnv)
    yield ids
    for env_id in [*ids.values(), "rlperf-test/CountdownVectorOnly-v0", "rlperf-test/CountdownSingleOnly-v0",
                   "rlperf-test/CountdownThreaded-v0"]:
        gymnasium.registry.pop(env_id)


def countdown(mode: AutoresetMode, poisoned: bool = False) -> str:
    return f"rlperf-test/Countdown{mode.value}{'Poisoned' if poisoned else ''}-v0"


def transitions(env: GymVecEnv, steps: int, seed: int = 7) -> list[list[tuple]]:
    """Each env's stream of valid transitions (the observation acted on, action, reward, done), driving
    every env with its own fixed action sequence, of which a reset-only step takes nothing."""
    actions = np.random.default_rng(seed).integers(2, size=(steps, env.num_envs))
    used = np.zeros(env.num_envs, np.int64)
    streams: list[list[tuple]] = [[] for _ in range(env.num_envs)]
    obs = env.reset().copy()
    for _ in range(steps):
        action = actions[used, np.arange(env.num_envs)]
        next_obs, rewards, dones, valid = env.step(action)
        for i in np.flatnonzero(valid):
            streams[i].append((tuple(obs[i]), int(action[i]), float(rewards[i]), bool(dones[i])))
        used += valid
        obs = next_obs.copy()  # sync copies hand out one buffer they refill
    return streams


def test_native_envs_give_the_transitions_sync_copies_give_in_every_autoreset_mode():
    reference = GymVecEnv(countdown(AutoresetMode.SAME_STEP), 5, seed=3, vectorization="sync")
    assert not reference.next_step_reset
    expected = transitions(reference, 40)
    expected_lengths = np.sort(reference.drain_episodes()[1])
    for mode in AutoresetMode:
        native = GymVecEnv(countdown(mode), 5, seed=3, vectorization="native")
        assert native.next_step_reset == (mode == AutoresetMode.NEXT_STEP)
        got = transitions(native, 60 if native.next_step_reset else 40)
        # the extra steps of next-step resets do not count, so compare the shorter prefix of each env
        for env_got, env_expected in zip(got, expected):
            shared = min(len(env_got), len(env_expected))
            assert shared >= 30 and env_got[:shared] == env_expected[:shared], mode
        lengths = native.drain_episodes()[1]
        assert set(lengths) <= set(range(3, 7)), mode
        if not native.next_step_reset:
            np.testing.assert_array_equal(np.sort(lengths), expected_lengths)


def test_next_step_resets_are_marked_invalid_and_start_the_new_episode():
    env = GymVecEnv(countdown(AutoresetMode.NEXT_STEP), 4, seed=0)  # auto: the vector entry point
    assert env.next_step_reset and env.autoreset == AutoresetMode.NEXT_STEP
    env.reset()
    previous_done = np.zeros(4, bool)
    seen_invalid = 0
    for _ in range(30):
        obs, rewards, dones, valid = env.step(np.zeros(4, np.int64))
        np.testing.assert_array_equal(valid, ~previous_done)
        assert (rewards[~valid] == 0).all() and not dones[~valid].any()
        assert (obs[~valid, 0] >= 3).all()  # the new episode's first observation: all its steps left
        seen_invalid += int((~valid).sum())
        previous_done = dones
    assert seen_invalid >= 10
    returns, lengths = env.drain_episodes()
    assert set(lengths) <= set(range(3, 7))  # the reset-only steps belong to no episode


def test_vectorization_picks_the_native_entry_point_and_refuses_what_the_env_cannot_do():
    assert isinstance(GymVecEnv("rlperf-test/CountdownVectorOnly-v0", 2, seed=0)._env, CountdownVectorEnv)
    with pytest.raises(ConfigError, match="vectorization: sync steps single copies of the env, and "
                                          "gym:rlperf-test/CountdownVectorOnly-v0 has only a vector entry point"):
        GymVecEnv("rlperf-test/CountdownVectorOnly-v0", 2, seed=0, vectorization="sync")
    with pytest.raises(ConfigError, match="vectorization: native needs the env's own vector entry point, and "
                                          "gym:rlperf-test/CountdownSingleOnly-v0 has none"):
        GymVecEnv("rlperf-test/CountdownSingleOnly-v0", 2, seed=0, vectorization="native")
    assert isinstance(GymVecEnv("rlperf-test/CountdownSingleOnly-v0", 2, seed=0)._env, gymnasium.vector.SyncVectorEnv)
    with pytest.raises(ConfigError, match="env: gym:no_such_module:Thing-v0 needs the module 'no_such_module'"):
        GymVecEnv("no_such_module:Thing-v0", 2, seed=0)
    with pytest.raises(ConfigError, match="env: gym:NoSuchThing-v0 is not a registered Gymnasium environment"):
        GymVecEnv("NoSuchThing-v0", 2, seed=0)
    with pytest.raises(ConfigError) as err:
        validate(TrainConfig(env="memory", vectorization="native"))
    assert err.value.field_name == "vectorization"
    with pytest.raises(ConfigError) as err:
        validate(TrainConfig(env="gym:CartPole-v1", vectorization="threads"))
    assert err.value.field_name == "vectorization"


def test_async_copies_give_the_transitions_sync_copies_give():
    sync = GymVecEnv(countdown(AutoresetMode.SAME_STEP), 2, seed=5, vectorization="sync")
    subprocesses = GymVecEnv(countdown(AutoresetMode.SAME_STEP), 2, seed=5, vectorization="async")
    try:
        assert transitions(subprocesses, 20) == transitions(sync, 20)
    finally:
        subprocesses.close()


def test_async_copies_fork_only_while_no_other_thread_of_the_trainer_runs(monkeypatch):
    """gymnasium forks async copies' subprocesses as it builds them, and the trainer builds its groups beside its
    own start-up work (`meanwhile`, which imports). A fork beside another thread can leave the child waiting
    forever on a lock that thread held; each of the four forks here must find no thread started since the groups'
    building began, and `meanwhile` not running."""
    forks = []
    importing = threading.Event()
    real_fork = os.fork

    def fork():
        started = [thread.name for thread in threading.enumerate() if thread.ident not in threads_before]
        forks.append((started, importing.is_set()))
        return real_fork()

    def meanwhile():
        importing.set()
        time.sleep(0.2)
        importing.clear()

    monkeypatch.setattr(os, "fork", fork)
    cfg = validate(TrainConfig(env=f"gym:{countdown(AutoresetMode.SAME_STEP)}", vectorization="async", num_envs=4,
                               env_groups=2, horizon=4, minibatch_size=4))
    threads_before = {thread.ident for thread in threading.enumerate()}
    groups = make_env_groups(cfg, 4, 0, None, meanwhile)
    try:
        assert forks == [([], False)] * 4
        assert [obs.shape for obs in groups.first_obs] == [(2, 2), (2, 2)]
    finally:
        for env in groups.envs:
            env.close()


SMALL = dict(num_envs=8, horizon=8, minibatch_size=32, hidden_size=16, total_steps=8 * 8 * 6, threads=1,
             update_epochs=2, device="cpu")


def per_epoch_losses(summary: dict) -> list[dict]:
    return [epoch["losses"] for epoch in summary["epochs"]]


def test_reset_only_steps_get_no_weight_in_training(monkeypatch):
    """A next-step env's last observation of an episode and its reset-only step are by-products: the
    poisoned env makes both loud (observation + 50, reward 100), and training must not see them. It would
    through the losses or the advantage statistics if those steps had weight, and through the recurrent
    state if the state were reset on the last observation instead of on the new episode's first."""
    clean = train(validate(TrainConfig(env=f"gym:{countdown(AutoresetMode.NEXT_STEP)}", **SMALL)))
    poisoned = train(validate(TrainConfig(env=f"gym:{countdown(AutoresetMode.NEXT_STEP, True)}", **SMALL)))
    assert clean["episodes"] > 20 and clean["episodes"] == poisoned["episodes"]
    assert clean["mean_episode_return"] == poisoned["mean_episode_return"]
    for got, expected in zip(per_epoch_losses(poisoned), per_epoch_losses(clean)):
        assert got == pytest.approx(expected, rel=1e-6, abs=1e-7)
    # obs (2 floats), rewards, dones and valid, 4 bytes each
    assert clean["h2d_bytes_per_step"] == 20

    # the check can fail: a trainer that took the env for a same-step one trains on the poison
    make_env = envs_module.make_env

    def unmasked(*args, **kwargs):
        env = make_env(*args, **kwargs)
        env.next_step_reset = False
        return env

    monkeypatch.setattr(envs_module, "make_env", unmasked)
    blind = train(validate(TrainConfig(env=f"gym:{countdown(AutoresetMode.NEXT_STEP, True)}", **SMALL)))
    assert blind["h2d_bytes_per_step"] == 16
    assert [epoch["value"] for epoch in per_epoch_losses(blind)[1:]] != pytest.approx(
        [epoch["value"] for epoch in per_epoch_losses(clean)[1:]], rel=0.01)


def test_a_native_next_step_env_learns_its_cue():
    summary = train(validate(TrainConfig(env=f"gym:{countdown(AutoresetMode.NEXT_STEP)}",
                                         **{**SMALL, "total_steps": 8 * 8 * 60, "learning_rate": 1e-2})))
    # an episode of 3 to 6 steps pays 1 for each action equal to its cue, which the observation shows:
    # chance is half the length (2.25 on average)
    assert summary["mean_episode_return"] > 4.0


def test_atari_breakout_trains_from_the_command_line(tmp_path):
    pytest.importorskip("ale_py")
    out = tmp_path / "run.json"
    proc = subprocess.run(
        [sys.executable, "-m", "rlperf", "train", "--env", "gym:ale_py:ALE/Breakout-v5", "--encoder", "cnn",
         "--num-envs", "2", "--horizon", "8", "--minibatch-size", "16", "--hidden-size", "32",
         "--total-steps", "48", "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    # four stacked 84x84 uint8 frames, then rewards, dones and valid flags (ale-py resets on the next step)
    assert summary["h2d_bytes_per_step"] == 4 * 84 * 84 + 3 * 4
    assert "host->device" in proc.stdout


def test_env_threads_reach_a_native_env_that_takes_them_and_are_refused_where_none_can(monkeypatch):
    assert GymVecEnv("rlperf-test/CountdownThreaded-v0", 4, seed=0, threads=3)._env.num_threads == 3
    automatic = GymVecEnv("rlperf-test/CountdownThreaded-v0", 64, seed=0)
    assert automatic.threads == automatic._env.num_threads == min(64, usable_cores())
    assert GymVecEnv("rlperf-test/CountdownThreaded-v0", 1, seed=0).threads == 1  # never more threads than envs
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(2 * usable_cores()))  # ranks sharing the cores: at least one each
    assert GymVecEnv("rlperf-test/CountdownThreaded-v0", 64, seed=0).threads == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    # an env without the knob is built as before when the count is automatic, and refuses a count set
    assert GymVecEnv("rlperf-test/CountdownVectorOnly-v0", 2, seed=0).threads is None
    with pytest.raises(ConfigError, match="env_threads: gym:rlperf-test/CountdownVectorOnly-v0's vector entry "
                                          "point takes no num_threads"):
        GymVecEnv("rlperf-test/CountdownVectorOnly-v0", 2, seed=0, threads=2)
    with pytest.raises(ConfigError, match="env_threads: .* gym:rlperf-test/CountdownSingleOnly-v0 is stepped as "
                                          "single copies"):
        GymVecEnv("rlperf-test/CountdownSingleOnly-v0", 2, seed=0, threads=2)
    for values in ({"env": "memory", "env_threads": 2}, {"env": "gym:CartPole-v1", "env_threads": -1},
                   {"env": "gym:CartPole-v1", "env_threads": 2, "vectorization": "sync"}):
        with pytest.raises(ConfigError) as err:
            from_dict(values)
        assert err.value.field_name == "env_threads"


def test_breakout_gives_the_same_transitions_with_one_thread_or_two():
    pytest.importorskip("ale_py")
    envs = [GymVecEnv("ale_py:ALE/Breakout-v5", 3, seed=4, threads=threads) for threads in (1, 2)]
    try:
        assert [env.threads for env in envs] == [1, 2]
        np.testing.assert_array_equal(envs[0].reset(), envs[1].reset())
        for actions in np.random.default_rng(0).integers(envs[0].num_actions, size=(40, 3)):
            for got, expected in zip(envs[1].step(actions), envs[0].step(actions)):
                np.testing.assert_array_equal(got, expected)
    finally:
        for env in envs:
            env.close()
