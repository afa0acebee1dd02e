"""What the trainer drivers share: the options of a PPO run, and the JSON line each ends with (the trainer's own
count of agent steps and the seconds its training took), which attach's count is checked against and its cost is
measured by (benches/attach_overhead.py)."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager


def ppo_parser(doc: str, *, n_envs: int = 8, n_steps: int = 128, batch_size: int | None = 256,
               device: bool = True) -> argparse.ArgumentParser:
    """The options every driver takes, at its library's defaults; `batch_size` None for a trainer that splits a
    rollout into a number of minibatches instead."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--n-envs", type=int, default=n_envs)
    parser.add_argument("--n-steps", type=int, default=n_steps, help="env steps per rollout, per env")
    if batch_size is not None:
        parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--n-epochs", type=int, default=4, help="passes over each rollout")
    parser.add_argument("--updates", type=int, default=6, help="rollouts, each followed by its update")
    parser.add_argument("--net", type=int, default=64, help="width of the policy's and value's two hidden layers")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    if device:
        parser.add_argument("--device", default="cpu")
    return parser


@contextmanager
def timed_training() -> Iterator[dict[str, float]]:
    """The training's wall and CPU seconds, filled in as the block ends."""
    seconds: dict[str, float] = {}
    start, cpu = time.perf_counter(), time.process_time()
    yield seconds
    seconds.update(learn_seconds=time.perf_counter() - start, learn_cpu_seconds=time.process_time() - cpu)


def report(count_name: str, count: int, seconds: dict[str, float], **extra: float) -> None:
    """The driver's last line: its own count under the library's name for it, and the training's seconds."""
    print(json.dumps({count_name: count, **seconds, **extra}))
