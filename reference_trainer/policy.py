"""Encoder (MLP or CNN) -> LSTM -> actor and critic heads.

The rollout steps the recurrent cell once per environment step; training runs whole sequences through
the same cell weights, zeroing the state exactly where an episode started, so both see the same function.
uint8 observations (pixels) arrive on the device as bytes and are scaled to [0, 1] here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from reference_trainer.config import CNN_LAYERS, cnn_feature_map, cnn_refusal, image_layout


class ConvEncoder(nn.Module):
    """The usual Atari encoder: three convolutions (CNN_LAYERS) of `channels`, 2x and 2x channels, then a
    linear layer to `hidden_size`. Reads images [M, C, H, W], or [M, H, W, C] when `image_shape` is laid
    out that way."""

    def __init__(self, image_shape: tuple[int, ...], hidden_size: int, channels: int):
        super().__init__()
        refusal = cnn_refusal(image_shape)
        if refusal:
            raise ValueError(refusal)
        in_channels, height, width, self.channels_last = image_layout(image_shape)
        layers: list[nn.Module] = []
        for (kernel, stride), out_channels in zip(CNN_LAYERS, (channels, 2 * channels, 2 * channels)):
            layers += [nn.Conv2d(in_channels, out_channels, kernel, stride), nn.ReLU()]
            in_channels = out_channels
        self.convs = nn.Sequential(*layers, nn.Flatten())
        out_height, out_width = cnn_feature_map(height, width)
        self.linear = nn.Linear(in_channels * out_height * out_width, hidden_size)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            images = images.permute(0, 3, 1, 2)
        return F.relu(self.linear(self.convs(images)))


class Policy(nn.Module):
    def __init__(self, obs_shape: int | tuple[int, ...], num_actions: int, hidden_size: int, use_lstm: bool,
                 fused_cell: bool, encoder: str = "mlp", cnn_channels: int = 32, pixels: bool = False):
        super().__init__()
        obs_shape = (obs_shape,) if isinstance(obs_shape, int) else tuple(obs_shape)
        self.obs_dims = len(obs_shape)
        self.hidden_size = hidden_size
        self.use_lstm = use_lstm
        # torch's fused cell kernel ignores CPU autocast and silently computes in fp32; the explicit gate
        # arithmetic below follows autocast, so it is used where a lower precision must really apply.
        self.fused_cell = fused_cell
        self.pixels = pixels
        self.conv = encoder == "cnn"
        if self.conv:
            self.encoder = ConvEncoder(obs_shape, hidden_size, cnn_channels)
        else:
            self.encoder = nn.Sequential(nn.Linear(math.prod(obs_shape), hidden_size), nn.ReLU())
        if use_lstm:
            self.cell = nn.LSTMCell(hidden_size, hidden_size)
        else:
            self.core = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.ReLU())
        self.actor = nn.Linear(hidden_size, num_actions)
        self.critic = nn.Linear(hidden_size, 1)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                nn.init.orthogonal_(module.weight, 2**0.5)
                nn.init.zeros_(module.bias)
        nn.init.orthogonal_(self.actor.weight, 0.01)
        nn.init.orthogonal_(self.critic.weight, 1.0)

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """Observations with any leading batch dimensions -> features `[*batch, hidden_size]`."""
        if self.pixels:
            obs = obs.float() * (1.0 / 255.0)
        batch = obs.shape[:obs.dim() - self.obs_dims]
        if self.conv:
            return self.encoder(obs.reshape(-1, *obs.shape[len(batch):])).reshape(*batch, self.hidden_size)
        if self.obs_dims > 1:
            obs = obs.flatten(len(batch))
        return self.encoder(obs)

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
        x = self.encode(obs)
        if self.use_lstm:
            keep = (1.0 - start).unsqueeze(-1)
            h, c = self.recur(x, h * keep, c * keep)
            x = h
        else:
            x = self.core(x)
        return self.actor(x), self.critic(x).squeeze(-1), h, c

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor, starts: torch.Tensor):
        """Whole sequences `[T, B, ...]` from their initial states; returns logits `[T, B, A]`, values `[T, B]`."""
        x = self.encode(obs)
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
