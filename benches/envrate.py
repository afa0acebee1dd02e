"""The env's own rate: a configured vector env stepped in a loop with random actions, no policy and no copies.

    python -m benches.envrate --env gym:ale_py:ALE/Breakout-v5 --num-envs 32 [--env-threads 2] [--env-groups 2]

The env is the trainer's own, built and stepped as the trainer does, so a point's SPS can be held against it
(docs/trainer.md#environments). Nothing is stored.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from reference_trainer.config import FIELD_TYPES, ConfigError, TrainConfig, field_help, validate
from reference_trainer.envs import make_env_groups
from reference_trainer.stepping import env_stepper
from rlperf.errors import MachineFault
from rlperf.lock import MeasurementLock

# the settings that make the env; the trainer's other settings do not change it
ENV_FIELDS = ("env", "seed", "num_envs", "env_groups", "vectorization", "env_threads", "env_workers", "obs_size",
              "obs_shape", "obs_dtype", "num_actions", "env_cost_us")


def env_config(**values) -> TrainConfig:
    """A valid trainer config with these env settings: one epoch of one whole-batch minibatch, so no batch rule
    can refuse an env size the env itself takes."""
    batch = max(1, values.get("num_envs", TrainConfig.num_envs)) * TrainConfig.horizon
    return validate(TrainConfig(**values, minibatch_size=batch, total_steps=batch, warmup_epochs=0))


def measure(cfg: TrainConfig, steps: int, repeats: int, warmup_steps: int) -> dict:
    """Start-up seconds, then agent steps per second of `repeats` runs of `steps` steps each, after
    `warmup_steps` untimed steps. The actions are drawn before each timed run."""
    groups = make_env_groups(cfg, cfg.num_envs, 0, None, meanwhile=lambda: None)
    steppers = [env_stepper(env, cfg.env_groups > 1) for env in groups.envs]
    first = groups.envs[0]
    try:
        rng = np.random.default_rng(cfg.seed)

        def step_all(actions: np.ndarray) -> None:
            for stepper, group_actions in zip(steppers, np.split(actions, cfg.env_groups)):
                stepper.start(group_actions)
            for stepper in steppers:
                stepper.finish()

        for actions in rng.integers(first.num_actions, size=(warmup_steps, cfg.num_envs)):
            step_all(actions)
        rates = []
        for _ in range(repeats):
            actions = rng.integers(first.num_actions, size=(steps, cfg.num_envs))
            began = time.perf_counter()
            for row in actions:
                step_all(row)
            rates.append(steps * cfg.num_envs / (time.perf_counter() - began))
    finally:
        for stepper in steppers:
            stepper.close()
        for env in groups.envs:
            env.close()
    threads = [getattr(env, "threads", None) for env in groups.envs]
    return {"start_seconds": groups.start_seconds, "build_seconds": groups.build_seconds, "rates": rates,
            "median": statistics.median(rates), "threads": None if None in threads else sum(threads),
            "obs_shape": first.obs_shape, "obs_dtype": first.obs_dtype.name}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benches.envrate", description=__doc__.splitlines()[0])
    for name in ENV_FIELDS:
        default = getattr(TrainConfig, name)
        parser.add_argument("--" + name.replace("_", "-"), type=FIELD_TYPES[name], default=default,
                            help=f"{field_help(name)} (default {default!r})")
    parser.add_argument("--steps", type=int, default=200, help="timed steps of all envs per repeat (default 200)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs, their median reported (default 5)")
    parser.add_argument("--warmup-steps", type=int, default=20, help="untimed steps first (default 20)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        for name in ("steps", "repeats"):
            if getattr(args, name) <= 0:
                raise ConfigError(name, f"must be a positive number (got {getattr(args, name)})")
        if args.warmup_steps < 0:
            raise ConfigError("warmup_steps", f"must be zero or more (got {args.warmup_steps})")
        cfg = env_config(**{name: getattr(args, name) for name in ENV_FIELDS})
        with MeasurementLock() as lock:
            lock.acquire(True, lambda text: print(text, file=sys.stderr), command="benches.envrate")
            result = measure(cfg, args.steps, args.repeats, args.warmup_steps)
    except ConfigError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    except MachineFault as fault:
        parser.exit(1, f"{parser.prog}: error: {fault}\n")
    except KeyboardInterrupt:
        parser.exit(130, f"{parser.prog}: interrupted\n")
    threads = "" if result["threads"] is None else f", {result['threads']} env threads"
    groups = f" in {cfg.env_groups} groups stepped at once" if cfg.env_groups > 1 else ""
    print(f"{cfg.env}: {cfg.num_envs} envs{groups}{threads}, observations {list(result['obs_shape'])} "
          f"{result['obs_dtype']}")
    print(f"start-up {result['start_seconds']:.2f} s: construction {result['build_seconds']:.2f} s, then the first "
          f"reset {result['start_seconds'] - result['build_seconds']:.2f} s")
    print(f"env alone: {result['median']:,.0f} agent steps/s, median of {args.repeats} x {args.steps} steps "
          f"({', '.join(f'{rate:,.0f}' for rate in result['rates'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
