"""A native vector env (gym:rendezvous_env:Rendezvous-v0) that can only be built beside others: each copy of its
constructor, in whichever process builds it, waits until RLPERF_RENDEZVOUS_COUNT parties have arrived in the
folder RLPERF_RENDEZVOUS_DIR. Builders that start one after another never all arrive, and the first one fails.
Imported by env worker processes, which find it through PYTHONPATH."""

import os
import time
from pathlib import Path

import gymnasium
import numpy as np
from gymnasium.vector.utils import batch_space

# seconds a party waits for the others: only a failing schedule waits this long
PATIENCE = 120.0


def rendezvous(folder: Path, parties: int) -> None:
    (folder / f"{os.getpid()}-{time.monotonic_ns()}").touch()
    deadline = time.monotonic() + PATIENCE
    while (arrived := len(list(folder.iterdir()))) < parties:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{arrived} of {parties} parties arrived in {PATIENCE:.0f} s")
        time.sleep(0.02)


class RendezvousVectorEnv(gymnasium.vector.VectorEnv):
    def __init__(self, num_envs: int):
        rendezvous(Path(os.environ["RLPERF_RENDEZVOUS_DIR"]), int(os.environ["RLPERF_RENDEZVOUS_COUNT"]))
        self.num_envs = num_envs
        self.single_observation_space = gymnasium.spaces.Box(0.0, 1.0, (3,), np.float32)
        self.single_action_space = gymnasium.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)

    def reset(self, *, seed=None, options=None):
        return np.full((self.num_envs, 3), 0.5, np.float32), {}

    def step(self, actions):
        n = self.num_envs
        return np.full((n, 3), 0.5, np.float32), np.zeros(n), np.zeros(n, bool), np.zeros(n, bool), {}


if "Rendezvous-v0" not in gymnasium.registry:
    gymnasium.register(id="Rendezvous-v0", vector_entry_point=RendezvousVectorEnv)
