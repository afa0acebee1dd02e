"""The CPU's exact-reset sequence LSTM (reference_trainer/lstm_sequence.py), a hand-written forward and
backward, against the cell loop it stands in for: its gradients against finite differences in float64, its
outputs and every gradient against stepping nn.LSTMCell in float32, no state crossing a start, and a trainer
run's losses against the same run stepping the cell."""

from __future__ import annotations

import pytest
import torch
from test_lstm_pieces import ACTIONS, B, HIDDEN, OBS, T, gradients, reference_forward, starts_where
from test_trainer import small

from reference_trainer.lstm_sequence import Workspaces, lstm_sequence
from reference_trainer.policy import Policy
from reference_trainer.train import train


def mixed_starts(T: int, B: int) -> torch.Tensor:
    """Starts at the first step, the last, two in a row, every step and none, one sequence each."""
    starts = torch.zeros(T, B, dtype=torch.float64)
    starts[0, 0] = starts[-1, 1] = 1.0
    starts[2:4, 2] = 1.0
    starts[:, 3] = 1.0
    starts[0, 4] = starts[T // 2, 4] = starts[-1, 4] = 1.0
    return starts


def test_the_backward_is_the_forwards_derivative():
    torch.manual_seed(0)
    T, B, I, H = 6, 6, 3, 4
    cell = torch.nn.LSTMCell(I, H).double()
    inputs = [torch.randn(T, B, I, dtype=torch.float64), torch.randn(B, H, dtype=torch.float64),
              torch.randn(B, H, dtype=torch.float64)]
    starts, workspaces = mixed_starts(T, B), Workspaces()

    def sequence(x, h0, c0, *weights):
        return lstm_sequence(x, h0, c0, starts, cell, workspaces)

    assert torch.autograd.gradcheck(sequence, [t.requires_grad_() for t in inputs] + list(cell.parameters()))


@pytest.mark.parametrize("kind", ["random", "first", "last", "every", "none", "mixed"])
def test_the_cpu_sequence_gives_the_cell_loops_outputs_and_gradients(kind):
    torch.manual_seed(0)
    policy = Policy(OBS, ACTIONS, HIDDEN, use_lstm=True, fused_cell=True)
    obs, h0, c0 = torch.randn(T, B, OBS), torch.randn(B, HIDDEN), torch.randn(B, HIDDEN)
    starts = starts_where(kind, torch.Generator().manual_seed(1))
    sequence = gradients(policy, Policy.forward, obs, h0, c0, starts)
    assert policy.sequence_workspaces.free, "Policy.forward on a CPU in float32 must run the exact-reset sequence"
    loop = gradients(policy, reference_forward, obs, h0, c0, starts)
    for got, expected in zip(sequence[:4], loop[:4]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert sequence[4].keys() == loop[4].keys()
    for name in loop[4]:
        torch.testing.assert_close(sequence[4][name], loop[4][name], rtol=1e-4, atol=1e-6, msg=name)
    if kind == "every":  # no state is carried in, so none can have a gradient
        assert not sequence[2].any() and not sequence[3].any()


def test_the_rollout_step_is_the_cells_step_with_the_sequences_arithmetic():
    torch.manual_seed(5)
    policy = Policy(OBS, ACTIONS, HIDDEN, use_lstm=True, fused_cell=True)
    obs, h, c = torch.randn(B, OBS), 3 * torch.randn(B, HIDDEN), 3 * torch.randn(B, HIDDEN)
    start = (torch.arange(B) % 3 == 0).float()
    with torch.no_grad():
        logits, value, h_new, c_new = policy.step(obs, h, c, start)
        keep = (1.0 - start).unsqueeze(-1)
        h_cell, c_cell = policy.cell(policy.encode(obs), (h * keep, c * keep))
    assert (1, B, HIDDEN, torch.float32, torch.device("cpu")) in policy.sequence_workspaces.free
    torch.testing.assert_close(h_new, h_cell, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c_new, c_cell, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits, policy.actor(h_cell), rtol=1e-5, atol=1e-6)
    with torch.no_grad():  # a start zeroes the state exactly: what was carried in does not count
        restarted = policy.step(obs, -h, 2 * c, torch.ones(B))
        assert torch.equal(restarted[2], policy.step(obs, h, c, torch.ones(B))[2])


def test_no_state_crosses_a_start():
    # Everything before a start changed (the carried state, a large one, and the earlier inputs): the outputs
    # from the start on must not move by a single bit, nor any gradient reach what came before.
    torch.manual_seed(2)
    cell, workspaces = torch.nn.LSTMCell(HIDDEN, HIDDEN), Workspaces()
    starts = mixed_starts(T, B).float()
    x, h0, c0 = torch.randn(T, B, HIDDEN), 3 * torch.randn(B, HIDDEN), 3 * torch.randn(B, HIDDEN)
    x_before_changed = torch.where(torch.arange(T)[:, None, None] < T // 2, 5 * torch.randn(T, B, HIDDEN), x)
    with torch.no_grad():
        first = lstm_sequence(x, h0, c0, starts, cell, workspaces)
        other_state = lstm_sequence(x, -h0, 2 * c0, starts, cell, workspaces)
        other_past = lstm_sequence(x_before_changed, -h0, 2 * c0, starts, cell, workspaces)
    assert torch.equal(first[:, [0, 3, 4]], other_state[:, [0, 3, 4]])  # each starts at step 0
    assert not torch.equal(first[:, 5], other_state[:, 5])  # no start: the carried state counts
    assert torch.equal(first[T // 2:, [3, 4]], other_past[T // 2:, [3, 4]])  # each starts at step T // 2
    x, h0, c0 = (t.clone().requires_grad_() for t in (x, h0, c0))
    lstm_sequence(x, h0, c0, starts, cell, workspaces)[T // 2:, 4].sum().backward()
    assert not x.grad[:T // 2, 4].any() and not h0.grad[4].any() and not c0.grad[4].any()
    assert x.grad[T // 2:, 4].any()


def test_calls_differentiated_out_of_order_keep_their_own_buffers():
    torch.manual_seed(3)
    cell, workspaces = torch.nn.LSTMCell(HIDDEN, HIDDEN), Workspaces()
    starts = starts_where("random", torch.Generator().manual_seed(4))
    xs = [torch.randn(T, B, HIDDEN, requires_grad=True) for _ in range(2)]
    h0, c0 = torch.randn(B, HIDDEN), torch.randn(B, HIDDEN)
    first, second = (lstm_sequence(x, h0, c0, starts, cell, workspaces) for x in xs)
    second.sum().backward()
    first.sum().backward(retain_graph=True)
    once = xs[0].grad.clone()
    first.sum().backward(retain_graph=True)  # again, its buffers not lent since: the same gradient
    torch.testing.assert_close(xs[0].grad, 2 * once)
    expected = torch.autograd.grad(reference_sequence_of(cell, xs[0], h0, c0, starts).sum(), xs[0])[0]
    torch.testing.assert_close(once, expected, rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        lstm_sequence(xs[1], h0, c0, starts, cell, workspaces)  # lent the first call's buffers again
    with pytest.raises(RuntimeError, match="reused"):
        first.sum().backward()


def reference_sequence_of(cell: torch.nn.LSTMCell, x, h, c, starts):
    hidden = []
    for x_t, start in zip(x, starts):
        keep = (1.0 - start).unsqueeze(-1)
        h, c = cell(x_t, (h * keep, c * keep))
        hidden.append(h)
    return torch.stack(hidden)


def test_a_trainer_run_has_the_cell_loops_losses(monkeypatch):
    # the memory env ends episodes inside the sequences, so the run crosses starts in every minibatch
    cfg = small(env="memory", total_steps=16 * 8 * 8)
    sequence = train(cfg)
    monkeypatch.setattr(Policy, "recurrent_sequence", Policy.stepped_sequence)
    loop = train(cfg)
    assert sequence["episodes"] == loop["episodes"] > 0
    for got, expected in zip(sequence["epochs"], loop["epochs"], strict=True):
        assert got["losses"] == pytest.approx(expected["losses"], rel=1e-4, abs=1e-6), got["epoch"]
