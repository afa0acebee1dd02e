"""A natively vectorized Gymnasium env split among worker processes, each owning a slice of the copies.

ale-py builds its emulators one after another while holding the interpreter lock; workers build their slices at
once. Each is a fresh interpreter (`python -m reference_trainer.env_workers FD`, no torch) that steps its slice,
seeded as in one env of all the copies, through shared memory (docs/trainer.md#pixels-and-vectorized-environments).
"""

from __future__ import annotations

import importlib
import socket
import subprocess
import sys
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from rlperf.errors import ConfigError, MachineFault

# seconds a worker may take to exit after being told to close, before it is terminated
CLOSE_SECONDS = 10.0


def buffer_layout(obs_shape: tuple[int, ...], obs_dtype) -> list[tuple[str, tuple[int, ...], Any]]:
    """The shared buffers, in the order the pool creates them: each one's name, shape per copy and dtype."""
    return [("actions", (), np.int64), ("obs", tuple(obs_shape), np.dtype(obs_dtype)), ("rewards", (), np.float64),
            ("terminated", (), np.bool_), ("truncated", (), np.bool_)]


def slices(num_envs: int, workers: int) -> list[tuple[int, int]]:
    """The copies each worker owns, `[lo, hi)`, as even as the count allows."""
    bounds = np.linspace(0, num_envs, workers + 1).round().astype(int)
    return [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]


