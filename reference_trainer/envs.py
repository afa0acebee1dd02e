"""Vectorized environments: each steps all of its copies per call and auto-resets finished episodes.

Observations are float32 `[num_envs, obs_size]`, actions are integers in `[0, num_actions)`.
`step` returns `(obs, rewards, dones)`; finished episodes' returns and lengths accumulate until
`drain_episodes()` takes them.
"""

from __future__ import annotations

import time

import numpy as np

from reference_trainer.config import ConfigError, TrainConfig


class VecEnv:
    num_envs: int
    obs_size: int
    num_actions: int

    def __init__(self, num_envs: int):
        self.num_envs = num_envs
        self._running_return = np.zeros(num_envs, np.float64)
        self._running_length = np.zeros(num_envs, np.int64)
        self._finished_returns: list[np.ndarray] = []
        self._finished_lengths: list[np.ndarray] = []

    def reset(self) -> np.ndarray:
        raise NotImplementedError

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _record(self, rewards: np.ndarray, dones: np.ndarray) -> None:
        self._running_return += rewards
        self._running_length += 1
        if dones.any():
            self._finished_returns.append(self._running_return[dones])
            self._finished_lengths.append(self._running_length[dones])
            self._running_return[dones] = 0.0
            self._running_length[dones] = 0

    def drain_episodes(self) -> tuple[np.ndarray, np.ndarray]:
        returns = np.concatenate(self._finished_returns) if self._finished_returns else np.zeros(0)
        lengths = np.concatenate(self._finished_lengths) if self._finished_lengths else np.zeros(0, np.int64)
        self._finished_returns.clear()
        self._finished_lengths.clear()
        return returns, lengths


class MemoryEnv(VecEnv):
    """Recall a cue seen only at the first step: cue, `delay` blank steps, then a query step where the
    action must name the cue (reward 1, else 0). A memoryless policy can only guess: 1/num_cues."""

    def __init__(self, num_envs: int, seed: int, num_cues: int = 4, delay: int = 4):
        super().__init__(num_envs)
        self.num_actions = num_cues
        self.obs_size = num_cues + 1
        self.episode_length = delay + 2
        self._rng = np.random.default_rng(seed)
        self._t = np.zeros(num_envs, np.int64)
        self._cue = np.zeros(num_envs, np.int64)
        self._obs = np.zeros((num_envs, self.obs_size), np.float32)
        self._rows = np.arange(num_envs)

    def _observe(self) -> np.ndarray:
        self._obs.fill(0.0)
        first = self._t == 0
        self._obs[self._rows[first], self._cue[first]] = 1.0
        self._obs[:, -1] = self._t == self.episode_length - 1
        return self._obs

    def reset(self) -> np.ndarray:
        self._t[:] = 0
        self._cue[:] = self._rng.integers(self.num_actions, size=self.num_envs)
        return self._observe()

    def step(self, actions):
        dones = self._t == self.episode_length - 1
        rewards = (dones & (actions == self._cue)).astype(np.float32)
        self._record(rewards, dones)
        self._t += 1
        self._t[dones] = 0
        self._cue[dones] = self._rng.integers(self.num_actions, size=int(dones.sum()))
        return self._observe(), rewards, dones


class CartPoleEnv(VecEnv):
    """Classic cart-pole (Barto, Sutton and Anderson 1983 constants), episodes capped at 500 steps."""

    gravity, cart_mass, pole_mass, half_length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    max_steps = 500
    theta_limit = 12 * 2 * np.pi / 360
    x_limit = 2.4

    def __init__(self, num_envs: int, seed: int):
        super().__init__(num_envs)
        self.num_actions = 2
        self.obs_size = 4
        self._rng = np.random.default_rng(seed)
        self._state = np.zeros((num_envs, 4), np.float64)
        self._steps = np.zeros(num_envs, np.int64)

    def reset(self) -> np.ndarray:
        self._state[:] = self._rng.uniform(-0.05, 0.05, size=self._state.shape)
        self._steps[:] = 0
        return self._state.astype(np.float32)

    def step(self, actions):
        x, x_dot, theta, theta_dot = self._state.T
        force = np.where(actions == 1, self.force_mag, -self.force_mag)
        cos, sin = np.cos(theta), np.sin(theta)
        total_mass = self.cart_mass + self.pole_mass
        pole_moment = self.pole_mass * self.half_length
        temp = (force + pole_moment * theta_dot**2 * sin) / total_mass
        theta_acc = (self.gravity * sin - cos * temp) / (
            self.half_length * (4.0 / 3.0 - self.pole_mass * cos**2 / total_mass)
        )
        x_acc = temp - pole_moment * theta_acc * cos / total_mass
        self._state[:] = np.stack(
            [x + self.tau * x_dot, x_dot + self.tau * x_acc, theta + self.tau * theta_dot, theta_dot + self.tau * theta_acc],
            axis=1,
        )
        self._steps += 1
        failed = (np.abs(self._state[:, 0]) > self.x_limit) | (np.abs(self._state[:, 2]) > self.theta_limit)
        dones = failed | (self._steps >= self.max_steps)
        rewards = np.ones(self.num_envs, np.float32)
        self._record(rewards, dones)
        if dones.any():
            self._state[dones] = self._rng.uniform(-0.05, 0.05, size=(int(dones.sum()), 4))
            self._steps[dones] = 0
        return self._state.astype(np.float32), rewards, dones


