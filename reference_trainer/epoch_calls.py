"""The rollout and the update as whole calls into the device (`graph_scope`), each capturable as one CUDA graph
replayed once an epoch, and the update pass both scopes run.

A whole call reads and writes only fixed buffers and device state, draws its random numbers from the device
generator, and never reads a device value on the host: the env's ring positions, the minibatch order and the
learning rate all live on the device. Like the policy step and the minibatch update, neither holds a reference
back to the trainer.
"""

from __future__ import annotations

from typing import Callable

import torch

from reference_trainer.config import TrainConfig
from reference_trainer.experience import Experience
from reference_trainer.ppo import gae, normalized


def nothing(*_: object) -> None:
    pass


def update_pass(cfg: TrainConfig, x: Experience, stats: torch.Tensor, forward: Callable[[], None],
                learn: Callable[[], None], device: torch.device, world_size: int = 1,
                all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
                beat: Callable[[], None] = nothing, enter: Callable[[str], None] = nothing) -> None:
    """Advantages, then `update_epochs` passes of minibatches of whole sequences; `enter(phase)` marks where each
    part begins (the trainer's timer), `beat` that the pass is progressing."""
    n, S = cfg.envs_per_rank, cfg.minibatch_sequences_per_rank
    enter("train_misc")
    advantages = gae(x.rewards, x.values, x.dones, x.step_value, cfg.gamma, cfg.gae_lambda)
    returns = advantages + x.values
    advantages = normalized(advantages, x.valid if x.masked else None, world_size, all_reduce_sum)
    sources = x.by_sequence(advantages, returns)
    stats.zero_()
    for _ in range(cfg.update_epochs):
        order = torch.randperm(n, device=device)
        for start in range(0, n, S):
            beat()
            enter("train_misc")
            x.gather_minibatch(sources, order[start:start + S])
            enter("train_forward")
            forward()
            enter("learn")
            learn()


def policy_step(view, step: Callable[[], None], t: int, enter: Callable[[str], None] = nothing) -> None:
    """One env group's policy step on observation t, its action, log-prob and value stored at t; `enter` marks
    where the stores begin (the trainer's eval_misc)."""
    view.step_obs.copy_(view.obs_at[t])
    view.step_start.copy_(view.starts_at[t])
    step()
    enter("eval_misc")
    view.actions_at[t].copy_(view.step_action)
    view.logprobs_at[t].copy_(view.step_logprob)
    view.values_at[t].copy_(view.step_value)


def device_env_step(view, env, t: int) -> None:
    """One group's env stepped on the device on the actions of step t, into the slots of step t + 1."""
    env.step_into(view.actions_at[t], view.obs_at[t + 1], view.rewards_at[t], view.dones_at[t])
    view.starts_at[t + 1].copy_(view.dones_at[t])


def bootstrap_value(x: Experience, steps: list[Callable[[], None]]) -> None:
    """The critic's value of observation T, left in `step_value` by the groups' whole policy steps.

    Those calls are the ones already compiled or captured, where a value-only forward would be one more program to
    compile and capture for one call an epoch. The recurrent state they advance is put back, since the next epoch's
    first step reads this observation again from the state before it; the noise they draw is kept, as the update's
    minibatch order and the next epoch's actions come from the generator after it."""
    T = x.obs.shape[0] - 1
    x.step_obs.copy_(x.obs[T])
    x.step_start.copy_(x.starts[T])
    saved_h, saved_c = x.h.clone(), x.c.clone()
    for step in steps:
        step()
    x.h.copy_(saved_h)
    x.c.copy_(saved_c)


class WholeRollout:
    """Every step of the rollout, of every env group, then the bootstrap value, as one call: for envs stepped on
    the device (`step_into`), whose positions live there too, so that nothing in the call needs the host.

    The trainer's own loop interleaves the groups to overlap host envs with the policy; here each step's policy
    calls come first and its env steps after, which computes the same: a group's env step reads only that group's
    actions, and the first group's policy step draws every group's noise before any of them reads it."""

    def __init__(self, experience: Experience, steps: list[Callable[[], None]], envs: list, horizon: int):
        self.experience, self.steps, self.envs, self.horizon = experience, steps, envs, horizon

    def __call__(self) -> None:
        x = self.experience
        x.start_rollout()
        for t in range(self.horizon):
            for view, step in zip(x.groups, self.steps):
                policy_step(view, step, t)
            for view, env in zip(x.groups, self.envs):
                device_env_step(view, env, t)
        bootstrap_value(x, self.steps)


class LearningRateSchedule:
    """Adam's learning rate annealed linearly to 0 over the run, as the trainer sets it after each epoch, read from
    a table on the device at the update's own count of epochs: a replayed update anneals it with no host write."""

    def __init__(self, cfg: TrainConfig, lr: torch.Tensor):
        self.lr = lr.view(1)
        after_epoch = [cfg.learning_rate * (1.0 - (epoch + 1) / cfg.num_epochs) for epoch in range(cfg.num_epochs)]
        self.table = torch.tensor(after_epoch, dtype=lr.dtype, device=lr.device)
        self.epoch = torch.zeros(1, dtype=torch.long, device=lr.device)

    def advance(self) -> None:
        torch.index_select(self.table, 0, self.epoch, out=self.lr)
        self.epoch.add_(1)


class WholeUpdate:
    """The update pass of every minibatch of every update epoch as one call, then the learning rate's step of the
    schedule when it anneals: `forward` and `learn` are the minibatch update's halves, eager or compiled."""

    def __init__(self, cfg: TrainConfig, experience: Experience, stats: torch.Tensor, forward: Callable[[], None],
                 learn: Callable[[], None], device: torch.device, schedule: LearningRateSchedule | None):
        self.cfg, self.experience, self.stats, self.device = cfg, experience, stats, device
        self.forward, self.learn, self.schedule = forward, learn, schedule

    def __call__(self) -> None:
        update_pass(self.cfg, self.experience, self.stats, self.forward, self.learn, self.device)
        if self.schedule is not None:
            self.schedule.advance()
