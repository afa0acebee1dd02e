"""How the rollout steps one group of environments: in its own thread, as the policy computes.

A group's env step starts once its actions are on the host and is collected when its next observations are needed,
so a step costs the larger of env and policy rather than their sum; both sides are timed, to say which waits
(docs/trainer.md#gpu-knobs, `--env-groups`).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import numpy as np
import torch

from reference_trainer.envs import VecEnv

Arrivals = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class Ready(Protocol):
    """When a group's actions are on the host: a CUDA event recorded after their copy."""

    def synchronize(self) -> None: ...


class InlineStepper:
    """Steps the env in the trainer's thread when its results are collected: the schedule of one group,
    where nothing could run beside the step, and the sequential schedule the overlapped one must equal."""

    def __init__(self, env: VecEnv):
        self.env = env
        self.spans: list[tuple[float, float]] = []
        self.wait = 0.0
        self._actions: np.ndarray | None = None
        self._ready: Ready | None = None

    def start(self, actions: np.ndarray, ready: Ready | None = None) -> None:
        self._actions, self._ready = actions, ready

    def finish(self) -> Arrivals:
        if self._ready is not None:
            self._ready.synchronize()  # the device's time, not the env's
        began = time.perf_counter()
        arrivals = self.env.step(self._actions)
        ended = time.perf_counter()
        self.spans.append((began, ended))
        self.wait += ended - began
        return arrivals

    def take_times(self) -> tuple[list[tuple[float, float]], float]:
        """The env's step spans and the trainer's waited seconds since the last call."""
        times = self.spans, self.wait
        self.spans, self.wait = [], 0.0
        return times

    def close(self) -> None:
        """Holds no thread."""


class OverlappedStepper(InlineStepper):
    """Starts the env's step at once and collects it later. One worker thread per group completes the step:
    it waits for the actions when they are not yet on the host, then waits for an env that steps on its own
    (which it timestamps when ready), or steps any other env itself. `actions` must stay unchanged until
    `finish` returns. The worker thread computes nothing on `device`; it is made that thread's current device
    so that waiting on a CUDA event opens no context on another GPU."""

    def __init__(self, env: VecEnv, device: torch.device | None = None):
        super().__init__(env)
        on_cuda = device is not None and device.type == "cuda"
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="env-group",
                                          initializer=torch.cuda.set_device if on_cuda else None,
                                          initargs=(device,) if on_cuda else ())
        self._pending: Future | None = None
        self._actions_here = threading.Event()
        self._actions_here.set()

    def start(self, actions: np.ndarray, ready: Ready | None = None) -> None:
        began = time.perf_counter()
        if ready is not None:
            self._actions_here.clear()
            self._pending = self._worker.submit(self._when_ready, actions, ready)
        elif self.env.steps_on_its_own:
            self.env.send(actions)
            self._pending = self._worker.submit(self._receive, began)
        else:
            self._pending = self._worker.submit(self._step, actions)
        self.wait += time.perf_counter() - began

    def _when_ready(self, actions: np.ndarray, ready: Ready) -> Arrivals:
        try:
            ready.synchronize()
        finally:  # from here the trainer waits for the env, or for the error finish raises
            self._actions_here.set()
        if not self.env.steps_on_its_own:
            return self._step(actions)
        sent = time.perf_counter()
        self.env.send(actions)
        return self._receive(sent)

    def _receive(self, sent: float) -> Arrivals:
        arrivals = self.env.recv()
        self.spans.append((sent, time.perf_counter()))
        return arrivals

    def _step(self, actions: np.ndarray) -> Arrivals:
        began = time.perf_counter()
        arrivals = self.env.step(actions)
        self.spans.append((began, time.perf_counter()))
        return arrivals

    def finish(self) -> Arrivals:
        self._actions_here.wait()  # the device's time, not the env's
        began = time.perf_counter()
        # the worker added its span before the future completed, so reading spans after result() is safe
        arrivals = self._pending.result()
        self._pending = None
        self.wait += time.perf_counter() - began
        return arrivals

    def close(self) -> None:
        if self._pending is not None:  # a run that failed mid-step: let the env finish before it is closed
            self._pending.exception()
        self._worker.shutdown()


def busy_seconds(spans: list[tuple[float, float]]) -> float:
    """The time covered by at least one of `spans`."""
    covered, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered


def env_stepper(env: VecEnv, overlapped: bool, device: torch.device | None = None) -> InlineStepper:
    """The stepper of one group: overlapped when there are other groups for its step to run beside and the
    env can run beside them; `device` is the trainer's, whose events the worker thread may wait on."""
    if overlapped and (env.steps_on_its_own or env.steps_beside_the_policy):
        return OverlappedStepper(env, device)
    return InlineStepper(env)