class SyntheticEnv(VecEnv):
    """A near-free environment for timing the trainer alone. Observations cycle through a fixed bank
    indexed by (global env index + step), so any split of the envs across ranks sees the same data;
    reward 1 when the action matches the row's label; fixed-length episodes with staggered ends.
    `cost_us` spins the CPU for that many microseconds per env per step, to model a costlier env."""

    episode_length = 128
    bank_size = 4099

    def __init__(self, num_envs: int, seed: int, obs_size: int, num_actions: int, cost_us: float, env_offset: int = 0):
        super().__init__(num_envs)
        self.obs_size = obs_size
        self.num_actions = num_actions
        self.cost_seconds = cost_us * num_envs * 1e-6
        rng = np.random.default_rng(seed)
        self._bank = rng.standard_normal((self.bank_size, obs_size)).astype(np.float32)
        self._labels = rng.integers(num_actions, size=self.bank_size)
        self._index = (np.arange(num_envs) + env_offset) % self.bank_size
        self._steps = (np.arange(num_envs) + env_offset) % self.episode_length
        self._obs = np.empty((num_envs, obs_size), np.float32)

    def reset(self) -> np.ndarray:
        return np.take(self._bank, self._index, axis=0, out=self._obs)

    def step(self, actions):
        if self.cost_seconds:
            deadline = time.perf_counter() + self.cost_seconds
            while time.perf_counter() < deadline:
                pass
        rewards = (actions == self._labels[self._index]).astype(np.float32)
        self._steps += 1
        dones = self._steps >= self.episode_length
        self._steps[dones] = 0
        self._record(rewards, dones)
        self._index += 1
        self._index %= self.bank_size
        return np.take(self._bank, self._index, axis=0, out=self._obs), rewards, dones


class GymVecEnv(VecEnv):
    """Any Gymnasium environment with a discrete action space, through `gymnasium.make_vec`."""

    def __init__(self, env_id: str, num_envs: int, seed: int):
        super().__init__(num_envs)
        import gymnasium

        try:
            self._env = gymnasium.make_vec(
                env_id, num_envs=num_envs, vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": gymnasium.vector.AutoresetMode.SAME_STEP},
            )
        except gymnasium.error.Error as exc:
            raise ConfigError("env", f"gym:{env_id} cannot be made ({exc})") from None
        space = self._env.single_action_space
        if not isinstance(space, gymnasium.spaces.Discrete):
            raise ConfigError("env", f"gym:{env_id} has a {type(space).__name__} action space (allowed: Discrete)")
        self.num_actions = int(space.n)
        self.obs_size = int(np.prod(self._env.single_observation_space.shape))
        self._seed = seed

    def reset(self) -> np.ndarray:
        obs, _ = self._env.reset(seed=self._seed)
        return obs.reshape(self.num_envs, -1).astype(np.float32)

    def step(self, actions):
        obs, rewards, terminated, truncated, _ = self._env.step(actions)
        dones = terminated | truncated
        rewards = rewards.astype(np.float32)
        self._record(rewards, dones)
        return obs.reshape(self.num_envs, -1).astype(np.float32), rewards, dones


def make_env(cfg: TrainConfig, num_envs: int, env_offset: int = 0) -> VecEnv:
    """Builds this rank's share of the environments: `num_envs` copies starting at global index `env_offset`."""
    seed = cfg.seed + env_offset
    if cfg.env == "memory":
        return MemoryEnv(num_envs, seed)
    if cfg.env == "cartpole":
        return CartPoleEnv(num_envs, seed)
    if cfg.env == "synthetic":
        return SyntheticEnv(num_envs, cfg.seed, cfg.obs_size, cfg.num_actions, cfg.env_cost_us, env_offset)
    return GymVecEnv(cfg.env.removeprefix("gym:"), num_envs, seed)
