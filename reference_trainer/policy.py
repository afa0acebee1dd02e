"""Encoder MLP -> LSTM -> actor and critic heads.

The rollout steps the recurrent cell once per environment step; training runs whole sequences through
the same cell weights, zeroing the state exactly where an episode started, so both see the same function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Policy(nn.Module):
    def __init__(self, obs_size: int, num_actions: int, hidden_size: int, use_lstm: bool, fused_cell: bool):
        super().__init__()
        self.hidden_size = hidden_size
        self.use_lstm = use_lstm
        # torch's fused cell kernel ignores CPU autocast and silently computes in fp32; the explicit gate
        # arithmetic below follows autocast, so it is used where a lower precision must really apply.
        self.fused_cell = fused_cell
        self.encoder = nn.Sequential(nn.Linear(obs_size, hidden_size), nn.ReLU())
        if use_lstm:
            self.cell = nn.LSTMCell(hidden_size, hidden_size)
        else:
            self.core = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.ReLU())
        self.actor = nn.Linear(hidden_size, num_actions)
        self.critic = nn.Linear(hidden_size, 1)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.orthogonal_(module.weight, 2**0.5)
                nn.init.zeros_(module.bias)
        nn.init.orthogonal_(self.actor.weight, 0.01)
        nn.init.orthogonal_(self.critic.weight, 1.0)

    def recur(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.fused_cell:
            return self.cell(x, (h, c))
        gates = F.linear(x, self.cell.weight_ih, self.cell.bias_ih) + F.linear(h, self.cell.weight_hh, self.cell.bias_hh)
        i, f, g, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h.to(gates.dtype), c

    def compute_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype the recurrent core really computes in under the current autocast state."""
        x = torch.zeros(1, self.hidden_size, device=device)
        with torch.no_grad():
            if not self.use_lstm:
                return self.core(x).dtype
            if self.fused_cell:
                return self.cell(x, (x, x))[0].dtype
            return F.linear(x, self.cell.weight_hh, self.cell.bias_hh).dtype

    def step(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor, start: torch.Tensor):
        """One rollout step. `start` is 1.0 where `obs` begins a new episode (the state is zeroed there)."""
        x = self.encoder(obs)
        if self.use_lstm:
            keep = (1.0 - start).unsqueeze(-1)
            h, c = self.recur(x, h * keep, c * keep)
            x = h
        else:
            x = self.core(x)
        return self.actor(x), self.critic(x).squeeze(-1), h, c

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor, starts: torch.Tensor):
        """Whole sequences `[T, B, ...]` from their initial states; returns logits `[T, B, A]`, values `[T, B]`."""
        x = self.encoder(obs)
        if self.use_lstm:
            keep = (1.0 - starts).unsqueeze(-1)
            hidden = []
            # unbind, not x[t]: each indexing's backward would write a zero-filled copy of all of x
            for x_t, keep_t in zip(x.unbind(0), keep.unbind(0)):
                h, c = self.recur(x_t, h * keep_t, c * keep_t)
                hidden.append(h)
            x = torch.stack(hidden)
        else:
            x = self.core(x)
        return self.actor(x), self.critic(x).squeeze(-1)
