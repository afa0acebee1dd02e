"""The one typed config of the reference trainer, validated in one place.

Importing this module must stay cheap (no torch): the bench harness uses it to check suite files.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

from rlperf.errors import ConfigError
from rlperf.summary import GRAPH_PHASES, PHASES

BUILTIN_ENVS = ("memory", "cartpole", "catch", "synthetic", "synthetic-device")
SYNTHETIC_ENVS = ("synthetic", "synthetic-device")
VECTOR_ENVS = ("memory", "cartpole")  # built-in envs whose observations are vectors, never images
DTYPES = ("fp32", "bf16", "fp16")
VECTORIZATIONS = ("auto", "native", "sync", "async")
ENCODERS = ("mlp", "cnn")
OBS_DTYPES = ("float32", "uint8")
GRAPH_SCOPES = ("step", "rollout", "update", "both")
ROLLOUT_PHASES, UPDATE_PHASES, LOG_PHASE = PHASES[:4], PHASES[4:7], PHASES[7]
ROLLOUT_GRAPH, UPDATE_GRAPH = GRAPH_PHASES
# every phase a run of any graph_scope reports, in the order of an epoch
EVERY_PHASE = (*ROLLOUT_PHASES, ROLLOUT_GRAPH, *UPDATE_PHASES, UPDATE_GRAPH, LOG_PHASE)
# (kernel, stride) of the CNN encoder's convolutions: the usual Atari encoder
CNN_LAYERS = ((8, 4), (4, 2), (3, 1))
# A delay is a sleep once an epoch that a phase must absorb; a minute of it is already no measurement.
MAX_INJECT_DELAY_MS = 60_000.0
# More threads than the largest machines have cores; asking OpenMP for a hundred thousand crashes the process.
MAX_THREADS = 1024


# The roles a field can play beyond configuring the run, each read by the tools that need it.
SYNTHETIC_ENV = "synthetic env"  # applies to env=synthetic or synthetic-device only
GPU = "gpu"  # needs a CUDA device
OBSERVER = "observer"  # changes how a run is observed or deliberately perturbed, not what it computes
PROFILER = "profiler"  # set by `rlperf profile`, never swept by a suite
MACHINE = "machine"  # names the machine's hardware: two machines run one suite each on their own


@dataclass(frozen=True)
class Allowed:
    """What one knob allows on its own, declared beside its help; validate() adds the rules that span knobs."""
    positive: bool = False
    non_negative: bool = False
    high: float | None = None  # with non_negative: at most this
    choices: tuple[str, ...] = ()
    pattern: str = ""  # a value it matches in full is allowed too, shown as `shown`
    shown: str = ""
    noun: str = ""  # what an unknown choice is called: "unknown dtype 'fp8'"
    check: Callable[[Any], str | None] | None = None  # for a knob whose values need more than the above

    def refusal(self, value: Any) -> str | None:
        """Why `value` is not allowed, naming what is; None when it is."""
        if isinstance(value, float) and not math.isfinite(value):  # NaN passes every comparison below
            return f"must be a finite number (got {value})"
        if value is None:
            return None
        if self.choices and value not in self.choices and not (self.pattern and re.fullmatch(self.pattern, value)):
            allowed = ", ".join((*self.choices, *([self.shown] if self.shown else [])))
            return f"unknown {self.noun} {value!r} (allowed: {allowed})"
        if self.positive and value <= 0:
            return f"must be a positive number (got {value})"
        if self.non_negative and self.high is None and value < 0:
            return f"must be zero or more (got {value})"
        if self.non_negative and self.high is not None and not 0 <= value <= self.high:
            return f"must be between 0 and {self.high:g} (got {value})"
        return self.check(value) if self.check else None


def knob(default: Any, help: str, *roles: str, **allowed: Any) -> Any:
    """A TrainConfig field with its help, roles and what it allows (Allowed's fields) beside it."""
    metadata = {"help": help, "roles": frozenset(roles), "allowed": Allowed(**allowed)}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=metadata)
    return field(default=default, metadata=metadata)


def delays_refusal(delays: dict[str, float]) -> str | None:
    for phase, ms in delays.items():
        if phase not in PHASES:
            return f"unknown phase {phase!r} (allowed: {', '.join(PHASES)})"
        if not 0 <= ms <= MAX_INJECT_DELAY_MS:
            return f"{phase}: milliseconds must be from 0 to {MAX_INJECT_DELAY_MS:g} (got {ms})"
    return None


