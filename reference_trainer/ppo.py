"""PPO's arithmetic, as CleanRL writes it: sampling an action, advantages (GAE) and their normalisation, the
clipped losses, and the two objects the trainer calls on its fixed buffers: one rollout step of the policy
and one minibatch update. Both read and write only tensors made once, so they can be compiled and captured
as CUDA graphs, and they hold no reference back to the trainer."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Callable

import torch
import torch.nn.functional as F

from reference_trainer.config import TrainConfig
from reference_trainer.policy import Policy, full_fp32_rnn

STAT_NAMES = ("policy", "value", "entropy", "approx_kl", "clipfrac")


class PolicyStep:
    """One rollout step of one group of environments, from `view.step_obs` to `view.step_action`. The
    first group (the one given `noise`) draws the step's noise for all, so the actions do not depend on how
    the environments are grouped."""

    def __init__(self, policy: Policy, view: SimpleNamespace, autocast: Callable[[], torch.autocast], lstm: bool,
                 noise: torch.Tensor | None, rank: int, world_size: int):
        self.policy, self.view, self.autocast, self.lstm = policy, view, autocast, lstm
        self.noise, self.rank, self.world_size = noise, rank, world_size

    def run(self) -> None:
        v = self.view
        with torch.no_grad():
            if self.noise is None:
                pass
            elif self.world_size == 1:  # the same draw as the ranks' below, in one operator
                self.noise.uniform_()
            else:
                n, num_actions = self.noise.shape
                self.noise.copy_(torch.rand(self.world_size, n, num_actions, device=self.noise.device)[self.rank])
            with self.autocast():
                logits, value, h_new, c_new = self.policy.step(v.step_obs, v.h, v.c, v.step_start, (v.h, v.c))
            logits = logits if logits.dtype == torch.float32 else logits.float()
            sample_actions(logits, v.step_noise, out=v.step_action)
            torch.gather(F.log_softmax(logits, -1), -1, v.step_action_column, out=v.step_logprob_column)
            v.step_value.copy_(value)
            if self.lstm and h_new is not v.h:  # the written-out step wrote them in place
                v.h.copy_(h_new)
                v.c.copy_(c_new)


def sample_actions(logits: torch.Tensor, noise: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Gumbel-max sampling, argmax(logits - log(-log u)), from uniform noise the caller drew (graph-safe, no host
    sync); the noise is used up in place."""
    gumbel = noise.clamp_(min=1e-20).log_().neg_().log_()
    return torch.argmax(torch.sub(logits, gumbel, out=gumbel), dim=-1, out=out)


def gae(rewards, values, dones, next_value, gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimates over `[T, N]`; `dones[t]` means the episode ended after step t."""
    # Every step's TD error and decay at once; the recursion left is one fused operator a step.
    alive = 1.0 - dones
    next_values = torch.cat([values[1:], next_value.unsqueeze(0)])
    deltas = torch.addcmul(rewards, next_values, alive, value=gamma).sub_(values)
    decays = alive.mul_(gamma * lam)
    advantages = torch.empty_like(rewards)
    last = torch.zeros_like(next_value)
    for delta, decay, advantage in zip(deltas.unbind(0)[::-1], decays.unbind(0)[::-1], advantages.unbind(0)[::-1]):
        last = torch.addcmul(delta, decay, last, out=advantage)
    return advantages


def normalized(advantages: torch.Tensor, valid: torch.Tensor | None, world_size: int,
               all_reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Advantages scaled to mean 0 and standard deviation 1 over every rank's batch; with `valid`, the
    statistics of the real transitions only, their count a device value (no host read)."""
    if valid is not None:
        weighted = advantages * valid
        moments = all_reduce_sum(torch.stack([weighted.sum(), (weighted * advantages).sum(), valid.sum()]))
        count = moments[2].clamp(min=1)
    else:
        moments = all_reduce_sum(torch.stack([advantages.sum(), (advantages**2).sum()]))
        count = advantages.numel() * world_size
    mean = moments[0] / count
    std = (moments[1] / count - mean**2).clamp(min=0).sqrt()
    return (advantages - mean) / (std + 1e-8)


class MinibatchUpdate:
    """The PPO update of one minibatch gathered into `batch`, in two halves (forward and loss, then backward
    and the optimizer step) so their phases are timed, and captured, apart."""

    def __init__(self, cfg: TrainConfig, model: torch.nn.Module, policy: Policy, optimizer: torch.optim.Optimizer,
                 scaler: torch.amp.GradScaler, autocast: Callable[[], torch.autocast], stats: torch.Tensor,
                 batch: dict[str, torch.Tensor]):
        self.cfg, self.model, self.policy, self.optimizer, self.scaler = cfg, model, policy, optimizer, scaler
        self.autocast, self.stats, self.batch = autocast, stats, batch
        self.loss: torch.Tensor | None = None

    def forward_loss(self) -> None:
        b = self.batch
        with self.autocast():
            logits, values = self.model(b["obs"], b["h0"], b["c0"], b["starts"])
            loss, stats = ppo_loss(self.cfg, logits, values, b["actions"], b["logprobs"], b["advantages"],
                                   b["returns"], b["values"], b.get("valid"))
        self.loss = loss
        self.stats.add_(stats)

    def backward_step(self) -> None:
        loss, self.loss = self.loss, None
        # cuDNN's LSTM backward reads the precision when it runs, as its forward did; only a forward through the
        # pieces ran it (an eager update on a GPU), and the setting stays off every other backward (see
        # full_fp32_rnn: a CNN's convolutions, inductor's reads of the old API while it compiles a backward)
        owed, self.policy.fp32_rnn_backward_owed = self.policy.fp32_rnn_backward_owed, False
        with full_fp32_rnn() if owed else contextlib.nullcontext():
            self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.max_grad_norm, foreach=True)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=False)
        self.policy.forget_step_weights()


def ppo_loss(cfg: TrainConfig, logits, values, actions, old_logprobs, advantages, returns, old_values, valid=None):
    """PPO's clipped losses; with `valid`, every mean is over the valid samples only."""
    if valid is None:
        mean = torch.mean
    else:
        count = valid.sum().clamp(min=1)

        def mean(x: torch.Tensor) -> torch.Tensor:
            return (x * valid).sum() / count

    logprobs_all = F.log_softmax(logits.float(), dim=-1)
    logprobs = logprobs_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    entropy = mean(-(logprobs_all.exp() * logprobs_all).sum(-1))
    log_ratio = logprobs - old_logprobs
    ratio = log_ratio.exp()
    gain = -advantages  # no gradient: one operator however often it is read
    policy_loss = mean(torch.max(gain * ratio, gain * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)))
    values = values.float()
    clipped = old_values + (values - old_values).clamp(-cfg.clip_coef, cfg.clip_coef)
    value_loss = 0.5 * mean(torch.max((values - returns) ** 2, (clipped - returns) ** 2))
    loss = policy_loss - cfg.ent_coef * entropy + cfg.vf_coef * value_loss
    with torch.no_grad():
        ratio_change = ratio - 1
        approx_kl = mean(ratio_change - log_ratio)
        clipfrac = mean((ratio_change.abs() > cfg.clip_coef).float())
        stats = torch.stack([policy_loss, value_loss, entropy, approx_kl, clipfrac]).detach()
    return loss, stats
