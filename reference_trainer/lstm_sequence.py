"""The LSTM over whole sequences with the state zeroed exactly at episode starts, as one autograd function
whose forward and backward are written out by hand, for the CPU.

At the trainer's shapes every CPU operator's fixed cost counts: a step here costs eleven operators forward and six
backward, and every tanh is 2 sigmoid(2a) - 1 (docs/trainer.md, "Recurrence").
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class GateWeights(NamedTuple):
    """The cell's weights as the written-out arithmetic reads them: transposed, the g rows doubled (their sigmoid
    gives tanh), the two biases summed."""

    input_t: torch.Tensor  # [I, 4H]
    recurrent_t: torch.Tensor  # [H, 4H]
    bias: torch.Tensor  # [4H]


def gate_scale(hidden_size: int, like: torch.Tensor) -> torch.Tensor:
    """`[4H, 1]`: 2 for the g rows, 1 for the others."""
    scale = like.new_ones(4 * hidden_size, 1)
    scale[2 * hidden_size:3 * hidden_size] = 2.0
    return scale


def gate_weights(scale: torch.Tensor, weight_ih: torch.Tensor, weight_hh: torch.Tensor, bias_ih: torch.Tensor,
                 bias_hh: torch.Tensor) -> GateWeights:
    return GateWeights((weight_ih * scale).t(), (weight_hh * scale).t(), (bias_ih + bias_hh).mul_(scale.squeeze(1)))


class Workspace:
    """The buffers of one sequence shape `[T, B]` x `H` units, and each step's views into them.

    The gates are kept as one `[B, 4H]` product a step, so the recurrent product is one matrix product. A gate's
    block is then a column slice, which an elementwise operator walks row by row (several times slower than a
    contiguous block at these sizes); kept gate by gate (`[4, T, B, H]`) the products become batched ones, which
    torch runs on a CPU as four small products each, and that measured slower still."""

    def __init__(self, T: int, B: int, H: int, like: torch.Tensor):
        self.shape = (T, B, H)
        self.lent, self.leases = False, 0
        self.gate_scale = gate_scale(H, like)
        # a Python number in an operator is made a tensor on each call (four more operators, about 1.7 us)
        self.one, self.two, self.four = like.new_tensor(1.0), like.new_tensor(2.0), like.new_tensor(4.0)
        self.keep = like.new_empty(T, B, 1)
        self.keep_rows = self.keep.view(T * B)
        self.reset = torch.empty(T, B, 1, dtype=torch.bool, device=like.device)  # where keep is 0
        # the input projection, then the recurrent product added, then the activations i, f, g, o in place; g's
        # sigmoid is kept, not its tanh
        self.gates = like.new_empty(T, B, 4 * H)
        self.h_in = like.new_empty(T, B, H)  # step t's carried h, masked
        # c[0] is the carried state, c[t + 1] step t's. A sequence zeroes the carried c at a start through f, set
        # to 0 there; the rollout's step masks it in c[0].
        self.c_all = like.new_empty(T + 1, B, H)
        self.c_prev, self.c = self.c_all[:-1], self.c_all[1:]
        self.tanh_c = like.new_empty(T, B, H)
        self.h = like.new_empty(T, B, H)
        # backward: the gates' local derivatives, then (in place, step by step) the gradients of their inputs
        self.grad_gates = like.new_empty(T, B, 4 * H)
        self.grad_h = like.new_empty(T, B, H)  # the outputs' gradients, then the carried h's added
        self.dc_dh = like.new_empty(T, B, H)  # d c_t / d h_t through h = o tanh(c): o (1 - tanh(c)^2)
        self.forget = like.new_empty(T, B, H)  # d c_t / d c_(t-1): f, zero where the state was reset
        self.grad_c = like.new_empty(B, H)
        self.grad_h_in = like.new_empty(B, H)

        def steps(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tensor.unbind(0)

        gates = self.gates.view(T, B, 4, H)
        grad_gates = self.grad_gates.view(T, B, 4, H)
        self.keep_t = steps(self.keep)
        self.gates_t, self.grad_gates_t = steps(self.gates), steps(self.grad_gates)
        self.i_t, self.f_t, self.g_t, self.o_t = (steps(gates[:, :, k]) for k in range(4))
        self.h_in_t, self.c_all_t = steps(self.h_in), steps(self.c_all)
        self.tanh_c_t, self.h_t = steps(self.tanh_c), steps(self.h)
        self.grad_ifg_t = steps(grad_gates[:, :, :3])  # [B, 3, H]: each times dc
        self.grad_o_t = steps(grad_gates[:, :, 3])  # times dh
        self.grad_h_t, self.dc_dh_t, self.forget_t = steps(self.grad_h), steps(self.dc_dh), steps(self.forget)
        self.grad_c_3 = self.grad_c.view(B, 1, H)
        # the four gate blocks over all steps, for the derivatives computed once a sequence
        self.i, self.f, self.g, self.o = (gates[:, :, k] for k in range(4))
        self.tanh_g = self.grad_h  # tanh(g), in a backward buffer before it holds the outputs' gradients
        self.local_i, self.local_f, self.local_g, self.local_o = (grad_gates[:, :, k] for k in range(4))


class Workspaces:
    """Workspaces lent one per sequence call: one is lent again only after the backward that needed it has run
    (or at once when no backward will), so a call never overwrites what another's backward still reads. The
    trainer's update calls, then differentiates, then calls again: it reuses one workspace for good. A second
    backward over one call (retain_graph) reads the same buffers, which the backward leaves as the forward
    wrote them, unless a later call was lent them meanwhile: then it refuses."""

    def __init__(self):
        self.free: dict[tuple, list[Workspace]] = {}

    def lend(self, T: int, B: int, H: int, like: torch.Tensor) -> Workspace:
        free = self.free.get((T, B, H, like.dtype, like.device))
        workspace = free.pop() if free else Workspace(T, B, H, like)
        workspace.lent = True
        workspace.leases += 1
        return workspace

    def give_back(self, workspace: Workspace) -> None:
        if workspace.lent:
            workspace.lent = False
            key = (*workspace.shape, workspace.gates.dtype, workspace.gates.device)
            self.free.setdefault(key, []).append(workspace)


def lstm_sequence(x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, starts: torch.Tensor, cell: torch.nn.LSTMCell,
                  workspaces: Workspaces) -> torch.Tensor:
    """nn.LSTMCell `cell` over features `[T, B, I]` from states `[B, H]`, the state zeroed where `starts [T, B]`
    is 1; returns h `[T, B, H]`. Inputs and weights of one dtype, autocast off."""
    T, B, _ = x.shape
    weights = (cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)
    workspace = workspaces.lend(T, B, cell.hidden_size, x)
    differentiated = torch.is_grad_enabled() and any(t.requires_grad for t in (x, h0, c0, *weights))
    h = ExactResetLSTM.apply(workspace, workspaces if differentiated else None, x, h0, c0, starts, *weights)
    if not differentiated:
        workspaces.give_back(workspace)
    return h


def lstm_step(x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, start: torch.Tensor, weights: GateWeights,
              workspaces: Workspaces, h_out: torch.Tensor | None = None,
              c_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rollout's one step of the cell over features `[B, I]` from states `[B, H]` zeroed where `start [B]` is 1,
    by the sequence's own arithmetic; writes the new h and c into `h_out` and `c_out` (which may be `h` and `c`
    themselves) or new tensors, and returns them. No gradient."""
    ws = workspaces.lend(1, x.shape[0], h.shape[-1], x)
    keep, h_in, c_in = ws.keep_t[0], ws.h_in_t[0], ws.c_all_t[0]
    torch.sub(ws.one, start, out=ws.keep_rows)
    torch.mul(h, keep, out=h_in)
    torch.mul(c, keep, out=c_in)
    gates = ws.gates_t[0]
    torch.addmm(weights.bias, x, weights.input_t, out=gates)
    torch.addmm(gates, h_in, weights.recurrent_t, out=gates)
    gates.sigmoid_()
    h_new = torch.empty_like(h) if h_out is None else h_out
    c_new = torch.empty_like(c) if c_out is None else c_out
    cell_arithmetic(ws, 0, c_in, c_new, h_new)
    workspaces.give_back(ws)
    return h_new, c_new