@dataclass
class TrainConfig:
    # what to train on
    env: str = knob("memory", "memory, cartpole, catch, synthetic, synthetic-device or gym:<id>; gym:<module>:<id> "
                              "imports the module that registers the id first (gym:ale_py:ALE/Breakout-v5); "
                              "synthetic-device is synthetic made and stepped on the training device, with no host "
                              "copy, to time the trainer alone",
                     choices=BUILTIN_ENVS, pattern=r"gym:\S+", shown="gym:<id>", noun="environment")
    seed: int = knob(1, "random seed of the environments and the policy")
    total_steps: int = knob(200_000, "agent steps to train for, rounded up to whole epochs of num_envs x horizon",
                            positive=True)
    vectorization: str = knob("auto", "how gym:<id> envs are vectorized: native (the env's own vector entry point), "
                                      "sync (copies stepped in turn in this process), async (a subprocess per copy), "
                                      "or auto (native where the env has one, else sync)",
                              choices=VECTORIZATIONS, noun="mode")
    env_threads: int = knob(0, "threads that step a natively vectorized gym:<id> env's copies (ale-py's AtariVectorEnv), "
                               "in each env group; 0: the cores this process may use (its share when ranks share the "
                               "machine), at most one per env", non_negative=True)
    env_workers: int = knob(0, "processes that build and step a natively vectorized gym:<id> env's copies (ale-py's), "
                               "each a share of every env group's copies with its share of env_threads: hundreds of "
                               "emulators are built that many at a time, not one after another; 0: all in this process",
                            non_negative=True)
    # batch: num_envs x horizon agent steps per epoch, split into minibatches of whole sequences
    num_envs: int = knob(64, "environments in all ranks together; batch = num_envs x horizon", positive=True)
    horizon: int = knob(16, "environment steps per rollout, and the length of the training sequences", positive=True)
    minibatch_size: int = knob(512, "agent steps per minibatch, a multiple of horizon x world_size", positive=True)
    update_epochs: int = knob(2, "passes over the batch per epoch", positive=True)
    # policy
    hidden_size: int = knob(64, "width of the encoder and the LSTM, in units", positive=True)
    lstm: bool = knob(True, "use the LSTM core (--no-lstm: an MLP-only policy)")
    encoder: str = knob("mlp", "observation encoder in front of the core: mlp (one linear layer) or cnn (convolutions "
                               "8x8/4, 4x4/2, 3x3/1, then a linear layer to hidden_size; images of at least 36x36)",
                        choices=ENCODERS, noun="encoder")
    cnn_channels: int = knob(32, "channels of the CNN's first convolution, twice as many in the second and third "
                                 "(32: the usual Atari encoder); encoder=cnn only", positive=True)
    # PPO
    learning_rate: float = knob(3e-3, "Adam's learning rate", positive=True)
    anneal_lr: bool = knob(True, "lower the learning rate linearly to 0 over the run")
    gamma: float = knob(0.97, "discount factor, 0 to 1", non_negative=True, high=1)
    gae_lambda: float = knob(0.95, "GAE lambda, 0 to 1", non_negative=True, high=1)
    clip_coef: float = knob(0.2, "PPO's ratio clip", non_negative=True)
    vf_coef: float = knob(0.5, "weight of the value loss", non_negative=True)
    ent_coef: float = knob(0.01, "weight of the entropy bonus", non_negative=True)
    max_grad_norm: float = knob(0.5, "gradient norm clip", non_negative=True)
    # time to solve: the run goes on for total_steps either way, so every run of a point has the same budget
    target_return: float | None = knob(None, "smoothed episode return at which the run counts as solved; the "
                                             "summary records the agent steps and seconds at which it was first "
                                             "reached, or that total_steps ran out first (default: none)")
    target_window: int = knob(100, "episodes the smoothed return averages over: the most recent epochs' finished "
                                   "episodes, at least this many; with target_return only", positive=True)
    # the synthetic env
    obs_size: int = knob(32, "observation width of env=synthetic, in values", SYNTHETIC_ENV, positive=True)
    obs_shape: str = knob("", "observation shape of env=synthetic, comma-separated, e.g. 4,84,84 (default: empty, "
                              "obs_size values)", SYNTHETIC_ENV)
    obs_dtype: str = knob("float32", "observation dtype of env=synthetic: float32, or uint8 (pixels, copied to the "
                                     "device as bytes and scaled to [0, 1] there)", SYNTHETIC_ENV,
                          choices=OBS_DTYPES, noun="dtype")
    num_actions: int = knob(4, "actions of env=synthetic", SYNTHETIC_ENV, positive=True)
    env_cost_us: float = knob(0.0, "CPU microseconds env=synthetic spins per env per step, to model a costlier env",
                              SYNTHETIC_ENV, non_negative=True)
    # execution knobs
    device: str = knob("cpu", "cpu, cuda or cuda:N (the first of world_size GPUs)", MACHINE,
                       choices=("cpu", "cuda"), pattern=r"cuda:\d+", shown="cuda:N", noun="device")
    threads: int = knob(0, "torch CPU threads per process; 0 leaves torch's default (one per physical core), or "
                           "each rank's share of the cores when world_size > 1", non_negative=True, high=MAX_THREADS)
    dtype: str = knob("fp32", "fp32, bf16 or fp16 (autocast around forward and loss)", choices=DTYPES, noun="dtype")
    pinned: bool = knob(False, "stage host<->device copies in page-locked buffers (CUDA only)", GPU)
    non_blocking: bool = knob(False, "asynchronous host<->device copies; needs --pinned (CUDA only)", GPU)
    cuda_graphs: bool = knob(False, "capture and replay the rollout step and the update as CUDA graphs (CUDA only)",
                             GPU)
    graph_scope: str = knob("step", "what one call into the device covers, each call one CUDA graph under "
                                    "--cuda-graphs: step (a policy step per env group, a forward+loss and a "
                                    "backward+optimizer step per minibatch), rollout (every step of the rollout; "
                                    "env=synthetic-device only), update (advantages and every minibatch of every "
                                    "update epoch, the learning rate annealed on the device) or both; the phases "
                                    "inside a whole call become one, rollout_graph or update_graph. Without "
                                    "--cuda-graphs the whole calls run uncaptured, computing what step does",
                            choices=GRAPH_SCOPES, noun="scope")
    copy_stream: bool = knob(False, "issue host->device copies on a second stream; needs --pinned --non-blocking "
                                    "(CUDA only)", GPU)
    env_groups: int = knob(1, "step the envs in this many groups, each group's env step running beside the next "
                              "group's policy step (results do not depend on it)", positive=True)
    compile: bool = knob(False, "torch.compile the rollout step and forward+loss (compile time reported apart)")
    world_size: int = knob(1, "ranks (processes), one GPU each on CUDA; num_envs is split among them", positive=True)
    rank_timeout: float = knob(300.0, "seconds a rank may make no progress before the run fails with that rank named",
                               positive=True)
    # measurement
    timers: bool = knob(True, "per-phase timers (--no-timers to measure their cost)")
    warmup_epochs: int = knob(1, "epochs left out of the steady SPS", non_negative=True)
    steady_seconds: float = knob(0.0, "after the warm-up, train whole epochs until the steady epochs' time reaches "
                                      "this many seconds (at least 2 epochs), total_steps the cap; 0 trains "
                                      "total_steps", non_negative=True)
    inject_delay: dict[str, float] = knob({}, "PHASE=MS: spin MS milliseconds inside PHASE once per epoch "
                                              "(repeatable; default none)", OBSERVER, check=delays_refusal)
    inject_delay_every: int = knob(1, "inject the delays in one epoch of each N only, last and first of its N in turn "
                                      "(2: every other epoch, each beside an undelayed one; default 1)", OBSERVER,
                                   positive=True)
    trace_dir: str = knob("", "write a torch.profiler Chrome trace of steady epochs here (default: no trace)",
                          OBSERVER, PROFILER)
    trace_epochs: int = knob(1, "steady epochs to trace, at most the run's steady epochs", OBSERVER, PROFILER,
                             positive=True)

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
    def whole_rollout(self) -> bool:
        return self.graph_scope in ("rollout", "both")

    @property
    def whole_update(self) -> bool:
        return self.graph_scope in ("update", "both")

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases a run's epochs are cut into: a whole call is one phase, its parts no longer timed apart."""
        rollout = (ROLLOUT_GRAPH,) if self.whole_rollout else ROLLOUT_PHASES
        update = (UPDATE_GRAPH,) if self.whole_update else UPDATE_PHASES
        return (*rollout, *update, LOG_PHASE)

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_args(self, leave_out: tuple[str, ...] = ()) -> list[str]:
        """The `rlperf train` flags that reproduce this config (defaults and `leave_out` are left out)."""
        defaults = TrainConfig()
        args = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in leave_out or value == getattr(defaults, f.name):
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, dict):
                args += [arg for phase, ms in value.items() for arg in (flag, f"{phase}={ms}")]
            elif isinstance(value, bool):
                args.append(flag if value else "--no-" + f.name.replace("_", "-"))
            else:
                args += [flag, str(value)]
        return args


