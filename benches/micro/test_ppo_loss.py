"""One PPO minibatch update's core: an LSTM policy's forward over whole sequences, the clipped surrogate,
value and entropy loss, and the backward pass, which is the train phase's largest cost."""

from __future__ import annotations

import pytest
import torch

OBS, ACTIONS, HIDDEN, HORIZON = 32, 4, 128, 16
CLIP, VF_COEF, ENT_COEF = 0.2, 0.5, 0.01


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(OBS, HIDDEN)
        self.lstm = torch.nn.LSTM(HIDDEN, HIDDEN, batch_first=True)
        self.actor = torch.nn.Linear(HIDDEN, ACTIONS)
        self.critic = torch.nn.Linear(HIDDEN, 1)

    def forward(self, observations):
        hidden, _ = self.lstm(torch.relu(self.encoder(observations)))
        return self.actor(hidden), self.critic(hidden).squeeze(-1)


def minibatch(sequences, device):
    generator = torch.Generator().manual_seed(0)
    shape = (sequences, HORIZON)
    batch = {
        "observations": torch.randn(*shape, OBS, generator=generator),
        "actions": torch.randint(0, ACTIONS, shape, generator=generator),
        "old_logprobs": torch.full(shape, -1.386),
        "advantages": torch.randn(*shape, generator=generator),
        "returns": torch.randn(*shape, generator=generator),
    }
    return {name: tensor.to(device) for name, tensor in batch.items()}


def loss_and_backward(policy, batch):
    policy.zero_grad(set_to_none=True)
    logits, values = policy(batch["observations"])
    distribution = torch.distributions.Categorical(logits=logits)
    ratio = (distribution.log_prob(batch["actions"]) - batch["old_logprobs"]).exp()
    advantages = (batch["advantages"] - batch["advantages"].mean()) / (batch["advantages"].std() + 1e-8)
    policy_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - CLIP, 1 + CLIP)).mean()
    value_loss = 0.5 * (values - batch["returns"]).pow(2).mean()
    loss = policy_loss + VF_COEF * value_loss - ENT_COEF * distribution.entropy().mean()
    loss.backward()
    return loss


@pytest.mark.parametrize("minibatch_steps", [512, 4096])
def test_ppo_loss_with_backward(timed, device, minibatch_steps):
    torch.manual_seed(0)
    policy = Policy().to(device)
    loss = timed(loss_and_backward, policy, minibatch(minibatch_steps // HORIZON, device))
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in policy.parameters())
