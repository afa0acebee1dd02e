"""The work of each phase per agent step, counted from the policy's shapes: the matrix products and
convolutions it runs (each a kernel of rlperf/peaks.py, with how many calls one agent step costs), their FLOPs,
and the bytes the phase must read and write at least, a lower bound (docs/machines.md#how-far-from-the-machines-limits).
"""

from __future__ import annotations

import math
from typing import Any

from reference_trainer.config import CNN_LAYERS, TrainConfig, image_layout
from rlperf.peaks import conv_output, kernel_flops

FLOAT_BYTES = 4
ACTION_BYTES = 8  # int64
# Adam's step: parameters, gradients and two moments read, parameters and moments written; backward reads
# the weights and writes the gradients.
LEARN_PASSES = 9


def count_work(cfg: TrainConfig, obs_shape: tuple[int, ...], obs_itemsize: int, num_actions: int, parameters: int,
               masked: bool, dtype: str, threads: int, written_out: bool = False) -> dict[str, Any]:
    """`summary["work"]`: per phase `flops`, `min_bytes` and `calls` per agent step, and its `kernels`;
    `written_out`: the LSTM runs as reference_trainer/lstm_sequence.py writes it out."""
    T, H = cfg.horizon, cfg.hidden_size
    group = cfg.envs_per_rank // cfg.env_groups
    S = cfg.minibatch_sequences_per_rank
    rows = T * S
    model = Model(cfg, obs_shape, num_actions, written_out)
    obs_bytes = math.prod(obs_shape) * obs_itemsize
    weights = parameters * FLOAT_BYTES
    state = 2 * H * FLOAT_BYTES if cfg.lstm else 0

    rollout_calls = (T + 1) / (T * group)  # the bootstrap step after the horizon is one call more per env
    minibatch_calls = cfg.update_epochs / rows
    eval_forward = phase(rollout_calls, model.forward(group, cell_rows=group, cell_steps=1),
                         weights * rollout_calls + (T + 1) / T * (obs_bytes + 2 * state)
                         + ACTION_BYTES + 2 * FLOAT_BYTES)
    minibatch = obs_bytes + (6 if masked else 5) * FLOAT_BYTES + ACTION_BYTES + state / T
    train_forward = phase(minibatch_calls, model.forward(rows, cell_rows=S, cell_steps=T),
                          weights * minibatch_calls + cfg.update_epochs * minibatch)
    learn = phase(minibatch_calls, model.backward(rows, cell_rows=S, cell_steps=T),
                  LEARN_PASSES * weights * minibatch_calls)
    return {"dtype": dtype, "threads": threads,
            "phases": {"eval_forward": eval_forward, "train_forward": train_forward, "learn": learn}}


def phase(calls: float, kernels: list[tuple[str, list[int], int]], min_bytes: float) -> dict[str, Any]:
    """A phase's figures per agent step from its kernels per call (op, shape, calls)."""
    listed = [{"op": op, "shape": shape, "per_step": count * calls} for op, shape, count in kernels]
    return {"calls": calls, "flops": sum(k["per_step"] * kernel_flops(k["op"], k["shape"]) for k in listed),
            "min_bytes": min_bytes, "kernels": listed}


class Model:
    """The policy's layers as kernels (reference_trainer/policy.py): encoder, core, heads."""

    def __init__(self, cfg: TrainConfig, obs_shape: tuple[int, ...], num_actions: int, written_out: bool = False):
        self.lstm, self.hidden = cfg.lstm, cfg.hidden_size
        self.written_out = written_out
        self.heads = (num_actions, 1)
        self.convs: list[list[int]] = []
        if cfg.encoder == "cnn":
            channels, height, width, _ = image_layout(obs_shape)
            widths = (cfg.cnn_channels, 2 * cfg.cnn_channels, 2 * cfg.cnn_channels)
            for (kernel, stride), out_channels in zip(CNN_LAYERS, widths):
                self.convs.append([channels, height, width, out_channels, kernel, stride])
                channels, (height, width) = out_channels, conv_output(height, width, kernel, stride)
            self.encoder_inputs = channels * height * width
        else:
            self.encoder_inputs = math.prod(obs_shape)

    def linears(self, rows: int) -> list[list[int]]:
        """The `[M, K, N]` of every linear layer run once over `rows` rows: encoder, MLP core, heads."""
        H = self.hidden
        core = [] if self.lstm else [[rows, H, H]]
        return [[rows, self.encoder_inputs, H], *core, *([rows, H, out] for out in self.heads)]

    def forward(self, rows: int, cell_rows: int, cell_steps: int) -> list[tuple[str, list[int], int]]:
        kernels = [("conv", [rows, *conv], 1) for conv in self.convs]
        kernels += [("linear", shape, 1) for shape in self.linears(rows)]
        if self.lstm and self.written_out:  # W_ih over every step at once, then W_hh step by step
            kernels += [("linear", [cell_rows * cell_steps, self.hidden, 4 * self.hidden], 1),
                        ("linear", [cell_rows, self.hidden, 4 * self.hidden], cell_steps)]
        elif self.lstm:
            kernels.append(("linear", [cell_rows, self.hidden, 4 * self.hidden], 2 * cell_steps))  # W_ih, W_hh
        return kernels

    def backward(self, rows: int, cell_rows: int, cell_steps: int) -> list[tuple[str, list[int], int]]:
        kernels = [("conv_backward", [rows, *conv, int(index > 0)], 1) for index, conv in enumerate(self.convs)]
        first = True  # the first layer's input is the observation: no gradient for it
        for m, k, n in self.linears(rows):
            kernels.append(("mm_tn", [n, m, k], 1))
            if not (first and not self.convs):
                kernels.append(("mm", [m, n, k], 1))
            first = False
        H, S = self.hidden, cell_rows
        if self.lstm and self.written_out:  # the state's gradient step by step; the rest over every step at once
            kernels += [("mm", [S, 4 * H, H], cell_steps), ("mm", [S * cell_steps, 4 * H, H], 1),
                        ("mm_tn", [4 * H, S * cell_steps, H], 2)]
        elif self.lstm:
            kernels += [("mm_tn", [4 * H, S, H], 2 * cell_steps),  # weight gradients of W_ih and W_hh
                        ("mm", [S, 4 * H, H], 2 * cell_steps - 1)]  # input gradients, but the first step's state
        return kernels