def cell_arithmetic(ws: Workspace, t: int, c_prev: torch.Tensor, c_new: torch.Tensor, h_new: torch.Tensor) -> None:
    """Step t's state from its gates' sigmoids: c = f c_prev + i tanh(g) = f c_prev - i + 2 i sigmoid(2g), then
    h = o tanh(c) with tanh(c) = 2 sigmoid(2c) - 1."""
    i, tanh_c = ws.i_t[t], ws.tanh_c_t[t]
    torch.mul(ws.f_t[t], c_prev, out=c_new)
    c_new.sub_(i)
    c_new.addcmul_(i, ws.g_t[t], value=2.0)
    torch.mul(c_new, ws.two, out=tanh_c).sigmoid_()
    tanh_c.mul_(ws.two).sub_(ws.one)
    torch.mul(ws.o_t[t], tanh_c, out=h_new)


def run_steps(ws: Workspace, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, starts: torch.Tensor,
              weights: GateWeights) -> None:
    """The forward over all steps, into `ws`: what the backward reads, and h. The carried c is zeroed at a start
    by its forget gate, set to 0 there before the steps (its pre-activation -inf), one operator a sequence where
    masking c is one a step."""
    torch.sub(ws.one, starts.unsqueeze(-1), out=ws.keep)
    torch.eq(ws.keep, 0.0, out=ws.reset)
    torch.addmm(weights.bias, x.flatten(0, 1), weights.input_t, out=ws.gates.view(-1, ws.gates.shape[-1]))
    ws.f.masked_fill_(ws.reset, float("-inf"))
    ws.c_all_t[0].copy_(c0)
    h = h0
    for t in range(x.shape[0]):
        h_in, gates = ws.h_in_t[t], ws.gates_t[t]
        torch.mul(h, ws.keep_t[t], out=h_in)
        # out= rather than addmm_: the same kernel, and an overload torch's FLOP counter sees (tests/test_roofline.py)
        torch.addmm(gates, h_in, weights.recurrent_t, out=gates)
        gates.sigmoid_()
        cell_arithmetic(ws, t, ws.c_all_t[t], ws.c_all_t[t + 1], ws.h_t[t])
        h = ws.h_t[t]


