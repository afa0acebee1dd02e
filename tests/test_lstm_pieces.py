"""Training's fused sequence LSTM against the cell loop it replaced: each sequence cut at its episode starts
into pieces run by nn.LSTM from their true states must give the same outputs and the same gradients as
stepping the rollout's cell over the sequence and zeroing the state at every start."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from reference_trainer.config import TrainConfig
from reference_trainer.devices import Autocast
from reference_trainer.policy import EpisodePieces, Policy, full_fp32_rnn
from reference_trainer.train import build_policy
from rlperf.torch_api import torch_has

T, B, OBS, HIDDEN, ACTIONS = 16, 9, 5, 12, 3


def reference_sequence(policy: Policy, x, h, c, starts):
    """The rollout's function over a sequence: one cell step per time step, the state zeroed at each start."""
    hidden = []
    for t in range(x.shape[0]):
        keep = (1.0 - starts[t]).unsqueeze(-1)
        h, c = policy.cell(x[t], (h * keep, c * keep))
        hidden.append(h)
    return torch.stack(hidden)


def reference_forward(policy: Policy, obs, h, c, starts):
    x = reference_sequence(policy, policy.encode(obs), h, c, starts)
    return policy.actor(x), policy.critic(x).squeeze(-1)


def pieced_forward(policy: Policy, obs, h, c, starts):
    # what Policy.forward runs on a GPU; called directly, as a CPU's forward runs the exact-reset sequence
    x = policy.pieced_sequence(policy.encode(obs), h, c, starts)
    return policy.actor(x), policy.critic(x).squeeze(-1)