FIELD_TYPES: dict[str, type] = {
    f.name: (dict if f.name == "inject_delay"
             else {"int": int, "float": float, "bool": bool, "str": str}[f.type.removesuffix(" | None")])
    for f in dataclasses.fields(TrainConfig)
}
# settings that may be left unset (None): the default, and the only value a suite file cannot write
OPTIONAL_FIELDS = frozenset(f.name for f in dataclasses.fields(TrainConfig) if f.type.endswith(" | None"))


def fields_with(role: str) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(TrainConfig) if role in f.metadata["roles"])


def field_help(name: str) -> str:
    return TrainConfig.__dataclass_fields__[name].metadata["help"]


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
    if value is None and name in OPTIONAL_FIELDS:
        return None
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


def synthetic_obs_shape(cfg: TrainConfig) -> tuple[int, ...]:
    """The observation shape of env=synthetic: obs_shape parsed, or obs_size values."""
    if not cfg.obs_shape:
        return (cfg.obs_size,)
    try:
        shape = tuple(int(size) for size in cfg.obs_shape.split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) <= 0:
        raise ConfigError("obs_shape", f"expected positive sizes separated by commas, e.g. 4,84,84 (got {cfg.obs_shape!r})")
    return shape


def image_layout(shape: tuple[int, ...]) -> tuple[int, int, int, bool] | None:
    """`(channels, height, width, channels_last)` of an image observation, None for any other shape. Images
    are [C, H, W], or [H, W, C] (gymnasium's pixel layout) when the last axis has at most 4 entries and the
    first more (ale-py's native frame stack is [4, 84, 84], its single env's RGB frame [210, 160, 3])."""
    if len(shape) != 3:
        return None
    if shape[2] <= 4 < shape[0]:
        return shape[2], shape[0], shape[1], True
    return shape[0], shape[1], shape[2], False