class ExactResetLSTM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ws: Workspace, workspaces: Workspaces | None, x: torch.Tensor, h0: torch.Tensor,
                c0: torch.Tensor, starts: torch.Tensor, weight_ih: torch.Tensor, weight_hh: torch.Tensor,
                bias_ih: torch.Tensor, bias_hh: torch.Tensor) -> torch.Tensor:
        run_steps(ws, x, h0, c0, starts, gate_weights(ws.gate_scale, weight_ih, weight_hh, bias_ih, bias_hh))
        if workspaces is not None:
            ctx.save_for_backward(x, weight_ih, weight_hh)
            ctx.ws, ctx.lease, ctx.workspaces = ws, ws.leases, workspaces
        return ws.h.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor):
        ws, workspaces = ctx.ws, ctx.workspaces
        if ws.leases != ctx.lease:
            raise RuntimeError("backward through an exact-reset LSTM call whose buffers a later call has reused: "
                               "differentiate a call again only before the next call")
        x, weight_ih, weight_hh = ctx.saved_tensors
        T, B, H = ws.shape
        # Each gate's local derivative times the factor its gradient has besides dc or dh, for all steps at once:
        # di = dc tanh(g) i(1-i), df = dc c_prev f(1-f), dg = dc i (1-tanh(g)^2) = dc i 4 s(1-s) with s the g
        # block's sigmoid(2g), do = dh tanh(c) o(1-o). f is 0 at a start, so df and the carried c's gradient are.
        torch.addcmul(ws.gates, ws.gates, ws.gates, value=-1.0, out=ws.grad_gates)  # s(1-s) for every gate
        torch.mul(ws.g, ws.two, out=ws.tanh_g).sub_(ws.one)
        ws.local_i.mul_(ws.tanh_g)
        ws.local_f.mul_(ws.c_prev)
        ws.local_g.mul_(ws.i).mul_(ws.four)
        ws.local_o.mul_(ws.tanh_c)
        torch.mul(ws.o, ws.tanh_c, out=ws.dc_dh)
        torch.addcmul(ws.o, ws.dc_dh, ws.tanh_c, value=-1.0, out=ws.dc_dh)
        torch.mul(ws.f, ws.keep, out=ws.forget)
        ws.grad_h.copy_(grad_out)
        ws.grad_c.zero_()
        grad_h0 = None
        for t in range(T - 1, -1, -1):
            grad_h = ws.grad_h_t[t]
            ws.grad_c.addcmul_(grad_h, ws.dc_dh_t[t])
            ws.grad_o_t[t].mul_(grad_h)
            ws.grad_ifg_t[t].mul_(ws.grad_c_3)
            ws.grad_c.mul_(ws.forget_t[t])
            torch.mm(ws.grad_gates_t[t], weight_hh, out=ws.grad_h_in)
            if t:
                ws.grad_h_t[t - 1].addcmul_(ws.grad_h_in, ws.keep_t[t])
            else:
                grad_h0 = ws.grad_h_in * ws.keep_t[0]
        grad_c0 = ws.grad_c.clone()
        grad_gates = ws.grad_gates.view(T * B, 4 * H)
        needs = ctx.needs_input_grad
        grad_x = torch.mm(grad_gates, weight_ih).view(x.shape) if needs[2] else None
        grad_weight_ih = torch.mm(grad_gates.t(), x.flatten(0, 1)) if needs[6] else None
        grad_weight_hh = torch.mm(grad_gates.t(), ws.h_in.view(T * B, H)) if needs[7] else None
        grad_bias = grad_gates.sum(0) if needs[8] or needs[9] else None
        workspaces.give_back(ws)
        return None, None, grad_x, grad_h0, grad_c0, None, grad_weight_ih, grad_weight_hh, grad_bias, grad_bias