def starts_where(kind: str, generator: torch.Generator) -> torch.Tensor:
    starts = torch.zeros(T, B)
    if kind == "random":
        starts = (torch.rand(T, B, generator=generator) < 0.25).float()
    elif kind == "first":
        starts[0] = 1.0
    elif kind == "last":
        starts[-1] = 1.0
    elif kind == "every":
        starts[:] = 1.0
    elif kind == "mixed":  # one sequence of each kind side by side, and two starts in a row
        starts[0, 0] = starts[-1, 1] = 1.0
        starts[:, 2] = 1.0
        starts[5:7, 3] = 1.0
        starts[1, 4] = starts[T // 2, 4] = 1.0
    return starts


def loss_of(logits, values):
    # every output reaches the loss with its own weight, so a wrong or misplaced output changes a gradient
    weights = torch.linspace(0.5, 1.5, logits.numel(), device=logits.device).view_as(logits)
    return (logits * weights).sum() + (values**2).sum()


def gradients(policy: Policy, forward, obs, h0, c0, starts):
    h, c = h0.clone().requires_grad_(), c0.clone().requires_grad_()
    policy.zero_grad()
    logits, values = forward(policy, obs, h, c, starts)
    with full_fp32_rnn():  # as the trainer's update runs its backward
        loss_of(logits, values).backward()
    return (logits.detach(), values.detach(), h.grad, c.grad,
            {name: p.grad.clone() for name, p in policy.named_parameters()})


@pytest.mark.parametrize("kind", ["random", "first", "last", "every", "none", "mixed"])
def test_fused_pieces_give_the_cell_loops_outputs_and_gradients(kind):
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    policy = Policy(OBS, ACTIONS, HIDDEN, use_lstm=True, fused_cell=True)
    obs, h0, c0 = torch.randn(T, B, OBS), torch.randn(B, HIDDEN), torch.randn(B, HIDDEN)
    starts = starts_where(kind, generator)
    fused = gradients(policy, pieced_forward, obs, h0, c0, starts)
    loop = gradients(policy, reference_forward, obs, h0, c0, starts)
    for got, expected in zip(fused[:4], loop[:4]):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert fused[4].keys() == loop[4].keys()
    for name in loop[4]:
        torch.testing.assert_close(fused[4][name], loop[4][name], rtol=1e-4, atol=1e-6, msg=name)
    if kind == "every":  # no state is carried in, so none can have a gradient
        assert not fused[2].any() and not fused[3].any()


def test_the_graph_safe_cell_loop_is_the_same_function():
    # what CUDA graph capture and torch.compile run instead of the fused call
    torch.manual_seed(2)
    policy = Policy(OBS, ACTIONS, HIDDEN, use_lstm=True, fused_cell=True)
    x, h0, c0 = torch.randn(T, B, HIDDEN), torch.randn(B, HIDDEN), torch.randn(B, HIDDEN)
    starts = starts_where("mixed", torch.Generator().manual_seed(0))
    torch.testing.assert_close(policy.stepped_sequence(x, h0, c0, starts), policy.pieced_sequence(x, h0, c0, starts),
                               rtol=1e-5, atol=1e-6)


def test_the_layout_places_every_step_once_and_packs_longest_first():
    starts = starts_where("random", torch.Generator().manual_seed(3))
    starts[:, 0] = 0.0
    starts[[3, 4, 10], 0] = 1.0  # pieces of 3, 1, 6 and 6 steps
    pieces = EpisodePieces(starts)
    batch_sizes = pieces.batch_sizes
    assert int(batch_sizes.sum()) == T * B
    assert bool((batch_sizes[:-1] >= batch_sizes[1:]).all())
    assert torch.equal(pieces.packed_index().sort().values, torch.arange(T * B))
    count = int(batch_sizes[0])
    assert count == B + int(starts[1:].sum())
    firsts = set(pieces.order[:count].tolist())
    assert {t * B for t in (0, 3, 4, 10)} <= firsts  # sequence 0's pieces begin where its episodes do


def test_the_sequence_lstm_is_the_cells_parameters():
    policy = Policy(OBS, ACTIONS, HIDDEN, use_lstm=True, fused_cell=True)
    for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
        assert getattr(policy.lstm, f"{name}_l0") is getattr(policy.cell, name)
    # the optimizer sees each weight once, and the policy starts from the same weights as before it had an LSTM
    torch.manual_seed(4)
    cell_only = [torch.nn.Linear(OBS, HIDDEN), torch.nn.LSTMCell(HIDDEN, HIDDEN)]
    torch.manual_seed(4)
    policy = Policy(OBS, ACTIONS, HIDDEN, use_lstm=True, fused_cell=True)
    assert len(list(policy.parameters())) == 10
    torch.testing.assert_close(policy.cell.weight_hh, cell_only[1].weight_hh, rtol=0, atol=0)


@pytest.mark.skipif(not torch_has("torch.backends.cudnn.rnn.fp32_precision"),
                    reason="needs torch 2.9's per-operation TF32 switch")
def test_the_pieces_run_cudnns_lstm_in_full_float32_as_the_rollout_s_cell_computes(monkeypatch):
    # cuDNN computes float32 in TF32 by default on Ampere and newer GPUs: training would then not compute the
    # function the rollout's float32 cell computed
    def rnn_precision():
        return getattr(torch.backends.cudnn.rnn, "fp32_precision", None)

    precision_inside = []
    lstm_forward = torch.nn.LSTM.forward

    def recording(self, *args, **kwargs):
        precision_inside.append(rnn_precision())
        return lstm_forward(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.LSTM, "forward", recording)
    policy = Policy(OBS, ACTIONS, HIDDEN, use_lstm=True, fused_cell=True)
    before = rnn_precision()
    x, h0, c0 = torch.randn(T, B, HIDDEN), torch.randn(B, HIDDEN), torch.randn(B, HIDDEN)
    policy.pieced_sequence(x, h0, c0, starts_where("random", torch.Generator().manual_seed(3)))
    assert precision_inside == ["ieee"]
    assert rnn_precision() == before


def test_the_update_runs_cudnns_lstm_backward_in_full_float32_too(monkeypatch):
    # cuDNN reads the precision each time it runs, and the LSTM's backward runs in the update's backward pass,
    # long after its forward left full_fp32_rnn: the trainer's update, through the pieces as a GPU trains
    from reference_trainer.config import TrainConfig, validate
    from reference_trainer.train import train

    def rnn_precision():
        return getattr(torch.backends.cudnn.rnn, "fp32_precision", None)

    seen: dict[str, list] = {"forward": [], "backward": []}
    lstm_forward = torch.nn.LSTM.forward

    def recording(self, *args, **kwargs):
        seen["forward"].append(rnn_precision())
        out, state = lstm_forward(self, *args, **kwargs)
        if out.data.requires_grad:  # the gradient reaches the LSTM's output just before its backward runs
            out.data.register_hook(lambda grad: seen["backward"].append(rnn_precision()))
        return out, state

    monkeypatch.setattr(torch.nn.LSTM, "forward", recording)
    monkeypatch.setattr(Policy, "recurrent_sequence", Policy.pieced_sequence)
    train(validate(TrainConfig(env="memory", device="cpu", threads=1, num_envs=8, horizon=8, minibatch_size=32,
                               hidden_size=16, total_steps=8 * 8 * 2)))
    assert seen["backward"] and set(seen["backward"]) == set(seen["forward"]) == {"ieee"}
    assert rnn_precision() != "ieee"


def test_an_update_whose_forward_stepped_the_cell_leaves_cudnns_precision_alone(monkeypatch):
    # Graphed and compiled updates step the cell: no cuDNN LSTM runs, and the setting would only reach the other
    # cuDNN operations (before torch 2.9 a CNN's convolutions run their backward in full float32 under it; from
    # 2.9 a compiler that reads the old API while it builds the backward is refused under it)
    import reference_trainer.ppo as ppo
    from reference_trainer.config import TrainConfig, validate
    from reference_trainer.train import train

    entered = []
    in_full_fp32 = ppo.full_fp32_rnn

    @contextlib.contextmanager
    def recorded():
        entered.append(True)
        with in_full_fp32():
            yield

    monkeypatch.setattr(ppo, "full_fp32_rnn", recorded)
    cfg = validate(TrainConfig(env="memory", device="cpu", threads=1, num_envs=8, horizon=8, minibatch_size=32,
                               hidden_size=16, total_steps=8 * 8 * 2))
    train(cfg)
    assert entered == []
    monkeypatch.setattr(Policy, "recurrent_sequence", Policy.pieced_sequence)
    train(cfg)
    assert entered  # the same update through the pieces owes it


@pytest.mark.parametrize("path", ["cell", "pieces"])
def test_bf16_autocast_on_a_cpu_computes_the_sequence_in_bf16_and_trains_the_float32_weights(path):
    # pieces: the branch a GPU takes for bf16 (autocast would run cuDNN's LSTM in fp16), inputs and weights cast
    # by hand; cell: the explicit-gate cell a CPU steps under autocast
    torch.manual_seed(5)
    policy = Policy(OBS, ACTIONS, HIDDEN, use_lstm=True, fused_cell=path == "pieces")
    x, h0, c0 = torch.randn(T, B, HIDDEN), torch.randn(B, HIDDEN), torch.randn(B, HIDDEN)
    starts = starts_where("mixed" if path == "pieces" else "random", torch.Generator().manual_seed(6))
    with torch.no_grad():
        expected = reference_sequence(policy, x, h0, c0, starts)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sequence = policy.pieced_sequence if path == "pieces" else policy.recurrent_sequence
        got = sequence(x, h0, c0, starts)
        if path == "cell":
            assert policy.compute_dtype(torch.device("cpu")) == torch.bfloat16
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected, rtol=0.05, atol=0.05)
    got.float().sum().backward()
    assert policy.cell.weight_hh.grad.dtype == torch.float32 and policy.cell.weight_hh.grad.abs().sum() > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["random", "last", "every", "mixed"])