def cnn_feature_map(height: int, width: int) -> tuple[int, int]:
    """Height and width of the CNN encoder's last feature map (below 1: the image is too small)."""
    for kernel, stride in CNN_LAYERS:
        height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
    return height, width


def cnn_refusal(shape: tuple[int, ...]) -> str | None:
    """Why the CNN encoder cannot read observations of `shape`; None when it can."""
    layout = image_layout(shape)
    if layout is None:
        return f"cnn needs image observations [C,H,W] or [H,W,C] (got shape {list(shape)}; allowed: mlp)"
    _, height, width, _ = layout
    if min(cnn_feature_map(height, width)) < 1:
        side = next(side for side in range(1, 1 << 16) if min(cnn_feature_map(side, side)) >= 1)
        return f"cnn needs images of at least {side}x{side} pixels (got {height}x{width}; allowed: mlp)"
    return None


def validate(cfg: TrainConfig) -> TrainConfig:
    """Every rule about settings lives here: each knob's own, declared beside its help, then the rules that span
    knobs. Returns the config unchanged when it is valid."""
    for f in dataclasses.fields(cfg):
        refusal = f.metadata["allowed"].refusal(getattr(cfg, f.name))
        if refusal:
            raise ConfigError(f.name, refusal)
    for rules in (batch_rules, env_rules, synthetic_env_rules, device_rules, scope_rules, epoch_rules):
        rules(cfg)
    return cfg


def batch_rules(cfg: TrainConfig) -> None:
    if cfg.num_envs % cfg.world_size:
        raise ConfigError("num_envs", f"must divide evenly among world_size={cfg.world_size} ranks "
                                      f"(got {cfg.num_envs})")
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


def env_rules(cfg: TrainConfig) -> None:
    gym = cfg.env.startswith("gym:")
    if cfg.vectorization != "auto" and not gym:
        raise ConfigError("vectorization", f"applies to gym:<id> envs only (env is {cfg.env})")
    for name, what in (("env_threads", "sets a native vector env's own threads"),
                       ("env_workers", "splits a native vector env among processes")):
        if getattr(cfg, name) and not gym:
            raise ConfigError(name, f"applies to natively vectorized gym:<id> envs only (env is {cfg.env})")
        if getattr(cfg, name) and cfg.vectorization in ("sync", "async"):
            raise ConfigError(name, f"{what}, and vectorization={cfg.vectorization} steps single copies (allowed "
                                    f"with it: auto, native)")
    group_envs = cfg.envs_per_rank // cfg.env_groups
    if cfg.env_workers > group_envs:
        raise ConfigError("env_workers", f"each worker needs a copy of every env group's {group_envs} (allowed: 0 to "
                                         f"{group_envs}, got {cfg.env_workers})")
    if cfg.encoder != "cnn" and cfg.cnn_channels != TrainConfig.cnn_channels:
        raise ConfigError("cnn_channels", f"applies to encoder=cnn only (encoder is {cfg.encoder})")
    if cfg.encoder == "cnn" and cfg.env in VECTOR_ENVS:
        raise ConfigError("encoder", f"cnn needs image observations, and env {cfg.env} gives vectors (allowed: mlp)")