class EnvWorkerPool:
    """`num_envs` copies of gym:`env_id` (the registered id `name`, after importing `module`), split among
    `len(vector_kwargs)` workers, worker `w` making its slice with `vector_kwargs[w]` (its threads)."""

    def __init__(self, env_id: str, module: str, name: str, num_envs: int, vector_kwargs: list[dict]):
        self.env_id, self.num_envs = env_id, num_envs
        self.slices = slices(num_envs, len(vector_kwargs))
        self._connections: list[Connection] = []
        self._processes: list[subprocess.Popen] = []
        self._memory: list[SharedMemory] = []
        self._buffers: dict[str, np.ndarray] = {}
        try:
            for (lo, hi), kwargs in zip(self.slices, vector_kwargs):
                ours, theirs = socket.socketpair()
                with theirs:
                    self._processes.append(subprocess.Popen(
                        [sys.executable, "-m", "reference_trainer.env_workers", str(theirs.fileno())],
                        pass_fds=(theirs.fileno(),)))
                self._connections.append(Connection(ours.detach()))
                self._connections[-1].send((module, name, hi - lo, kwargs))
            built = [self._answer(w) for w in range(len(self._processes))]
            self.single_observation_space, self.single_action_space, self.metadata = built[0]
            space = self.single_observation_space
            self._buffers = {key: self._shared((num_envs, *shape), dtype)
                             for key, shape, dtype in buffer_layout(space.shape, space.dtype)}
            names = [memory.name for memory in self._memory]
            for w, (lo, hi) in enumerate(self.slices):
                self._ask(w, ("attach", (names, num_envs, space.shape, space.dtype.str, lo, hi)))
        except BaseException:
            self.close()
            raise

    def _shared(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        memory = SharedMemory(create=True, size=max(1, int(np.prod(shape)) * dtype.itemsize))
        self._memory.append(memory)
        return np.ndarray(shape, dtype, buffer=memory.buf)

    def _tell(self, w: int, message: tuple) -> None:
        try:
            self._connections[w].send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError):
            raise self._died(w) from None

    def _answer(self, w: int) -> Any:
        try:
            kind, value = self._connections[w].recv()
        except (EOFError, ConnectionResetError):
            raise self._died(w) from None
        if kind == "config":
            raise ConfigError("env", f"gym:{self.env_id} cannot be made ({value})")
        if kind == "error":
            raise RuntimeError(f"env worker {w} of gym:{self.env_id}: {value}")
        return value

    def _ask(self, w: int, message: tuple) -> Any:
        self._tell(w, message)
        return self._answer(w)

    def _died(self, w: int) -> MachineFault:
        process = self._processes[w]
        try:
            process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
        return MachineFault(f"env worker {w} of gym:{self.env_id} (pid {process.pid}) died "
                            f"(exit code {process.returncode})")

    def _results(self) -> tuple:
        return (*(self._buffers[key] for key in ("obs", "rewards", "terminated", "truncated")), {})

    def reset(self, seed: int | None = None, options: dict | None = None):
        mask = (options or {}).get("reset_mask")
        for w, (lo, hi) in enumerate(self.slices):
            self._tell(w, ("reset", (None if seed is None else seed + lo, None if mask is None else mask[lo:hi])))
        for w in range(len(self.slices)):
            self._answer(w)
        return self._buffers["obs"], {}

    def send(self, actions: np.ndarray) -> None:
        self._buffers["actions"][:] = actions
        for w in range(len(self.slices)):
            self._tell(w, ("step", None))

    def recv(self) -> tuple:
        """What the workers stepped, in the pool's shared buffers: the next send overwrites them."""
        for w in range(len(self.slices)):
            self._answer(w)
        return self._results()

    def step(self, actions: np.ndarray) -> tuple:
        self.send(actions)
        return self.recv()

    def close(self) -> None:
        for connection in self._connections:
            try:
                connection.send(("close", None))
            except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
                pass
        for process in self._processes:
            try:
                process.wait(timeout=CLOSE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for connection in self._connections:
            connection.close()
        self._connections, self._processes = [], []
        self._buffers = {}
        for memory in self._memory:
            try:
                memory.close()
            except BufferError:  # a caller still holds a view of the last step: its mapping goes with the view
                pass
            memory.unlink()
        self._memory = []


def attach(name: str) -> SharedMemory:
    """The pool's block `name`, which only the pool may unlink: before Python 3.13 attaching registers it with
    this process's resource tracker, which would unlink it when the worker exits."""
    if sys.version_info >= (3, 13):
        return SharedMemory(name=name, track=False)
    block = SharedMemory(name=name)
    resource_tracker.unregister(block._name, "shared_memory")  # the name the constructor registered
    return block


def serve(connection: Connection) -> None:
    """A worker: makes the copies the pool's first message names, reports their spaces, then answers commands
    until told to close or until the pool's end of the socket is gone (the trainer exited)."""
    import gymnasium
    from gymnasium.envs.registration import VectorizeMode

    try:
        module, name, num_envs, vector_kwargs = connection.recv()
    except (EOFError, ConnectionResetError):
        return
    try:
        if module:
            importlib.import_module(module)
        env = gymnasium.make_vec(name, num_envs=num_envs, vectorization_mode=VectorizeMode.VECTOR_ENTRY_POINT,
                                 **vector_kwargs)
    except Exception as exc:  # the pool reports it as the env's, in one line
        connection.send(("config", f"{type(exc).__name__}: {exc}"))
        return
    connection.send(("built", (env.single_observation_space, env.single_action_space, dict(env.metadata))))
    memory: list[SharedMemory] = []
    views: dict[str, np.ndarray] = {}
    try:
        while True:
            try:
                command, argument = connection.recv()
            except (EOFError, ConnectionResetError):
                return
            if command == "close":
                return
            try:
                if command == "attach":
                    names, total, shape, dtype, lo, hi = argument
                    memory = [attach(block) for block in names]
                    for (key, block_shape, block_dtype), block in zip(buffer_layout(shape, dtype), memory):
                        views[key] = np.ndarray((total, *block_shape), block_dtype, buffer=block.buf)[lo:hi]
                elif command == "reset":
                    seed, mask = argument
                    observations, _ = env.reset(seed=seed, options=None if mask is None else {"reset_mask": mask})
                    views["obs"][:] = observations
                elif command == "step":
                    results = env.step(views["actions"].copy())
                    for key, value in zip(("obs", "rewards", "terminated", "truncated"), results):
                        views[key][:] = value
            except Exception as exc:  # the pool raises it in the trainer, naming this worker
                connection.send(("error", f"{type(exc).__name__}: {exc}"))
                continue
            connection.send(("ok", None))
    finally:
        env.close()
        views.clear()
        for block in memory:
            block.close()


if __name__ == "__main__":
    serve(Connection(int(sys.argv[1])))
