"""Generalized advantage estimation over a [envs, horizon] rollout: the reverse scan over time that every
PPO trainer runs once per epoch, in torch on the rollout's device and in numpy on the host."""

from __future__ import annotations

import numpy as np
import pytest
import torch

GAMMA, LAMBDA = 0.99, 0.95


def gae_torch(rewards, values, dones, next_value):
    horizon = rewards.shape[1]
    advantages = torch.empty_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(horizon)):
        following = next_value if t == horizon - 1 else values[:, t + 1]
        live = 1.0 - dones[:, t]
        delta = rewards[:, t] + GAMMA * following * live - values[:, t]
        last = delta + GAMMA * LAMBDA * live * last
        advantages[:, t] = last
    return advantages


def gae_numpy(rewards, values, dones, next_value):
    horizon = rewards.shape[1]
    advantages = np.empty_like(rewards)
    last = np.zeros_like(next_value)
    following_values = np.concatenate([values[:, 1:], next_value[:, None]], axis=1)
    live = 1.0 - dones
    deltas = rewards + GAMMA * following_values * live - values
    for t in reversed(range(horizon)):
        last = deltas[:, t] + GAMMA * LAMBDA * live[:, t] * last
        advantages[:, t] = last
    return advantages


def rollout(envs, horizon, device):
    generator = torch.Generator().manual_seed(0)
    rewards = torch.randn(envs, horizon, generator=generator)
    values = torch.randn(envs, horizon, generator=generator)
    dones = (torch.rand(envs, horizon, generator=generator) < 0.02).float()
    next_value = torch.randn(envs, generator=generator)
    return [tensor.to(device) for tensor in (rewards, values, dones, next_value)]


@pytest.mark.parametrize("envs, horizon", [(1024, 64), (8192, 64)])
def test_gae_torch(timed, device, envs, horizon):
    advantages = timed(gae_torch, *rollout(envs, horizon, device))
    assert advantages.shape == (envs, horizon) and torch.isfinite(advantages).all()


@pytest.mark.parametrize("envs, horizon", [(1024, 64), (8192, 64)])
def test_gae_numpy(benchmark, envs, horizon):
    arrays = [tensor.numpy() for tensor in rollout(envs, horizon, "cpu")]
    advantages = benchmark(gae_numpy, *arrays)
    expected = gae_torch(*(torch.from_numpy(a) for a in arrays)).numpy()
    np.testing.assert_allclose(advantages, expected, rtol=1e-5, atol=1e-5)
