"""What `rlperf attach` installs in the command it runs: phases found without a line of the command changed.
docs/any-trainer.md says what is attributed, how, where each boundary lies, and what is not attributed.
"""

from __future__ import annotations

import atexit
import builtins
import collections
import functools
import importlib.abc
import operator
import os
import sys
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlperf import phases
from rlperf.summary import OTHER, PHASES

ENV_STEP_VARIABLE = "RLPERF_ATTACH_ENV_STEP"  # MODULE:CLASS.METHOD[,...]: steps attach is told of
AGENTS_VARIABLE = "RLPERF_ATTACH_AGENTS"  # agents per named step: a number, or the env's attribute that holds it
ENV_STEP_FLAG = "--env-step MODULE:CLASS.METHOD"
# A step counts this many agents: an attribute of the env, the first one it has.
DEFAULT_AGENT_ATTRIBUTES = ("num_envs", "num_agents", "env_num", "batch_size")
# Method names counted on the main thread while no known env step has been seen: named when none ever is.
CENSUS_NAMES = frozenset({"step", "step_wait", "recv"})
# packages whose step and recv are no env's: the standard library's pipes and queues, torch's optimizers
NOT_ENVS = frozenset(sys.stdlib_module_names) | {"torch"}

Counter = Callable[[Any, tuple, dict, Any], int]


def count_attribute(*names: str) -> Counter:
    """Agents per step from the env's first attribute of `names` (a torch.Size counts its elements)."""
    def count(env, args, kwargs, result) -> int:
        for name in names:
            value = getattr(env, name, None)
            if value is not None:
                return size_of(value)
        return 1

    return count


def size_of(value: Any) -> int:
    if isinstance(value, int):
        return value
    try:
        count = 1
        for size in value:  # a batch shape: its elements are the envs stepped at once
            count *= int(size)
        return count
    except TypeError:
        return int(value)


def count_tianshou(env, args, kwargs, result) -> int:
    """tianshou steps the envs named by `id` (all when None), and counts the ready ones a step returns."""
    observations = result[0] if isinstance(result, tuple) and result else None
    try:
        return len(observations)
    except TypeError:
        ids = kwargs.get("id", args[1] if len(args) > 1 else None)
        return env.env_num if ids is None else len(ids) if hasattr(ids, "__len__") else 1


@dataclass(frozen=True)
class EnvSteps:
    """Where a library steps its envs: the classes of `module` (and their subclasses), the methods that step a
    batch (`counted`, agents per call from `agents`), and those that are the env's time but count no agent (an
    asynchronous send, whose receive counts)."""

    library: str
    module: str
    classes: tuple[str, ...]
    counted: tuple[str, ...] = ("step",)
    uncounted: tuple[str, ...] = ()
    agents: Counter = count_attribute("num_envs")
    # one env's step, which every vector env calls inside its own: timed until a vector env first steps, then
    # restored (a loop over vector envs then pays nothing for the envs inside them)
    single: bool = False