def synthetic_env_rules(cfg: TrainConfig) -> None:
    if cfg.env not in SYNTHETIC_ENVS:
        defaults = TrainConfig()
        for name in fields_with(SYNTHETIC_ENV):
            if getattr(cfg, name) != getattr(defaults, name):
                raise ConfigError(name, f"applies to env=synthetic or synthetic-device only (env is {cfg.env})")
        return
    if cfg.obs_shape and cfg.obs_size != TrainConfig.obs_size:
        raise ConfigError("obs_shape", f"replaces obs_size: set one of them (got obs_shape={cfg.obs_shape!r} "
                                       f"and obs_size={cfg.obs_size})")
    shape = synthetic_obs_shape(cfg)  # a malformed obs_shape is refused here, whatever the encoder
    refusal = cnn_refusal(shape) if cfg.encoder == "cnn" else None
    if refusal:
        raise ConfigError("encoder", refusal)
    if cfg.env == "synthetic-device" and cfg.env_cost_us:
        raise ConfigError("env_cost_us", "spins the host per env step, and synthetic-device steps on the device "
                                         "(allowed with it: 0; env=synthetic models a costlier host env)")
    for name in ("pinned", "non_blocking", "copy_stream"):
        if cfg.env == "synthetic-device" and getattr(cfg, name):
            raise ConfigError(name, "shapes host<->device copies, and synthetic-device makes none "
                                    "(env=synthetic measures them)")


def device_rules(cfg: TrainConfig) -> None:
    for name in fields_with(GPU):
        if getattr(cfg, name) and not cfg.is_cuda:
            raise ConfigError(name, "needs a CUDA device (device is cpu)")
    if cfg.dtype == "fp16" and not cfg.is_cuda:
        raise ConfigError("dtype", "fp16 needs a CUDA device (allowed on cpu: fp32, bf16)")
    if cfg.non_blocking and not cfg.pinned:
        raise ConfigError("non_blocking", "needs pinned=true: a non_blocking copy from pageable memory is synchronous")
    if cfg.copy_stream and not (cfg.pinned and cfg.non_blocking):
        raise ConfigError("copy_stream", "needs pinned=true and non_blocking=true to overlap anything")
    if cfg.cuda_graphs and cfg.world_size > 1:
        raise ConfigError("cuda_graphs", "is not supported with world_size > 1 (DDP's collectives are not captured)")
    if cfg.cuda_graphs and cfg.dtype == "fp16":
        raise ConfigError("dtype", "fp16 is not supported with cuda_graphs (use bf16, which needs no loss scaling)")
    if cfg.cuda_graphs and cfg.warmup_epochs < 2:
        raise ConfigError("warmup_epochs", f"must be 2 or more with cuda_graphs: an eager epoch creates the "
                                           f"optimizer's state and compiles before capture, and a last warm-up epoch "
                                           f"replays the graphs once, so their one-time costs stay out of the steady "
                                           f"epochs (got {cfg.warmup_epochs})")
    if cfg.cuda_graphs and cfg.inject_delay:
        raise ConfigError("inject_delay", "cannot be used with cuda_graphs (a host sleep is not captured)")


def scope_rules(cfg: TrainConfig) -> None:
    if cfg.graph_scope == "step":
        return
    if cfg.whole_rollout and cfg.env != "synthetic-device":
        raise ConfigError("graph_scope", f"{cfg.graph_scope} steps the env inside one call, and only "
                                         f"synthetic-device steps on the device (env is {cfg.env}; allowed with it: "
                                         f"step, update)")
    if cfg.world_size > 1:
        raise ConfigError("graph_scope", f"{cfg.graph_scope} is not supported with world_size > 1 (allowed: step)")
    if cfg.inject_delay:
        raise ConfigError("inject_delay", f"cannot be used with graph_scope={cfg.graph_scope}: a whole call has no "
                                          f"phases inside to delay (allowed with it: none)")


def epoch_rules(cfg: TrainConfig) -> None:
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
    if cfg.target_return is None and cfg.target_window != TrainConfig.target_window:
        raise ConfigError("target_window", "applies to runs with a target_return only (none is set)")
