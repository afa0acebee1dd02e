"""Vectorized environments: each steps all of its copies per call and auto-resets finished episodes.

Observations are `[num_envs, *obs_shape]` of `obs_dtype`; `step` returns `(obs, rewards, dones, valid)`, `valid`
False where the step only reset an episode (gymnasium's next-step autoreset), which the trainer gives no weight.
"""

from __future__ import annotations

import importlib
import inspect
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, NamedTuple

import numpy as np
import torch

from reference_trainer.config import ConfigError, TrainConfig, synthetic_obs_shape
from reference_trainer.env_workers import EnvWorkerPool, slices
from rlperf.cpus import usable_cores


class VecEnv:
    num_envs: int
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype = np.dtype(np.float32)
    num_actions: int
    next_step_reset = False

    def __init__(self, num_envs: int):
        self.num_envs = num_envs
        self._running_return = np.zeros(num_envs, np.float64)
        self._running_length = np.zeros(num_envs, np.int64)
        self._finished_returns: list[np.ndarray] = []
        self._finished_lengths: list[np.ndarray] = []
        self._all_valid = np.ones(num_envs, bool)

    @property
    def obs_size(self) -> int:
        return int(np.prod(self.obs_shape))

    def reset(self) -> np.ndarray:
        raise NotImplementedError

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    # An env that steps outside the caller's thread (its own threads or processes) says so and splits `step`
    # in two: `send` starts the step on `actions` and returns, `recv` waits for it and returns what step would.
    steps_on_its_own = False
    # Whether a worker thread stepping it can run beside the policy. The envs here cannot: their small numpy steps
    # hold the interpreter lock, so a worker adds its hand-off and hides nothing (docs/trainer.md#gpu-knobs).
    steps_beside_the_policy = False

    def send(self, actions: np.ndarray) -> None:
        raise NotImplementedError

    def recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def close(self) -> None:
        """Releases what the environment holds beyond this process's memory (an async env's subprocesses)."""

    def _record(self, rewards: np.ndarray, dones: np.ndarray, valid: np.ndarray | None = None) -> None:
        if valid is None:
            self._running_return += rewards
            self._running_length += 1
        else:  # a reset-only step belongs to no episode
            self._running_return += rewards * valid
            self._running_length += valid
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

    def episode_totals(self, device: torch.device) -> torch.Tensor:
        """The summed return and the count of the episodes finished since the last call, `[2]` on `device`."""
        returns = self.drain_episodes()[0]
        return torch.tensor([returns.sum(), returns.size], dtype=torch.float64, device=device)


class MemoryEnv(VecEnv):
    """Recall a cue seen only at the first step: cue, `delay` blank steps, then a query step where the
    action must name the cue (reward 1, else 0). A memoryless policy can only guess: 1/num_cues."""

    def __init__(self, num_envs: int, seed: int, num_cues: int = 4, delay: int = 4):
        super().__init__(num_envs)
        self.num_actions = num_cues
        self.obs_shape = (num_cues + 1,)
        self.episode_length = delay + 2
        self._rng = np.random.default_rng(seed)
        self._t = np.zeros(num_envs, np.int64)
        self._cue = np.zeros(num_envs, np.int64)
        self._obs = np.zeros((num_envs, *self.obs_shape), np.float32)
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
        return self._observe(), rewards, dones, self._all_valid


class CartPoleEnv(VecEnv):
    """Classic cart-pole (Barto, Sutton and Anderson 1983 constants), episodes capped at 500 steps."""

    gravity, cart_mass, pole_mass, half_length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    max_steps = 500
    theta_limit = 12 * 2 * np.pi / 360
    x_limit = 2.4

    def __init__(self, num_envs: int, seed: int):
        super().__init__(num_envs)
        self.num_actions = 2
        self.obs_shape = (4,)
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
        return self._state.astype(np.float32), rewards, dones, self._all_valid