NUM_ENVS = count_attribute("num_envs")
# Every library's envs, by the module that defines their classes. Only the outermost step of a nest counts (a
# wrapper stepping its env, a vector env its copies, a TorchRL transform running a network).
ENV_STEPS = (
    EnvSteps("gymnasium", "gymnasium.vector.vector_env", ("VectorEnv",), ("step", "step_wait"), ("step_async",)),
    EnvSteps("gymnasium", "gymnasium.core", ("Env",), single=True),
    EnvSteps("gym", "gym.vector.vector_env", ("VectorEnv",), ("step", "step_wait"), ("step_async",)),
    EnvSteps("stable-baselines3", "stable_baselines3.common.vec_env.base_vec_env", ("VecEnv",),
             ("step", "step_wait"), ("step_async",)),
    # TorchRL's collectors step through step_and_maybe_reset, which resets finished envs: their time too
    EnvSteps("TorchRL", "torchrl.envs.common", ("EnvBase",), ("step", "step_and_maybe_reset"),
             agents=count_attribute("batch_size")),
    EnvSteps("rsl-rl", "rsl_rl.env.vec_env", ("VecEnv",)),
    EnvSteps("tianshou", "tianshou.env.venvs", ("BaseVectorEnv",), agents=count_tianshou),
    EnvSteps("PufferLib", "pufferlib.vector", ("Serial", "Multiprocessing", "Ray", "Native"), ("step", "recv"),
             ("send",), count_attribute("agents_per_batch", "num_agents")),
    EnvSteps("PufferLib", "pufferlib.environment", ("PufferEnv",), agents=count_attribute("num_agents")),
    EnvSteps("PufferLib", "pufferlib.pufferlib", ("PufferEnv",), agents=count_attribute("num_agents")),
    EnvSteps("Isaac Lab", "isaaclab.envs.manager_based_rl_env", ("ManagerBasedRLEnv",)),
    EnvSteps("Isaac Lab", "isaaclab.envs.direct_rl_env", ("DirectRLEnv",)),
    EnvSteps("Isaac Lab", "omni.isaac.lab.envs.manager_based_rl_env", ("ManagerBasedRLEnv",)),
    EnvSteps("Isaac Lab", "omni.isaac.lab.envs.direct_rl_env", ("DirectRLEnv",)),
    EnvSteps("skrl", "skrl.envs.wrappers.torch.base", ("Wrapper",)),
)
LIBRARIES = tuple(dict.fromkeys(steps.library for steps in ENV_STEPS))
# torch's global hooks that attach registers (each at or below the torch floor: rlperf/torch_api.py).
TORCH_HOOKS = (
    "torch.nn.modules.module.register_module_forward_pre_hook",
    "torch.nn.modules.module.register_module_forward_hook",
    "torch.optim.optimizer.register_optimizer_step_pre_hook",
    "torch.optim.optimizer.register_optimizer_step_post_hook",
    "torch.autograd.backward",
)


