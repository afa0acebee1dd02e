"""What `rlperf attach` installs in the command it runs: phases found without a line of the command changed.
docs/any-trainer.md says what is attributed, how, and what is not.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any

from rlperf import phases
from rlperf.summary import PHASES

# The env base classes attached, by the module that defines each: (module, class, methods, agents per step).
# TorchRL's collectors step through `step_and_maybe_reset`, which resets finished envs after the step: the reset
# is the env's time too.
ENV_BASES = (
    ("gymnasium.vector.vector_env", "VectorEnv", ("step",), "num_envs"),
    ("stable_baselines3.common.vec_env.base_vec_env", "VecEnv", ("step",), "num_envs"),
    ("torchrl.envs.common", "EnvBase", ("step", "step_and_maybe_reset"), "batch_size"),
)
# torch's global hooks that attach registers (each at or below the torch floor: rlperf/torch_api.py).
TORCH_HOOKS = (
    "torch.nn.modules.module.register_module_forward_pre_hook",
    "torch.nn.modules.module.register_module_forward_hook",
    "torch.optim.optimizer.register_optimizer_step_pre_hook",
    "torch.optim.optimizer.register_optimizer_step_post_hook",
    "torch.Tensor.register_hook",
)


class AttachState:
    """Where the hooks are: how deep in module calls, which forward phase they opened, whether an optimizer has
    stepped since the last env step, and the mark at which the last `learn` closed (where a last epoch ends)."""

    def __init__(self) -> None:
        self.depth = 0
        self.opened: str | None = None
        self.train_mark = 0  # the mark at which train_forward opened
        self.train_has_grad = False  # whether an output since then carries grad
        self.learned = False
        self.learn_exit_mark: int | None = None
        self.classes_stepped: set[str] = set()
        self.hooks: list[str] = []
        # Global module hooks make torch take its slow call path in every module: they run only until the first
        # optimizer step, finding the modules called outermost (the roots), which keep hooks of their own.
        self.discovering = True
        self.roots: set[int] = set()
        self.global_handles: list[Any] = []


state = AttachState()


def agents_per_step(env: Any, attribute: str) -> int:
    value = getattr(env, attribute, 1)
    if attribute == "batch_size":  # a torch.Size: its elements are the envs stepped at once
        count = 1
        for size in value:
            count *= int(size)
        return count
    return int(value)


def wrap_step(function: Callable, attribute: str) -> Callable:
    if getattr(function, "__rlperf_attached__", False):
        return function

    @functools.wraps(function)
    def step(self, *args, **kwargs):
        clock = phases._clock
        if clock is None or "env" in clock.stack:  # not timing, or a step inside an env's step
            return function(self, *args, **kwargs)
        if state.learned:  # the first env step after an update begins the next epoch
            state.learned = False
            clock.end_epoch()
        close_train_forward(clock)
        clock.enter("env")
        try:
            return function(self, *args, **kwargs)
        finally:
            clock.exit("env")
            clock.steps(agents_per_step(self, attribute))
            state.classes_stepped.add(f"{type(self).__module__}.{type(self).__qualname__}")

    step.__rlperf_attached__ = True
    return step


def attach_class(cls: type, methods: tuple[str, ...], attribute: str) -> None:
    """Wraps `cls`'s own `methods` (those it defines, not those it inherits, which are wrapped where defined)."""
    for method in methods:
        own = cls.__dict__.get(method)
        if callable(own):
            setattr(cls, method, wrap_step(own, attribute))


def attach_base(base: type, methods: tuple[str, ...], attribute: str) -> None:
    """Wraps the base's methods, its subclasses' that exist, and each subclass's defined from now on."""
    pending = [base]
    while pending:
        cls = pending.pop()
        attach_class(cls, methods, attribute)
        pending += cls.__subclasses__()
    original = base.__dict__.get("__init_subclass__")

    def __init_subclass__(cls, **kwargs):
        if original is not None:
            original.__get__(None, cls)(**kwargs)
        else:
            super(base, cls).__init_subclass__(**kwargs)
        attach_class(cls, methods, attribute)

    base.__init_subclass__ = classmethod(__init_subclass__)
    state.hooks += [f"{base.__module__}.{base.__qualname__}.{method}" for method in methods]


# ---- torch ----------------------------------------------------------------------------------------------


def close_train_forward(clock: phases.PhaseClock) -> None:
    if state.opened == "train_forward" and clock.stack and clock.stack[-1] == "train_forward":
        clock.exit("train_forward")
    if state.opened == "train_forward":
        state.opened = None


def global_pre_hook(module, args) -> None:
    if state.discovering:
        if state.depth == 0 and id(module) not in state.roots:
            state.roots.add(id(module))
            module.register_forward_pre_hook(root_pre_hook)
            module.register_forward_hook(root_hook, always_call=True)  # always_call: torch 2.1, as the global's
        forward_pre_hook(module, args)


