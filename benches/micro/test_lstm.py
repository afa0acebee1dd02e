"""The LSTM two ways: one LSTMCell step per time step (how a rollout runs it) against one fused nn.LSTM call
over the whole sequence, with shared weights so both compute the same thing; and training's sequences with
episode starts inside them, forward and backward, through the policy's cell loop (what a CUDA graph or
torch.compile holds), through its fused pieces (what eager training runs on a GPU) and through whatever the
policy runs eagerly on the device (the written-out sequence LSTM on a CPU)."""

from __future__ import annotations

import pytest
import torch

from reference_trainer.policy import Policy, full_fp32_rnn

INPUT, HIDDEN, HORIZON = 64, 128, 64


def paired(device):
    torch.manual_seed(0)
    fused = torch.nn.LSTM(INPUT, HIDDEN, batch_first=True).to(device)
    cell = torch.nn.LSTMCell(INPUT, HIDDEN).to(device)
    cell.weight_ih, cell.weight_hh = fused.weight_ih_l0, fused.weight_hh_l0
    cell.bias_ih, cell.bias_hh = fused.bias_ih_l0, fused.bias_hh_l0
    return fused, cell


def step_by_step(cell, sequence):
    h = c = sequence.new_zeros(sequence.shape[0], HIDDEN)
    outputs = []
    for t in range(sequence.shape[1]):
        h, c = cell(sequence[:, t], (h, c))
        outputs.append(h)
    return torch.stack(outputs, dim=1)


def whole_sequence(fused, sequence):
    return fused(sequence)[0]


@pytest.mark.parametrize("batch", [64, 512])
def test_lstm_cell_steps(timed, device, batch):
    fused, cell = paired(device)
    sequence = torch.randn(batch, HORIZON, INPUT, device=device)
    with torch.no_grad():
        out = timed(step_by_step, cell, sequence)
        with full_fp32_rnn():
            reference = whole_sequence(fused, sequence)
        torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("batch", [64, 512])
def test_lstm_fused_sequence(timed, device, batch):
    fused, _ = paired(device)
    sequence = torch.randn(batch, HORIZON, INPUT, device=device)
    with torch.no_grad():
        assert timed(whole_sequence, fused, sequence).shape == (batch, HORIZON, HIDDEN)


@pytest.mark.parametrize("batch", [1024, 8192])
def test_lstm_cell_single_rollout_step(timed, device, batch):
    _, cell = paired(device)
    observation = torch.randn(batch, INPUT, device=device)
    state = (torch.zeros(batch, HIDDEN, device=device), torch.zeros(batch, HIDDEN, device=device))
    with torch.no_grad():
        h, _ = timed(cell, observation, state)
    assert h.shape == (batch, HIDDEN)


def training_sequences(device, batch):
    """A minibatch as the synthetic env's 128-step episodes leave it: one start in half the sequences."""
    torch.manual_seed(0)
    policy = Policy(INPUT, 4, HIDDEN, use_lstm=True, fused_cell=True).to(device)
    x = torch.randn(HORIZON, batch, HIDDEN, device=device, requires_grad=True)
    h0, c0 = torch.randn(batch, HIDDEN, device=device), torch.randn(batch, HIDDEN, device=device)
    starts = torch.zeros(HORIZON, batch, device=device)
    half = torch.arange(batch // 2, device=device)
    starts[torch.randint(1, HORIZON, (batch // 2,), device=device), half] = 1.0
    return policy, x, h0, c0, starts


def forward_backward(sequence, x, h0, c0, starts):
    hidden = sequence(x, h0, c0, starts)
    hidden.sum().backward()
    return hidden.detach()


@pytest.mark.parametrize("formulation", ["stepped_sequence", "pieced_sequence", "recurrent_sequence"])
@pytest.mark.parametrize("batch", [128, 512])
def test_lstm_training_sequences_with_starts(timed, device, batch, formulation):
    policy, x, h0, c0, starts = training_sequences(device, batch)
    with full_fp32_rnn():
        hidden = timed(forward_backward, getattr(policy, formulation), x, h0, c0, starts)
        with torch.no_grad():
            reference = policy.stepped_sequence(x, h0, c0, starts)
    torch.testing.assert_close(hidden, reference, rtol=1e-4, atol=1e-4)