class AttachState:
    """Where the loop is, as the hooks see it: how deep in module calls, inside an env step or `learn`, which
    forward phase they opened, the marks of the epoch's last env step and last update step (where the glue after
    them begins), whether an optimizer has stepped since the last env step."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_env = False
        self.in_learn = False
        self.opened: str | None = None
        self.train_mark = 0  # the mark at which train_forward opened
        self.train_has_grad = False  # whether an output since then carries grad
        self.learned = False
        self.env_exit_mark: int | None = None
        self.learn_exit_mark: int | None = None
        self.env_seen = False
        self.types_stepped: set[type] = set()
        self.hooks: list[str] = []
        self.is_grad_enabled: Callable[[], bool] = lambda: False
        # Global module hooks make torch take its slow call path in every module: they run only until the first
        # optimizer step, finding the modules called outermost (the roots), which keep hooks of their own.
        self.discovering = True
        self.roots: dict[int, weakref.ref] = {}
        self.global_handles: list[Any] = []
        # step methods called on the main thread before any known env step, by (module, class, method)
        self.census: collections.Counter | None = None
        self.named: list[NamedStep] = []
        # one env's steps wrapped as (class, method, original, wrapper), until a vector env steps
        self.single_steps: list[tuple[type, str, Callable, Callable]] = []
        self.vector_seen = False


state = AttachState()


# ---- env steps --------------------------------------------------------------------------------------------


def wrap_step(function: Callable, agents: Counter | None, single: bool = False) -> Callable:
    """`function` as a step of the env: the phase `env`, an epoch begun where an update came before it, and (with
    `agents`) the agents it stepped counted. A vector env's step, once done, restores the single envs' steps."""
    if getattr(function, "__rlperf_attached__", False):
        if single or not function.__rlperf_single__:
            return function
        function = function.__wrapped__  # a vector env that is also an Env (gym's): wrapped as the vector it is

    @functools.wraps(function)
    def step(self, *args, **kwargs):
        clock = phases._clock
        if clock is None or state.in_env:  # not timing, or a step inside an env's step
            return function(self, *args, **kwargs)
        if state.learned:  # the first env step after an update begins the next epoch
            begin_next_epoch(clock)
        if state.opened is not None:
            close_train_forward(clock)
        if not state.env_seen:
            state.env_seen = True
            stop_census()
        state.in_env = True
        clock.enter("env")
        try:
            result = function(self, *args, **kwargs)
        finally:
            state.in_env = False
            clock.ground = "eval_misc"  # conversions, sampling and buffer writes until the next acting forward
            clock.exit("env")
            state.env_exit_mark = len(clock.marks) - 1
            if clock.delays:
                clock.delay_once("eval_misc")  # selfcheck's delay of the glue after the step, inside it
        if agents is not None:
            clock.epoch_steps += agents(self, args, kwargs, result)
        state.types_stepped.add(type(self))
        if not single and state.single_steps:
            restore_single_steps()
        return result

    step.__rlperf_attached__ = True
    step.__rlperf_single__ = single
    return step


def restore_single_steps() -> None:
    """A vector env has stepped: the steps of the envs inside it go back to their own (those still attach's)."""
    for cls, method, original, wrapper in state.single_steps:
        if cls.__dict__.get(method) is wrapper:
            setattr(cls, method, original)
    state.single_steps = []
    state.vector_seen = True


def begin_next_epoch(clock: phases.PhaseClock) -> None:
    state.learned = False
    clock.ground = OTHER
    clock.end_epoch()
    state.env_exit_mark = state.learn_exit_mark = None


def attach_class(cls: type, counted: tuple[str, ...], uncounted: tuple[str, ...], agents: Counter,
                 inherited: bool = False, single: bool = False) -> None:
    """Wraps `cls`'s own step methods (those it defines; inherited ones are wrapped where defined), or with
    `inherited` whichever it has."""
    if single and state.vector_seen:
        return
    for methods, counter in ((counted, agents), (uncounted, None)):
        for method in methods:
            own = getattr(cls, method, None) if inherited else cls.__dict__.get(method)
            if callable(own):
                wrapper = wrap_step(own, counter, single)
                setattr(cls, method, wrapper)
                if single and wrapper is not own:
                    state.single_steps.append((cls, method, own, wrapper))


def attach_base(base: type, counted: tuple[str, ...], uncounted: tuple[str, ...], agents: Counter,
                single: bool = False) -> None:
    """Wraps the base's step methods, its subclasses' that exist, and each subclass's defined from now on."""
    pending = [base]
    while pending:
        cls = pending.pop()
        attach_class(cls, counted, uncounted, agents, single=single)
        pending += cls.__subclasses__()
    original = base.__dict__.get("__init_subclass__")

    def __init_subclass__(cls, **kwargs):
        if original is not None:
            original.__get__(None, cls)(**kwargs)
        else:
            super(base, cls).__init_subclass__(**kwargs)
        attach_class(cls, counted, uncounted, agents, single=single)

    base.__init_subclass__ = classmethod(__init_subclass__)
    state.hooks += [f"{base.__module__}.{base.__qualname__}.{method}" for method in (*counted, *uncounted)]


def library_callback(steps: EnvSteps) -> Callable[[Any], None]:
    def callback(module) -> None:
        for name in steps.classes:
            cls = getattr(module, name, None)
            if isinstance(cls, type):
                attach_base(cls, steps.counted, steps.uncounted, steps.agents, steps.single)

    return callback


# ---- steps named by the user (--env-step) ------------------------------------------------------------------


@dataclass
class NamedStep:
    module: str
    cls: str
    method: str
    agents: Counter
    found: bool = False

    @property
    def text(self) -> str:
        return f"{self.module}:{self.cls}.{self.method}"


def parse_named_steps(text: str, agents_text: str) -> list[NamedStep]:
    """`MODULE:CLASS.METHOD[,...]` and the agents per step (a number, an attribute's name, or empty for the
    defaults); the harness checked both, so a malformed part is skipped here."""
    if agents_text.isdigit():
        number = int(agents_text)
        agents: Counter = lambda env, args, kwargs, result: number  # noqa: E731
    elif agents_text:
        agents = count_attribute(agents_text)
    else:
        agents = count_default
    named = []
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        module, _, rest = part.partition(":")
        cls, _, method = rest.rpartition(".")
        if module and cls and method:
            named.append(NamedStep(module, cls, method, agents))
    return named


def count_default(env, args, kwargs, result) -> int:
    """Agents per named step: the env's first attribute of DEFAULT_AGENT_ATTRIBUTES, else the length of the step's
    first argument (a batch of actions), else 1."""
    for name in DEFAULT_AGENT_ATTRIBUTES:
        value = getattr(env, name, None)
        if value is not None:
            return size_of(value)
    if args and hasattr(args[0], "__len__"):
        return len(args[0])
    return 1


def main_module_names() -> set[str]:
    """The names a user may give the script that runs as `__main__`: that, its module's name under `-m`, its file's
    stem."""
    main = sys.modules.get("__main__")
    names = {"__main__"}
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        names.add(spec.name)
    if getattr(main, "__file__", None):
        names.add(os.path.splitext(os.path.basename(main.__file__))[0])
    return names


def attach_named(cls: type) -> None:
    """Attaches `cls` where a named step is one of its methods (by its module, or `__main__` by the script's names)."""
    for named in state.named:
        if named.found or cls.__qualname__ != named.cls:
            continue
        if cls.__module__ == named.module or (cls.__module__ == "__main__" and named.module in main_module_names()):
            named.found = True
            attach_class(cls, (named.method,), (), named.agents, inherited=True)
            attach_base(cls, (named.method,), (), named.agents)


def watch_class_statements() -> None:
    """Every class statement runs `builtins.__build_class__`: a named env class is attached as it is defined, in
    a module or in the script itself, where no import could be watched."""
    build = builtins.__build_class__

    def build_class(*args, **kwargs):
        cls = build(*args, **kwargs)
        if isinstance(cls, type) and not all(named.found for named in state.named):
            attach_named(cls)
        return cls

    builtins.__build_class__ = build_class
    for named in state.named:  # defined before the bootstrap ran
        module = sys.modules.get(named.module)
        cls = getattr(module, named.cls, None) if module is not None else None
        if isinstance(cls, type):
            attach_named(cls)


# ---- what was stepped where no known env was ----------------------------------------------------------------


def census_call(frame, event, arg) -> None:
    if event == "call" and frame.f_code.co_name in CENSUS_NAMES:
        owner = frame.f_locals.get("self")
        if owner is not None and state.census is not None:
            cls = type(owner)
            state.census[(cls.__module__, cls.__qualname__, frame.f_code.co_name)] += 1


def start_census() -> None:
    """From the first module call until a known env steps or an optimizer does: the main thread's step methods
    counted (a profile function, which costs every Python call, so only then)."""
    if state.census is None and not state.env_seen and sys.getprofile() is None:
        state.census = collections.Counter()
        sys.setprofile(census_call)


def stop_census() -> None:
    if sys.getprofile() is census_call:
        sys.setprofile(None)


def missing_env_line() -> str:
    """The one line a summary without agent steps carries: nothing stepped that attach knows, what did step, and
    the flag that would name it."""
    named = state.named
    if named:
        undefined = [step.text for step in named if not step.found]
        why = (f"the class of {', '.join(undefined)} (--env-step) was never defined" if undefined
               else f"{', '.join(step.text for step in named)} (--env-step) was never called")
    else:
        why = f"the command stepped no env class attach knows ({', '.join(LIBRARIES)})"
    stepped = collections.Counter({key: calls for key, calls in (state.census or {}).items()
                                   if key[0].partition(".")[0] not in NOT_ENVS})
    if stepped:
        top = stepped.most_common(3)
        seen = "; the most-called step methods on the main thread were " + ", ".join(
            f"{module}:{cls}.{method} ({calls:,} calls)" for (module, cls, method), calls in top)
    elif state.census is None and not state.roots:
        seen = "; no module was called, so no step method was looked for"
    else:
        seen = "; no method named step was called on the main thread before the first optimizer step"
    return f"no env step was seen: {why}{seen}; name the env's step with {ENV_STEP_FLAG}. SPS is left out"


# ---- torch ----------------------------------------------------------------------------------------------


def close_train_forward(clock: phases.PhaseClock) -> None:
    if state.opened == "train_forward" and clock.stack and clock.stack[-1] == "train_forward":
        clock.exit("train_forward")
    state.opened = None


def global_pre_hook(module, args) -> None:
    if state.depth == 0 and id(module) not in state.roots:
        if not state.roots and not state.env_seen:
            start_census()
        state.roots[id(module)] = weakref.ref(module)
    forward_pre_hook(module, args)


def end_discovery() -> None:
    """At the first optimizer step every root has been called (acting, values, the loss's forward): each root's
    forward is timed by a RootForward of its own, and the global hooks go."""
    for handle in state.global_handles:
        handle.remove()
    state.global_handles = []
    for root in state.roots.values():
        module = root()
        if module is not None:
            time_root(module)
    state.discovering = False
    state.depth = 0


def time_root(module) -> None:
    """The root's forward replaced by a RootForward; where a module refuses the attribute (a scripted one), torch's
    hooks instead (which send its every call down torch's slower call path)."""
    try:
        module.forward = RootForward(module.__dict__.get("forward"), module.forward)
    except (AttributeError, TypeError, RuntimeError):
        module.register_forward_pre_hook(forward_pre_hook)
        module.register_forward_hook(forward_hook, always_call=True)  # always_call: torch 2.1, as the global's


class RootForward:
    """A root module's forward between the two marks the forward hooks would make, without torch's hooks: a module
    with hooks takes torch's slow call path, which cost a 64x64 MLP's rollout step 5 µs a call (docs/any-trainer.md).
    Pickled or copied, it is the forward it replaced (a module saved whole loads without rlperf)."""

    __slots__ = ("replaced", "forward", "__wrapped__")

    def __init__(self, replaced: Callable | None, forward: Callable):
        self.replaced = replaced  # the instance's own forward attribute, where it had one
        self.forward = forward
        self.__wrapped__ = forward  # inspect.signature reads the forward's

    def __call__(self, *args, **kwargs):
        clock = phases._clock
        if clock is None or state.depth or state.in_env or state.in_learn:  # not timed, or inside a timed call
            return self.forward(*args, **kwargs)
        if state.is_grad_enabled():
            forward_pre_hook(None, args)
            output = None
            try:
                output = self.forward(*args, **kwargs)
                return output
            finally:
                forward_hook(None, args, output)
        # acting, the call a rollout makes every step: forward_pre_hook's and forward_hook's path, inlined
        if state.learned and not state.env_seen:
            begin_next_epoch(clock)
        clock.enter("eval_forward")
        state.depth = 1
        try:
            return self.forward(*args, **kwargs)
        finally:
            state.depth = 0
            if clock.stack and clock.stack[-1] == "eval_forward":
                clock.exit("eval_forward")

    def __getattr__(self, name: str):
        return getattr(self.forward, name)

    def __reduce__(self):
        if self.replaced is not None:
            return operator.itemgetter(0), ((self.replaced,),)
        return types.MethodType, (self.forward.__func__, self.forward.__self__)


def forward_pre_hook(module, args) -> None:
    clock = phases._clock
    if clock is None:
        return
    state.depth += 1
    if state.depth > 1 or state.in_env or state.in_learn:
        return
    if not state.is_grad_enabled():
        if state.learned and not state.env_seen:  # no env step to begin an epoch: acting after an update does
            begin_next_epoch(clock)
        clock.enter("eval_forward")
    elif state.opened != "train_forward":
        # its delay waits until an output shows it trains (forward_hook): it may yet turn out to be acting
        clock.enter("train_forward", delay=False)
        state.opened, state.train_mark, state.train_has_grad = "train_forward", len(clock.marks) - 1, False


def forward_hook(module, args, output) -> None:
    clock = phases._clock
    if clock is None:
        return
    state.depth = max(0, state.depth - 1)
    if state.depth or state.in_env or not clock.stack:
        return
    top = clock.stack[-1]
    if top == "eval_forward":
        clock.exit("eval_forward")
    elif top == "train_forward" and state.opened == "train_forward":
        if carries_grad(output):
            if not state.train_has_grad:
                state.train_has_grad = True
                claim_train_misc(clock)
            clock.delay_once("train_forward")
        elif not state.train_has_grad:
            # a call with grad enabled whose outputs carry none (advantages, a frozen target): it acted
            clock.relabel(state.train_mark, "train_forward", "eval_forward")
            clock.exit("eval_forward")
            state.opened = None


def claim_train_misc(clock: phases.PhaseClock) -> None:
    """A forward with grad has begun training: what the loop did since the rollout's last env step or the last
    update step (advantages, flattening, minibatch sampling) is `train_misc`, no longer `eval_misc` or `other`."""
    marks = [mark for mark in (state.env_exit_mark, state.learn_exit_mark) if mark is not None]
    if not marks:
        return
    first = max(marks)
    clock.relabel(first, "eval_misc", "train_misc")
    clock.relabel(first, OTHER, "train_misc")
    clock.ground = OTHER


def carries_grad(output: Any) -> bool:
    """Whether a tensor of `output` carries grad: the call trains (its backward will begin `learn`)."""
    import torch

    pending = [output]
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            if item.requires_grad:
                return True
        elif isinstance(item, (tuple, list)):
            pending += item
        elif isinstance(item, dict):
            pending += item.values()
        elif hasattr(item, "values") and hasattr(item, "batch_size"):  # a TensorDict
            pending += item.values(include_nested=True, leaves_only=True)
    return False


def enter_learn() -> None:
    """Backward reached the training forward's output, or the optimizer steps: `learn` begins, once."""
    clock = phases._clock
    if clock is None or state.in_learn:
        return
    close_train_forward(clock)
    state.in_learn = True
    clock.enter("learn")


def timed_backward(backward: Callable) -> Callable:
    """torch.autograd.backward, which `Tensor.backward` calls: `learn` begins as the backward pass does."""
    @functools.wraps(backward)
    def begin_learn(*args, **kwargs):
        if phases._clock is not None and state.opened == "train_forward":
            enter_learn()
        return backward(*args, **kwargs)

    return begin_learn


def optimizer_pre_hook(optimizer, args, kwargs) -> None:
    enter_learn()


def optimizer_post_hook(optimizer, args, kwargs) -> None:
    clock = phases._clock
    if clock is None:
        return
    while clock.stack and clock.stack[-1] != "learn":  # a phase left open inside the step (none should be)
        clock.exit(clock.stack[-1])
    clock.ground = OTHER  # logging, callbacks, checkpoints; the next minibatch's preparation is claimed back
    if clock.stack:
        clock.exit("learn")
        state.learn_exit_mark = len(clock.marks) - 1
    state.in_learn = False
    state.learned = True
    state.opened = None
    stop_census()
    if state.discovering and state.global_handles and clock.warmup_epochs > 0 and state.depth == 0:
        end_discovery()


def attach_torch(torch_module) -> None:
    from torch.nn.modules import module as modules
    from torch.optim import optimizer as optimizers

    state.is_grad_enabled = torch_module.is_grad_enabled
    torch_module.autograd.backward = timed_backward(torch_module.autograd.backward)
    state.global_handles = [modules.register_module_forward_pre_hook(global_pre_hook),
                            modules.register_module_forward_hook(forward_hook, always_call=True)]
    optimizers.register_optimizer_step_pre_hook(optimizer_pre_hook)
    optimizers.register_optimizer_step_post_hook(optimizer_post_hook)
    state.hooks += list(TORCH_HOOKS)


# ---- the import watch -----------------------------------------------------------------------------------


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback once a watched module has been executed: the module is found by the finders after this
    one, and its loader's exec_module is followed by the callback."""

    def __init__(self, callbacks: dict[str, Callable[[Any], None]]):
        self.callbacks = callbacks

    def find_spec(self, name, path, target=None):
        callback = self.callbacks.get(name)
        if callback is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute = loader.exec_module

        def exec_module(module):
            execute(module)
            del self.callbacks[name]
            callback(module)

        loader.exec_module = exec_module
        return spec


def close_last_epoch() -> None:
    """At exit: the epoch in progress ends with its last update; with none since the last env step, a rollout
    cut short, it is dropped. Where no env step was seen, the summary says so."""
    clock = phases._clock
    stop_census()
    if clock is None or clock.finished:
        return
    if state.learned and state.learn_exit_mark is not None:
        clock.end_epoch(cut=state.learn_exit_mark)
    state.learned = False
    if not state.env_seen and clock.epochs:
        clock.missing = missing_env_line()
    clock.attached.update(attached_account())


def attached_account() -> dict[str, Any]:
    return {"hooks": list(state.hooks),
            "env_classes": sorted(f"{cls.__module__}.{cls.__qualname__}" for cls in state.types_stepped),
            "env_steps_named": [named.text for named in state.named], "root_modules": len(state.roots),
            "global_module_hooks_on": state.discovering,
            "phases": [name for name in PHASES
                       if name in ("env", "eval_forward", "eval_misc", "train_misc", "train_forward", "learn")]}


def install() -> None:
    """Starts the clock (the harness named a summary) and watches for torch's and the env libraries' imports,
    and for the classes of steps the user named."""
    clock = phases._clock
    if clock is None:
        return
    clock.writer = "attach"
    state.named = parse_named_steps(os.environ.get(ENV_STEP_VARIABLE, ""), os.environ.get(AGENTS_VARIABLE, ""))
    if state.named:
        watch_class_statements()
    callbacks: dict[str, Callable[[Any], None]] = {"torch": attach_torch}
    for steps in ENV_STEPS:
        callbacks[steps.module] = library_callback(steps)
    for name, callback in list(callbacks.items()):
        if name in sys.modules:  # imported before the bootstrap: attach now
            del callbacks[name]
            callback(sys.modules[name])
    sys.meta_path.insert(0, AfterImport(callbacks))
    atexit.register(close_last_epoch)  # runs before phases' own exit handler, which writes the summary