def global_hook(module, args, output) -> None:
    if state.discovering:
        forward_hook(module, args, output)


def root_pre_hook(module, args) -> None:
    if not state.discovering:
        forward_pre_hook(module, args)


def root_hook(module, args, output) -> None:
    if not state.discovering:
        forward_hook(module, args, output)


def end_discovery() -> None:
    """At the first optimizer step every root has been called (acting, values, the loss's forward): the roots' own
    hooks take over from the global ones."""
    for handle in state.global_handles:
        handle.remove()
    state.global_handles = []
    state.discovering = False
    state.depth = 0


def forward_pre_hook(module, args) -> None:
    clock = phases._clock
    if clock is None:
        return
    state.depth += 1
    if state.depth > 1 or "env" in clock.stack or "learn" in clock.stack[-1:]:
        return
    if not grad_enabled():
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
    if state.depth:
        return
    if clock.stack and clock.stack[-1] == "eval_forward":
        clock.exit("eval_forward")
    elif state.opened == "train_forward" and clock.stack and clock.stack[-1] == "train_forward":
        if watch_backward(output):
            state.train_has_grad = True
            clock.delay_once("train_forward")
        elif not state.train_has_grad:
            # a call with grad enabled whose outputs carry none (advantages, a frozen target): it acted
            clock.relabel(state.train_mark, "train_forward", "eval_forward")
            clock.exit("eval_forward")
            state.opened = None


def grad_enabled() -> bool:
    import torch

    return torch.is_grad_enabled()


def watch_backward(output: Any) -> bool:
    """A hook on every tensor of `output` that carries grad: the first gradient to reach one begins `learn`.
    Whether there was one."""
    import torch

    pending, found = [output], False
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            if item.requires_grad:
                item.register_hook(backward_reached)
                found = True
        elif isinstance(item, (tuple, list)):
            pending += item
        elif isinstance(item, dict):
            pending += item.values()
        elif hasattr(item, "values") and hasattr(item, "batch_size"):  # a TensorDict
            pending += item.values(include_nested=True, leaves_only=True)
    return found


def enter_learn() -> None:
    """Backward reached the training forward's output, or the optimizer steps: `learn` begins, once."""
    clock = phases._clock
    if clock is None or "learn" in clock.stack:
        return
    close_train_forward(clock)
    clock.enter("learn")


def backward_reached(grad) -> None:
    enter_learn()


def optimizer_pre_hook(optimizer, args, kwargs) -> None:
    enter_learn()


def optimizer_post_hook(optimizer, args, kwargs) -> None:
    clock = phases._clock
    if clock is None:
        return
    while clock.stack and clock.stack[-1] != "learn":  # a phase left open inside the step (none should be)
        clock.exit(clock.stack[-1])
    if clock.stack:
        clock.exit("learn")
        state.learn_exit_mark = len(clock.marks) - 1
    state.learned = True
    state.opened = None
    if state.discovering and state.global_handles and clock.warmup_epochs > 0 and state.depth == 0:
        end_discovery()


def attach_torch(torch_module) -> None:
    from torch.nn.modules import module as modules
    from torch.optim import optimizer as optimizers

    state.global_handles = [modules.register_module_forward_pre_hook(global_pre_hook),
                            modules.register_module_forward_hook(global_hook, always_call=True)]
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


def env_callback(class_name: str, methods: tuple[str, ...], attribute: str) -> Callable[[Any], None]:
    def callback(module) -> None:
        attach_base(getattr(module, class_name), methods, attribute)

    return callback


def close_last_epoch() -> None:
    """At exit: the epoch in progress ends with its last update; with none since the last env step, a rollout
    cut short, it is dropped."""
    clock = phases._clock
    if clock is None or clock.finished:
        return
    if state.learned and state.learn_exit_mark is not None:
        clock.end_epoch(cut=state.learn_exit_mark)
    state.learned = False
    clock.attached.update(attached_account())


def attached_account() -> dict[str, Any]:
    return {"hooks": list(state.hooks), "env_classes": sorted(state.classes_stepped), "root_modules": len(state.roots),
            "global_module_hooks_on": state.discovering,
            "phases": [name for name in PHASES if name in ("env", "eval_forward", "train_forward", "learn")]}


def install() -> None:
    """Starts the clock (the harness named a summary) and watches for torch and the env libraries' imports."""
    clock = phases._clock
    if clock is None:
        return
    clock.writer = "attach"
    callbacks: dict[str, Callable[[Any], None]] = {"torch": attach_torch}
    for module_name, class_name, methods, attribute in ENV_BASES:
        callbacks[module_name] = env_callback(class_name, methods, attribute)
    for name, callback in list(callbacks.items()):
        if name in sys.modules:  # imported before the bootstrap: attach now
            del callbacks[name]
            callback(sys.modules[name])
    sys.meta_path.insert(0, AfterImport(callbacks))
    atexit.register(close_last_epoch)  # runs before phases' own exit handler, which writes the summary
