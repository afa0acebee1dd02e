"""The one typed config of the reference trainer, validated in one place.

Importing this module must stay cheap (no torch): the bench harness uses it to check suite files.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

PHASES = ("env", "eval_copy", "eval_forward", "eval_misc", "train_misc", "train_forward", "learn", "log")
BUILTIN_ENVS = ("memory", "cartpole", "synthetic")
DTYPES = ("fp32", "bf16", "fp16")


class ConfigError(ValueError):
    """Bad input: names the field and what is allowed."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field_name = field_name


@dataclass
class TrainConfig:
    # what to train on
    env: str = "memory"
    seed: int = 1
    total_steps: int = 200_000
    # batch: num_envs x horizon agent steps per epoch, split into minibatches of whole sequences
    num_envs: int = 64
    horizon: int = 16
    minibatch_size: int = 512
    update_epochs: int = 2
    # policy
    hidden_size: int = 64
    lstm: bool = True
    # PPO
    learning_rate: float = 3e-3
    anneal_lr: bool = True
    gamma: float = 0.97
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    # synthetic env only
    obs_size: int = 32
    num_actions: int = 4
    env_cost_us: float = 0.0
    # execution knobs
    device: str = "cpu"
    threads: int = 0
    dtype: str = "fp32"
    pinned: bool = False
    non_blocking: bool = False
    cuda_graphs: bool = False
    copy_stream: bool = False
    # the rollout steps the environments in this many groups, so the host can step one group while the
    # device computes another's actions (an overlap only a GPU gives; results do not depend on it)
    env_groups: int = 1
    compile: bool = False
    world_size: int = 1
    rank_timeout: float = 300.0
    # measurement
    timers: bool = True
    warmup_epochs: int = 1
    inject_delay: dict[str, float] = field(default_factory=dict)
    trace_dir: str = ""
    trace_epochs: int = 1

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.horizon

    @property
    def num_epochs(self) -> int:
        return max(1, -(-self.total_steps // self.batch_size))

    @property
    def envs_per_rank(self) -> int:
        return self.num_envs // self.world_size

    @property
    def minibatch_sequences_per_rank(self) -> int:
        return self.minibatch_size // self.horizon // self.world_size

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


FIELD_TYPES: dict[str, type] = {
    f.name: (dict if f.name == "inject_delay" else {"int": int, "float": float, "bool": bool, "str": str}[f.type])
    for f in dataclasses.fields(TrainConfig)
}
SYNTHETIC_ONLY = ("obs_size", "num_actions", "env_cost_us")
GPU_ONLY = ("pinned", "non_blocking", "cuda_graphs", "copy_stream")


def _positive(cfg: TrainConfig, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value <= 0:
            raise ConfigError(name, f"must be a positive number (got {value})")


def _non_negative(cfg: TrainConfig, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value < 0:
            raise ConfigError(name, f"must be zero or more (got {value})")


def from_dict(values: dict[str, Any]) -> TrainConfig:
    """Builds a config from plain values (a suite point, a JSON summary), checking names and types."""
    kwargs = {}
    for name, value in values.items():
        if name not in FIELD_TYPES:
            allowed = ", ".join(FIELD_TYPES)
            raise ConfigError(name, f"unknown setting (allowed: {allowed})")
        kwargs[name] = coerce(name, value)
    return validate(TrainConfig(**kwargs))


def coerce(name: str, value: Any) -> Any:
    """Checks one value's type; ints are accepted where floats are expected."""
    expected = FIELD_TYPES[name]
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is dict:
        if not isinstance(value, dict):
            raise ConfigError(name, f"must be a table of phase = milliseconds (got {value!r})")
        return {str(k): coerce_delay(str(k), v) for k, v in value.items()}
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError(name, f"must be {expected.__name__} (got {type(value).__name__} {value!r})")
    return value


def coerce_delay(phase: str, ms: Any) -> float:
    if isinstance(ms, bool) or not isinstance(ms, (int, float)):
        raise ConfigError("inject_delay", f"{phase}: milliseconds must be a number (got {ms!r})")
    return float(ms)


def parse_delay(text: str) -> tuple[str, float]:
    """Parses `PHASE=MS` from the command line."""
    phase, sep, ms = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return phase, float(ms)
    except ValueError:
        raise ConfigError("inject_delay", f"expected PHASE=MS, e.g. learn=5 (got {text!r})") from None


def validate(cfg: TrainConfig) -> TrainConfig:
    """Every rule about settings lives here; returns the config unchanged when it is valid."""
    if cfg.env not in BUILTIN_ENVS and not re.fullmatch(r"gym:\S+", cfg.env):
        raise ConfigError("env", f"unknown environment {cfg.env!r} (allowed: {', '.join(BUILTIN_ENVS)}, gym:<id>)")
    _positive(cfg, "total_steps", "num_envs", "horizon", "minibatch_size", "update_epochs", "hidden_size",
              "learning_rate", "world_size", "env_groups", "trace_epochs")
    _non_negative(cfg, "gamma", "gae_lambda", "clip_coef", "vf_coef", "ent_coef", "max_grad_norm",
                  "threads", "warmup_epochs", "env_cost_us")
    _positive(cfg, "rank_timeout")
    for name in ("gamma", "gae_lambda"):
        if getattr(cfg, name) > 1:
            raise ConfigError(name, f"must be between 0 and 1 (got {getattr(cfg, name)})")

    if cfg.num_envs % cfg.world_size:
        raise ConfigError("num_envs", f"must divide evenly among world_size={cfg.world_size} ranks (got {cfg.num_envs})")
    if cfg.envs_per_rank % cfg.env_groups:
        raise ConfigError("env_groups",
                          f"must divide each rank's {cfg.envs_per_rank} envs evenly (got {cfg.env_groups})")
    unit = cfg.horizon * cfg.world_size
    if cfg.minibatch_size % unit or cfg.batch_size % cfg.minibatch_size:
        raise ConfigError(
            "minibatch_size",
            f"must be a multiple of horizon x world_size ({unit}) that divides num_envs x horizon "
            f"({cfg.batch_size}) into whole sequences (got {cfg.minibatch_size})",
        )

    if cfg.env == "synthetic":
        _positive(cfg, "obs_size", "num_actions")
    else:
        defaults = TrainConfig()
        for name in SYNTHETIC_ONLY:
            if getattr(cfg, name) != getattr(defaults, name):
                raise ConfigError(name, f"applies to env=synthetic only (env is {cfg.env})")

    if cfg.dtype not in DTYPES:
        raise ConfigError("dtype", f"unknown dtype {cfg.dtype!r} (allowed: {', '.join(DTYPES)})")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", cfg.device):
        raise ConfigError("device", f"unknown device {cfg.device!r} (allowed: cpu, cuda, cuda:N)")
    if not cfg.is_cuda:
        for name in GPU_ONLY:
            if getattr(cfg, name):
                raise ConfigError(name, "needs a CUDA device (device is cpu)")
        if cfg.dtype == "fp16":
            raise ConfigError("dtype", "fp16 needs a CUDA device (allowed on cpu: fp32, bf16)")
    if cfg.non_blocking and not cfg.pinned:
        raise ConfigError("non_blocking", "needs pinned=true: a non_blocking copy from pageable memory is synchronous")
    if cfg.copy_stream and not (cfg.pinned and cfg.non_blocking):
        raise ConfigError("copy_stream", "needs pinned=true and non_blocking=true to overlap anything")
    if cfg.cuda_graphs and cfg.world_size > 1:
        raise ConfigError("cuda_graphs", "is not supported with world_size > 1 (DDP's collectives are not captured)")
    if cfg.cuda_graphs and cfg.dtype == "fp16":
        raise ConfigError("dtype", "fp16 is not supported with cuda_graphs (use bf16, which needs no loss scaling)")
    if cfg.cuda_graphs and cfg.warmup_epochs < 1:
        raise ConfigError("warmup_epochs", "must be 1 or more with cuda_graphs: capture follows an eager epoch, so "
                                           "the optimizer's state and compilation are created before it (got 0)")
    if cfg.cuda_graphs and cfg.inject_delay:
        raise ConfigError("inject_delay", "cannot be used with cuda_graphs (a host sleep is not captured)")

    for phase, ms in cfg.inject_delay.items():
        if phase not in PHASES:
            raise ConfigError("inject_delay", f"unknown phase {phase!r} (allowed: {', '.join(PHASES)})")
        if ms < 0:
            raise ConfigError("inject_delay", f"{phase}: milliseconds must be zero or more (got {ms})")
    if cfg.warmup_epochs >= cfg.num_epochs:
        raise ConfigError(
            "warmup_epochs",
            f"must be less than the number of epochs ({cfg.num_epochs} for total_steps={cfg.total_steps}); "
            "raise total_steps or lower warmup_epochs",
        )
    steady_epochs = cfg.num_epochs - cfg.warmup_epochs
    if cfg.trace_epochs > steady_epochs:
        raise ConfigError("trace_epochs", f"must be at most the run's {steady_epochs} steady epochs "
                                          f"(got {cfg.trace_epochs}); raise total_steps or trace fewer epochs")
    return cfg