def test_no_reset_leaks_through_cudnn(kind):
    # in the policy's own precision: cuDNN computes fp32 in TF32 unless told not to, and the policy tells it
    torch.manual_seed(7)
    device = torch.device("cuda")
    policy = Policy(OBS, ACTIONS, HIDDEN, use_lstm=True, fused_cell=True).to(device)
    obs = torch.randn(T, B, OBS, device=device)
    # a large carried state: were it not zeroed at a start, the outputs after it would move far
    h0, c0 = 3 * torch.randn(B, HIDDEN, device=device), 3 * torch.randn(B, HIDDEN, device=device)
    starts = starts_where(kind, torch.Generator().manual_seed(8)).to(device)
    fused = gradients(policy, Policy.forward, obs, h0, c0, starts)
    loop = gradients(policy, reference_forward, obs, h0, c0, starts)
    for got, expected in zip(fused[:4], loop[:4]):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    for name in loop[4]:
        torch.testing.assert_close(fused[4][name], loop[4][name], rtol=1e-3, atol=1e-5, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_autocast_computes_the_sequence_in_the_dtype_asked_for(dtype):
    # torch's autocast runs cuDNN's LSTM in float16 even when bfloat16 was asked for; the policy must not
    torch.manual_seed(9)
    device = torch.device("cuda")
    policy = Policy(OBS, ACTIONS, HIDDEN, use_lstm=True, fused_cell=True).to(device)
    x, h0, c0 = (torch.randn(T, B, HIDDEN, device=device), torch.randn(B, HIDDEN, device=device),
                 torch.randn(B, HIDDEN, device=device))
    starts = starts_where("random", torch.Generator().manual_seed(10)).to(device)
    expected = reference_sequence(policy, x, h0, c0, starts)
    with torch.autocast("cuda", dtype=dtype):
        got = policy.recurrent_sequence(x, h0, c0, starts)
        assert policy.compute_dtype(device) == dtype
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, rtol=0.05, atol=0.05)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_captured_forward_and_backward_replays_the_eager_ones():
    # capture cannot read the pieces' batch sizes back: the graph must hold the cell loop, and be exact
    torch.manual_seed(11)
    device = torch.device("cuda")
    policy = Policy(OBS, ACTIONS, HIDDEN, use_lstm=True, fused_cell=True).to(device)
    obs, h0, c0 = (torch.randn(T, B, OBS, device=device), torch.randn(B, HIDDEN, device=device),
                   torch.randn(B, HIDDEN, device=device))
    starts = starts_where("random", torch.Generator().manual_seed(12)).to(device)
    eager = gradients(policy, Policy.forward, obs, h0, c0, starts)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        gradients(policy, Policy.forward, obs, h0, c0, starts)  # warm-up on the capture stream
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            logits, values = policy(obs, h0, c0, starts)
            loss_of(logits, values).backward()
    torch.cuda.current_stream().wait_stream(stream)
    policy.zero_grad(set_to_none=False)  # the graph accumulates into the gradients it captured
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(logits, eager[0], rtol=1e-4, atol=1e-5)
    for name, param in policy.named_parameters():
        torch.testing.assert_close(param.grad, eager[4][name], rtol=1e-3, atol=1e-5, msg=name)



@pytest.mark.parametrize("graphed", [False, True])
def test_a_graphed_runs_warm_up_trains_the_sequence_function_its_capture_holds(monkeypatch, graphed):
    # The eager epochs before capture are the captured update's warm-up: they must run forward and backward through
    # the implementation capture will hold (the cell loop), not cuDNN's pieces. An ungraphed run keeps the pieces.
    cpu = torch.device("cpu")
    cfg = TrainConfig(device="cpu", hidden_size=HIDDEN, cuda_graphs=graphed)
    policy, _ = build_policy(cfg, (OBS,), ACTIONS, torch.float32, cpu, Autocast(cpu, cfg))
    picked = []
    monkeypatch.setattr(Policy, "pieced_sequence", lambda self, *_: picked.append("cudnn pieces"))
    monkeypatch.setattr(Policy, "stepped_sequence", lambda self, *_: picked.append("cell loop"))
    on_cuda = SimpleNamespace(is_cuda=True, device=torch.device("cuda"), dtype=torch.float32)  # what a CUDA input says
    for capturing in (False, True):  # the warm-up epoch, then capture
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
        policy.recurrent_sequence(on_cuda, None, None, None)
    assert picked == ["cell loop" if graphed else "cudnn pieces", "cell loop"]