class SyntheticEnv(VecEnv):
    """A near-free environment for timing the trainer alone. Observations cycle through a fixed bank
    indexed by (global env index + step), so any split of the envs across ranks sees the same data;
    reward 1 when the action matches the row's label; fixed-length episodes with staggered ends.
    `cost_us` spins the CPU for that many microseconds per env per step, to model a costlier env.
    Observations have any shape, float32 (standard normal) or uint8 (uniform pixels), so a timing run can
    move Atari-sized frames without an emulator.

    The bank is drawn once, at construction, and laid out as a ring whose first rows repeat after its last,
    one per env: every step's observations are then one contiguous slice of it, handed out as a read-only
    view. A step draws nothing and copies no frame, so the trainer's own copy into its staging buffer is
    the only copy of the frames a timing run measures; the ring costs one row per env beside the bank."""

    episode_length = 128
    max_bank_rows = 4099
    # big observations get fewer rows: a bank of 4099 float 4x84x84 frames would take 460 MB
    max_bank_bytes = 32 << 20

    def __init__(self, num_envs: int, seed: int, obs_shape: tuple[int, ...], num_actions: int, cost_us: float,
                 env_offset: int = 0, obs_dtype: np.dtype = np.dtype(np.float32)):
        super().__init__(num_envs)
        self.obs_shape, self.obs_dtype = tuple(obs_shape), np.dtype(obs_dtype)
        self.num_actions = num_actions
        self.cost_seconds = cost_us * num_envs * 1e-6
        self.bank_size = min(self.max_bank_rows, max(64, self.max_bank_bytes // (self.obs_size * self.obs_dtype.itemsize)))
        rng = np.random.default_rng(seed)
        if self.obs_dtype == np.uint8:
            bank = rng.integers(0, 256, size=(self.bank_size, *self.obs_shape), dtype=np.uint8)
        else:
            bank = rng.standard_normal((self.bank_size, *self.obs_shape)).astype(self.obs_dtype)
        labels = rng.integers(num_actions, size=self.bank_size)
        # row j of the ring is row j mod bank_size of the bank: env i's observation at step t is row
        # (env_offset + i + t) mod bank_size, and all envs' rows of a step lie side by side from its start
        ring_rows = np.arange(self.bank_size + num_envs - 1) % self.bank_size
        self._ring = np.take(bank, ring_rows, axis=0)
        self._ring.setflags(write=False)
        self._label_ring = labels[ring_rows]
        self._start = env_offset % self.bank_size
        self._steps = (np.arange(num_envs) + env_offset) % self.episode_length

    def _observe(self) -> np.ndarray:
        return self._ring[self._start:self._start + self.num_envs]

    def reset(self) -> np.ndarray:
        return self._observe()

    def step(self, actions):
        if self.cost_seconds:
            deadline = time.perf_counter() + self.cost_seconds
            while time.perf_counter() < deadline:
                pass
        rewards = (actions == self._label_ring[self._start:self._start + self.num_envs]).astype(np.float32)
        self._steps += 1
        dones = self._steps >= self.episode_length
        self._steps[dones] = 0
        self._record(rewards, dones)
        self._start = (self._start + 1) % self.bank_size
        return self._observe(), rewards, dones, self._all_valid


class DeviceSyntheticEnv:
    """SyntheticEnv's observations, rewards and episodes, made once and stepped on the training device, for
    timing the trainer without a host env or its copies: a step reads the actions where the policy left them
    and writes its results straight into the experience, so nothing crosses to the host, and on a CPU it is
    the same few operators. The rings are the host env's own (the same bank, labels and staggered episode
    ends), so a run sees the same data as with env=synthetic. Finished episodes' returns are summed on the
    device and read with the epoch's statistics (`episode_totals`)."""

    next_step_reset = False

    def __init__(self, num_envs: int, seed: int, obs_shape: tuple[int, ...], num_actions: int, env_offset: int,
                 obs_dtype: np.dtype, device: torch.device, capturable: bool = False):
        rings = SyntheticEnv(num_envs, seed, obs_shape, num_actions, 0.0, env_offset, obs_dtype)
        self.num_envs, self.obs_shape, self.obs_dtype = num_envs, rings.obs_shape, rings.obs_dtype
        self.num_actions, self.bank_size = num_actions, rings.bank_size
        self._ring = torch.from_numpy(np.array(rings._ring)).to(device)
        self._label_ring = torch.from_numpy(rings._label_ring).to(device)
        length = SyntheticEnv.episode_length
        # env i's episode ends with its step k when (env_offset + i + k + 1) is a multiple of the episode length:
        # entry j of this ring says whether j + 1 is, and step k's envs read it from (env_offset + k) mod length
        self._done_ring = ((torch.arange(length + num_envs - 1, device=device) + 1) % length == 0).float()
        self._start, self._done_start = rings._start, env_offset % length
        # A captured step would replay the ring positions it was captured at, so a capturable env keeps them on the
        # device, [obs and labels, dones], and indexes its rings with them.
        self._positions = torch.tensor([self._start, self._done_start], device=device) if capturable else None
        self._periods = torch.tensor([self.bank_size, length], device=device)
        self._env_index = torch.arange(num_envs, device=device)
        self._rows = torch.empty(2, num_envs, dtype=torch.long, device=device)
        self._running = torch.zeros(num_envs, device=device)
        self._finished_return = torch.zeros(num_envs, dtype=torch.float64, device=device)
        self._finished_count = torch.zeros(num_envs, dtype=torch.float64, device=device)

    def reset(self) -> torch.Tensor:
        return self._ring[self._start:self._start + self.num_envs]

    def step_into(self, actions: torch.Tensor, obs: torch.Tensor, rewards: torch.Tensor, dones: torch.Tensor) -> None:
        """One step on `actions`, written into `obs`, `rewards` and `dones` (device tensors of the trainer's)."""
        if self._positions is not None:
            self._step_at_device_positions(actions, obs, rewards, dones)
            return
        n = self.num_envs
        rewards.copy_(actions == self._label_ring[self._start:self._start + n])
        dones.copy_(self._done_ring[self._done_start:self._done_start + n])
        self._running.add_(rewards)
        self._finished_return.addcmul_(self._running, dones)
        self._finished_count.add_(dones)
        self._running.addcmul_(self._running, dones, value=-1.0)  # a finished episode's return starts again at 0
        self._start = (self._start + 1) % self.bank_size
        self._done_start = (self._done_start + 1) % SyntheticEnv.episode_length
        obs.copy_(self._ring[self._start:self._start + n])

    def _step_at_device_positions(self, actions: torch.Tensor, obs: torch.Tensor, rewards: torch.Tensor,
                                  dones: torch.Tensor) -> None:
        """step_into's arithmetic, the rows of its rings read at the positions held on the device."""
        rows = torch.add(self._positions.unsqueeze(1), self._env_index, out=self._rows)
        rewards.copy_(actions == self._label_ring.index_select(0, rows[0]))
        dones.copy_(self._done_ring.index_select(0, rows[1]))
        self._running.add_(rewards)
        self._finished_return.addcmul_(self._running, dones)
        self._finished_count.add_(dones)
        self._running.addcmul_(self._running, dones, value=-1.0)
        self._positions.add_(1).remainder_(self._periods)
        torch.add(self._positions[0], self._env_index, out=rows[0])
        torch.index_select(self._ring, 0, rows[0], out=obs)

    def episode_totals(self, device: torch.device) -> torch.Tensor:
        totals = torch.stack([self._finished_return.sum(), self._finished_count.sum()])
        self._finished_return.zero_()
        self._finished_count.zero_()
        return totals

    def close(self) -> None:
        """Holds nothing beyond this process's memory."""


class CatchEnv(VecEnv):
    """Catch, in pixels and from memory. A ball falls one row a step from a random column of the top row of
    a 5x5 grid; the paddle in the bottom row moves left, stays or moves right (actions 0, 1, 2). Reward 1 when
    the paddle is under the ball as it lands, else 0. The grid is drawn as a [1, 40, 40] uint8 image, the
    ball only in the episode's first frame: a policy must read the pixels and remember what it saw. A
    memoryless policy can move towards the ball on the first step and act on where that left the paddle, which
    catches it in 3 episodes of 5 at best; any policy blind to the ball catches 1 in 5."""

    size = 5
    cell = 8  # pixels a side per grid cell: 40x40 images, above the CNN's 36x36 minimum

    def __init__(self, num_envs: int, seed: int):
        super().__init__(num_envs)
        self.num_actions = 3
        self.obs_shape = (1, self.size * self.cell, self.size * self.cell)
        self.obs_dtype = np.dtype(np.uint8)
        self._rng = np.random.default_rng(seed)
        self._rows = np.arange(num_envs)
        self._ball_row = np.zeros(num_envs, np.int64)
        self._ball_col = np.zeros(num_envs, np.int64)
        self._paddle = np.zeros(num_envs, np.int64)
        self._grid = np.zeros((num_envs, self.size, self.size), np.uint8)

    def _start(self, envs: np.ndarray) -> None:
        self._ball_row[envs] = 0
        self._ball_col[envs] = self._rng.integers(self.size, size=int(envs.sum()))
        self._paddle[envs] = self.size // 2

    def _observe(self) -> np.ndarray:
        self._grid.fill(0)
        first = self._ball_row == 0
        self._grid[self._rows[first], 0, self._ball_col[first]] = 255
        self._grid[self._rows, self.size - 1, self._paddle] = 128
        pixels = self._grid.repeat(self.cell, axis=1).repeat(self.cell, axis=2)
        return pixels[:, None]

    def reset(self) -> np.ndarray:
        self._start(np.ones(self.num_envs, bool))
        return self._observe()

    def step(self, actions):
        self._paddle = np.clip(self._paddle + actions - 1, 0, self.size - 1)
        self._ball_row += 1
        dones = self._ball_row == self.size - 1
        rewards = (dones & (self._paddle == self._ball_col)).astype(np.float32)
        self._record(rewards, dones)
        if dones.any():
            self._start(dones)
        return self._observe(), rewards, dones, self._all_valid


def gym_spec(env_id: str):
    """The registered spec of `env_id`, importing the module an id like `ale_py:ALE/Breakout-v5` names first
    (gymnasium.spec does not)."""
    import gymnasium

    module, sep, name = env_id.partition(":")
    if sep:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            hint = " (pip install 'rlperf[atari]')" if module == "ale_py" else ""
            raise ConfigError("env", f"gym:{env_id} needs the module {module!r}, which cannot be imported: "
                                     f"{exc}{hint}") from None
    else:
        name = env_id
    try:
        return gymnasium.spec(name)
    except gymnasium.error.Error as exc:
        raise ConfigError("env", f"gym:{env_id} is not a registered Gymnasium environment ({exc})") from None


def gym_vectorize_mode(env_id: str, spec, vectorization: str):
    """The `make_vec` mode for the `vectorization` setting; a mode this env cannot do is refused."""
    from gymnasium.envs.registration import VectorizeMode

    native = spec.vector_entry_point is not None
    if vectorization == "auto":
        vectorization = "native" if native else "sync"
    if vectorization == "native" and not native:
        raise ConfigError("vectorization", f"native needs the env's own vector entry point, and gym:{env_id} has none "
                                           "(allowed here: auto, sync, async)")
    if vectorization in ("sync", "async") and spec.entry_point is None:
        raise ConfigError("vectorization", f"{vectorization} steps single copies of the env, and gym:{env_id} has "
                                           "only a vector entry point (allowed here: auto, native)")
    return {"native": VectorizeMode.VECTOR_ENTRY_POINT, "sync": VectorizeMode.SYNC,
            "async": VectorizeMode.ASYNC}[vectorization]


def auto_env_threads(num_envs: int) -> int:
    """env_threads=0: the cores this process may use, or its share of them when ranks share the machine (the
    launcher says how many in LOCAL_WORLD_SIZE), and never more threads than envs to step."""
    ranks_here = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(1, min(num_envs, usable_cores() // ranks_here))


def native_thread_kwargs(env_id: str, spec, num_envs: int, threads: int) -> dict:
    """The keyword that sets a native vector env's stepping threads (`num_threads`, ale-py's), with `threads`
    or the automatic count; none for an env without one, which refuses a count set explicitly."""
    from gymnasium.envs.registration import load_env_creator

    entry_point = spec.vector_entry_point
    creator = entry_point if callable(entry_point) else load_env_creator(entry_point)
    try:
        takes_threads = "num_threads" in inspect.signature(creator).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        takes_threads = False
    if not takes_threads:
        if threads:
            raise ConfigError("env_threads", f"gym:{env_id}'s vector entry point takes no num_threads, so its "
                                             "threads cannot be set (allowed: 0)")
        return {}
    return {"num_threads": threads or auto_env_threads(num_envs)}


class GymVecEnv(VecEnv):
    """Any Gymnasium environment with a discrete action space, through `gymnasium.make_vec`: natively vectorized
    by the env's own `vector_entry_point`, or as copies stepped in turn (`sync`) or in a subprocess each (`async`).
    Its `send`/`recv` let env groups start a step and collect it later; it resets as its `autoreset_mode` says;
    with `workers`, the native env is split among worker processes (env_workers.py)."""

    def __init__(self, env_id: str, num_envs: int, seed: int, vectorization: str = "auto", threads: int = 0,
                 workers: int = 0):
        super().__init__(num_envs)
        import gymnasium
        from gymnasium.vector import AutoresetMode
        from gymnasium.envs.registration import VectorizeMode

        spec = gym_spec(env_id)
        mode = gym_vectorize_mode(env_id, spec, vectorization)
        native = mode == VectorizeMode.VECTOR_ENTRY_POINT
        if not native and (threads or workers):
            knob = "env_threads" if threads else "env_workers"
            raise ConfigError(knob, f"applies to a native vector env, and gym:{env_id} is stepped as single copies "
                                    "(it has no vector entry point; allowed: 0)")
        if native and workers:
            share_of_threads = max(1, (threads or auto_env_threads(num_envs)) // workers)
            per_worker = []
            for lo, hi in slices(num_envs, workers):
                kwargs = native_thread_kwargs(env_id, spec, hi - lo, threads)
                if "num_threads" in kwargs:  # an env that takes a thread count gets its share
                    kwargs["num_threads"] = share_of_threads
                per_worker.append(kwargs)
            self.threads = sum(kwargs.get("num_threads", 0) for kwargs in per_worker) or None
            module, sep, name = env_id.partition(":")
            self._env = EnvWorkerPool(env_id, module if sep else "", name if sep else env_id, num_envs, per_worker)
        else:
            if native:
                vector_kwargs = native_thread_kwargs(env_id, spec, num_envs, threads)
            else:
                # copy=False: each step's observations are copied into the trainer's staging buffer before the next
                vector_kwargs = {"vector_kwargs": {"autoreset_mode": AutoresetMode.SAME_STEP, "copy": False}}
                if mode == VectorizeMode.ASYNC:  # forked whatever start method an import set (torchrl sets spawn)
                    vector_kwargs["vector_kwargs"]["context"] = "fork"
            self.threads = vector_kwargs.get("num_threads")
            try:
                self._env = gymnasium.make_vec(spec, num_envs=num_envs, vectorization_mode=mode, **vector_kwargs)
            except gymnasium.error.Error as exc:
                raise ConfigError("env", f"gym:{env_id} cannot be made ({exc})") from None
        try:
            self.autoreset = AutoresetMode(self._env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
        except ValueError:
            raise ConfigError("env", f"gym:{env_id} declares an unknown autoreset_mode "
                                     f"{self._env.metadata['autoreset_mode']!r}") from None
        self.next_step_reset = self.autoreset == AutoresetMode.NEXT_STEP
        self._resets_itself = self.autoreset != AutoresetMode.DISABLED
        self._resetting = np.zeros(num_envs, bool)
        space = self._env.single_action_space
        if not isinstance(space, gymnasium.spaces.Discrete):
            raise ConfigError("env", f"gym:{env_id} has a {type(space).__name__} action space (allowed: Discrete)")
        self.num_actions = int(space.n)
        observations = self._env.single_observation_space
        self.obs_shape = tuple(observations.shape) or (1,)
        self.obs_dtype = np.dtype(np.uint8 if observations.dtype == np.uint8 else np.float32)
        self._seed = seed
        # ale-py's AtariVectorEnv queues actions to its threads with send and collects with recv;
        # gymnasium's AsyncVectorEnv does the same with its subprocesses through step_async and step_wait
        self._native_send = callable(getattr(self._env, "send", None)) and callable(getattr(self._env, "recv", None))
        self.steps_on_its_own = self._native_send or isinstance(self._env, gymnasium.vector.AsyncVectorEnv)
        self.steps_beside_the_policy = True

    def _observation(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(obs, dtype=self.obs_dtype).reshape(self.num_envs, *self.obs_shape)

    def reset(self) -> np.ndarray:
        obs, _ = self._env.reset(seed=self._seed)
        self._resetting[:] = False
        return self._observation(obs)

    def send(self, actions):
        if self._native_send:
            self._env.send(actions)
        else:
            self._env.step_async(actions)

    def recv(self):
        return self._arrivals(*(self._env.recv() if self._native_send else self._env.step_wait()))

    def step(self, actions):
        return self._arrivals(*self._env.step(actions))

    def _arrivals(self, obs, rewards, terminated, truncated, _info):
        dones = terminated | truncated
        if self.next_step_reset:
            valid, self._resetting = ~self._resetting, dones
        else:
            valid = self._all_valid
        if not self._resets_itself and dones.any():
            obs, _ = self._env.reset(options={"reset_mask": dones})
        rewards = np.asarray(rewards, dtype=np.float32)
        self._record(rewards, dones, valid if self.next_step_reset else None)
        return self._observation(obs), rewards, dones, valid

    def close(self) -> None:
        self._env.close()


def make_env(cfg: TrainConfig, num_envs: int, env_offset: int = 0,
             device: torch.device | None = None) -> VecEnv | DeviceSyntheticEnv:
    """Builds this rank's share of the environments: `num_envs` copies starting at global index `env_offset`;
    env=synthetic-device on `device`, the training device, which only the trainer steps."""
    seed = cfg.seed + env_offset
    if cfg.env == "synthetic-device":
        if device is None:
            raise ConfigError("env", "synthetic-device is stepped by the trainer on its device and has no host "
                                     "rate of its own (allowed here: the host envs, e.g. synthetic)")
        return DeviceSyntheticEnv(num_envs, cfg.seed, synthetic_obs_shape(cfg), cfg.num_actions, env_offset,
                                  np.dtype(cfg.obs_dtype), device, capturable=cfg.whole_rollout)
    if cfg.env == "memory":
        return MemoryEnv(num_envs, seed)
    if cfg.env == "cartpole":
        return CartPoleEnv(num_envs, seed)
    if cfg.env == "catch":
        return CatchEnv(num_envs, seed)
    if cfg.env == "synthetic":
        return SyntheticEnv(num_envs, cfg.seed, synthetic_obs_shape(cfg), cfg.num_actions, cfg.env_cost_us,
                            env_offset, np.dtype(cfg.obs_dtype))
    return GymVecEnv(cfg.env.removeprefix("gym:"), num_envs, seed, cfg.vectorization, cfg.env_threads,
                     cfg.env_workers)


class EnvGroups(NamedTuple):
    envs: list[VecEnv | DeviceSyntheticEnv]
    first_obs: list  # each group's observations after its reset
    start_seconds: float  # from the first group's building to the last group's reset
    build_seconds: float  # of those, from the first group's building to the last group's being built
    ended: float  # perf_counter() when the last group's reset ended


def make_env_groups(cfg: TrainConfig, num_envs: int, first_env: int, device: torch.device | None,
                    meanwhile: Callable[[], None]) -> EnvGroups:
    """This rank's `num_envs` envs from global index `first_env`, in `cfg.env_groups` groups of equal size, each
    built and reset; with no `device`, host envs only (make_env refuses a device env).

    Host envs are built and reset at once, a thread for each group, while `meanwhile` runs in the calling thread:
    a group split among worker processes waits on its workers' sockets, so every group's workers build their
    emulators together rather than a group's at a time, and the caller's own start-up work hides behind them
    (behind the resets only, where an env holds the interpreter lock while it builds, as ale-py's does). Async
    copies are the exception: gymnasium forks their subprocesses as it builds them, and a child forked while
    another thread imports (`meanwhile`, another group's build) would wait forever on any module lock that
    thread held, so their groups are built and reset in turn in the calling thread, and `meanwhile` runs after.
    A device env is built and reset in the calling thread, on the stream the trainer computes on."""
    start = time.perf_counter()
    size = num_envs // cfg.env_groups
    offsets = [first_env + g * size for g in range(cfg.env_groups)]
    if cfg.env == "synthetic-device":
        envs = [make_env(cfg, size, offset, device) for offset in offsets]
        built = time.perf_counter()
        first_obs = [env.reset() for env in envs]
        ended = time.perf_counter()
        meanwhile()
        return EnvGroups(envs, first_obs, ended - start, built - start, ended)

    def build_and_reset(offset: int) -> tuple[VecEnv, np.ndarray, float, float]:
        env = make_env(cfg, size, offset)
        built = time.perf_counter()
        try:
            return env, env.reset(), built, time.perf_counter()
        except BaseException:
            env.close()
            raise

    def build_in_turn() -> list[tuple[VecEnv, np.ndarray, float, float]]:
        groups = []
        try:
            for offset in offsets:
                groups.append(build_and_reset(offset))
            meanwhile()
        except BaseException:
            for env, *_ in groups:
                env.close()
            raise
        return groups

    def build_at_once() -> list[tuple[VecEnv, np.ndarray, float, float]]:
        def close_the_built() -> None:
            for group in building:
                if group.exception() is None:
                    group.result()[0].close()

        with ThreadPoolExecutor(cfg.env_groups, thread_name_prefix="env-build") as builders:
            building = [builders.submit(build_and_reset, offset) for offset in offsets]
            try:
                meanwhile()
            except BaseException:
                close_the_built()
                raise
        failures = [group.exception() for group in building if group.exception() is not None]
        if failures:
            close_the_built()
            raise failures[0]
        return [group.result() for group in building]

    envs, first_obs, built, finished = zip(*(build_in_turn() if cfg.vectorization == "async" else build_at_once()))
    return EnvGroups(list(envs), list(first_obs), max(finished) - start, max(built) - start, max(finished))
