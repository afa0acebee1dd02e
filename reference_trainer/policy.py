"""Encoder (MLP or CNN) -> LSTM -> actor and critic heads.

The rollout steps the recurrent cell; training runs whole sequences through the same weights with the state zeroed
exactly where an episode started, so both see one function (docs/trainer.md, "Recurrence").
uint8 observations (pixels) arrive on the device as bytes and are scaled to [0, 1] here.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from reference_trainer.config import CNN_LAYERS, cnn_feature_map, cnn_refusal, image_layout
from reference_trainer.lstm_sequence import Workspaces, gate_scale, gate_weights, lstm_sequence, lstm_step
from rlperf.torch_api import torch_has

# nn.LSTMCell's weights, in the order nn.LSTM keeps them (its names add the layer, `_l0`)
LSTM_WEIGHTS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


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
                 fused_cell: bool, encoder: str = "mlp", cnn_channels: int = 32, pixels: bool = False,
                 sequences_as_captured: bool = False):
        super().__init__()
        # A graphed run's capture steps the cell over sequences; its eager warm-up must train that same function
        # before capture, not cuDNN's pieces (docs/trainer.md, "Recurrence").
        self.sequences_as_captured = sequences_as_captured
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
            # Training's fused sequence kernel, weight-tied to the rollout's cell: the same Parameters, so one
            # optimizer step moves both. Built on the meta device, it draws no random numbers: every other
            # layer's initial weights stay the seed's.
            self.lstm = nn.LSTM(hidden_size, hidden_size, device="meta")
            for name in LSTM_WEIGHTS:
                setattr(self.lstm, f"{name}_l0", getattr(self.cell, name))
            self.sequence_workspaces = Workspaces()
        else:
            self.core = nn.Sequential(nn.Linear(hidden_size, hidden_size), nn.ReLU())
        # set by a forward that ran cuDNN's LSTM in full float32 for a gradient: its backward must run so too
        self.fp32_rnn_backward_owed = False
        self.actor = nn.Linear(hidden_size, num_actions)
        self.critic = nn.Linear(hidden_size, 1)
        self._init_weights()
        self._step_weights: StepWeights | None = None

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
        """The dtype the recurrent core really computes in under the current autocast state: the rollout's
        step and training's sequences are both asked, and one that differs from the autocast dtype (float32
        without autocast) is the answer, so a caller comparing it with the dtype it asked for sees either."""
        x = torch.zeros(1, self.hidden_size, device=device)
        with torch.no_grad():
            if not self.use_lstm:
                return self.core(x).dtype
            if self.fused_cell:
                step = self.cell(x, (x, x))[0].dtype
            else:
                step = F.linear(x, self.cell.weight_hh, self.cell.bias_hh).dtype
            starts = torch.tensor([[0.0], [1.0]], device=device)
            sequence = self.recurrent_sequence(x.expand(2, 1, -1), x, x, starts).dtype
        requested = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else torch.float32
        return next((dtype for dtype in (step, sequence) if dtype != requested), requested)

    def step(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor, start: torch.Tensor,
             state_out: tuple[torch.Tensor, torch.Tensor] | None = None):
        """One rollout step. `start` is 1.0 where `obs` begins a new episode (the state is zeroed there). The
        written-out LSTM step writes the new state into `state_out` (which may be `h` and `c`) when given.

        Eager and without a gradient, the step reads its weights as StepWeights lays them out: fewer operators,
        the same arithmetic. A captured or compiled step reads the modules' own weights, as a replay or a
        compiled program cannot see the layouts remade after an update."""
        weights = self.current_step_weights(obs.is_cuda)
        if weights is not None and self.mlp_encoder:
            flat = obs.flatten(1) if self.obs_dims > 1 else obs
            x = torch.addmm(self.encoder[0].bias, flat.float() * (1.0 / 255.0) if self.pixels else flat,
                            weights.encoder_t).relu_()
        else:
            x = self.encode(obs)
        if not self.use_lstm:
            x = self.core(x)
        else:
            if self.written_out_lstm(x, h, c) and weights is not None:  # it has no backward of its own
                h, c = lstm_step(x, h, c, start, weights.gates, self.sequence_workspaces, *(state_out or ()))
            else:
                keep = (1.0 - start).unsqueeze(-1)
                h, c = self.recur(x, h * keep, c * keep)
            x = h
        if weights is None:
            return self.actor(x), self.critic(x).squeeze(-1), h, c
        return (torch.addmm(self.actor.bias, x, weights.actor_t),
                torch.addmm(self.critic.bias, x, weights.critic_t).squeeze(-1), h, c)

    @property
    def mlp_encoder(self) -> bool:
        return not self.conv

    def current_step_weights(self, on_cuda: bool) -> StepWeights | None:
        """The eager rollout step's weights, remade when an update has stepped (`forget_step_weights`) or a weight
        changed in place since; None where the step must read the modules' own (a gradient, capture, compile)."""
        if torch.is_grad_enabled() or torch.compiler.is_compiling() or (
                on_cuda and torch.cuda.is_current_stream_capturing()):
            return None
        if self._step_weights is None or not self._step_weights.current():
            self._step_weights = StepWeights(self)
        return self._step_weights

    def forget_step_weights(self) -> None:
        """Called after an optimizer step: a fused step moves no tensor's version counter."""
        self._step_weights = None

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor, starts: torch.Tensor):
        """Whole sequences `[T, B, ...]` from their initial states; returns logits `[T, B, A]`, values `[T, B]`."""
        x = self.encode(obs)
        x = self.recurrent_sequence(x, h, c, starts) if self.use_lstm else self.core(x)
        return self.actor(x), self.critic(x).squeeze(-1)

    def recurrent_sequence(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor,
                           starts: torch.Tensor) -> torch.Tensor:
        """The LSTM over features `[T, B, H]` from states `[B, H]`, zeroed where `starts` is 1; returns `[T, B, H]`.

        On a GPU, cuDNN's fused kernel over the reset-free pieces, except under capture or compile, which cannot read
        the pieces' lengths back, and in a graphed run's eager epochs: there, and in CPU autocast, the cell steps. On a CPU, lstm_sequence's hand-written
        function, as every operator's fixed cost counts (docs/trainer.md, "Recurrence")."""
        if self.cudnn_pieces(x.is_cuda):
            return self.pieced_sequence(x, h, c, starts)
        if self.written_out_lstm(x, h, c):
            return lstm_sequence(x, h, c, starts, self.cell, self.sequence_workspaces)
        return self.stepped_sequence(x, h, c, starts)

    def cudnn_pieces(self, on_cuda: bool) -> bool:
        """Whether sequences go to cuDNN in pieces: on a GPU, eager, and not in a graphed run, whose warm-up must
        run eagerly the cell loop its capture will hold."""
        return on_cuda and not (self.sequences_as_captured or torch.compiler.is_compiling()
                                or torch.cuda.is_current_stream_capturing())

    def written_out_lstm(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> bool:
        """Whether the LSTM runs as reference_trainer/lstm_sequence.py writes it out: on a CPU, eager, in the
        weights' dtype (not under autocast)."""
        return (x.device.type == "cpu" and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling()
                and x.dtype == h.dtype == c.dtype == self.cell.weight_hh.dtype)

    def stepped_sequence(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor,
                         starts: torch.Tensor) -> torch.Tensor:
        # In the features' dtype: under autocast a float32 mask would promote each step's bfloat16 or float16
        # state to float32, and the cell would cast it back, two casts a step forward and two backward.
        keep = (1.0 - starts).unsqueeze(-1).to(x.dtype)
        hidden = []
        # unbind, not x[t]: each indexing's backward would write a zero-filled copy of all of x
        for x_t, keep_t in zip(x.unbind(0), keep.unbind(0)):
            h, c = self.recur(x_t, h * keep_t, c * keep_t)
            hidden.append(h)
        return torch.stack(hidden)

    def pieced_sequence(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor,
                        starts: torch.Tensor) -> torch.Tensor:
        """One fused nn.LSTM call over every reset-free piece of the sequences, each from its true state.

        The pieces go packed, so cuDNN steps each piece only over its own length. The same call runs on a CPU
        (as a loop of per-step operators), which is how its exactness is tested without a GPU."""
        T, B, H = x.shape
        pieces = EpisodePieces(starts)
        batch_sizes = pieces.host_batch_sizes()
        count = int(batch_sizes[0])
        first = pieces.order[:count]  # each piece's first step, flat over [T, B]
        carried = (first < B).unsqueeze(-1)  # a sequence's first piece, not an episode start: its carried state
        keep0 = (1.0 - starts[0]).unsqueeze(-1)
        sequence = first.remainder(B)
        h_first = torch.where(carried, (h * keep0).index_select(0, sequence), 0.0)
        c_first = torch.where(carried, (c * keep0).index_select(0, sequence), 0.0)
        index = pieces.packed_index()
        data = x.new_empty(T * B, H).index_copy_(0, index, x.flatten(0, 1))
        out = self.fused_lstm(PackedSequence(data, batch_sizes), h_first, c_first)
        return out.index_select(0, index).view(T, B, -1)

    def fused_lstm(self, packed: PackedSequence, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """nn.LSTM over `packed` from states `[P, H]`; returns the packed outputs' data.

        Under CUDA autocast torch runs cuDNN's LSTM in float16 whatever dtype autocast asked for (its
        _cudnn_rnn wrapper casts to half), so bfloat16 on a GPU runs with autocast off on inputs and weights
        cast to bfloat16 explicitly."""
        device_type = packed.data.device.type
        if torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.bfloat16:
            dtype = torch.bfloat16
            weights = [getattr(self.cell, name).to(dtype) for name in LSTM_WEIGHTS]
            with torch.autocast(device_type, enabled=False):
                # the packed overload returns the outputs and both final states
                out, _, _ = torch.lstm(packed.data.to(dtype), packed.batch_sizes,
                                       (h.to(dtype)[None], c.to(dtype)[None]), weights, True, 1, 0.0, self.training,
                                       False)
            return out
        with full_fp32_rnn():
            out, _ = self.lstm(packed, (h[None], c[None]))
        self.fp32_rnn_backward_owed |= out.data.requires_grad
        return out.data


class StepWeights:
    """The rollout step's weights laid out once an update for its eager operators: the linear layers' transposed
    (three view operators each a call otherwise), the cell's as the written-out step reads them (a dozen
    operators). Made from the weights' values at construction; `current()` says whether they still hold."""

    def __init__(self, policy: Policy):
        with torch.no_grad():
            self.sources = [p for p in policy.parameters()]
            self.versions = [p._version for p in self.sources]
            if policy.mlp_encoder:
                self.encoder_t = policy.encoder[0].weight.t()
            self.actor_t, self.critic_t = policy.actor.weight.t(), policy.critic.weight.t()
            if policy.use_lstm:
                cell = policy.cell
                self.gates = gate_weights(gate_scale(cell.hidden_size, cell.weight_hh), cell.weight_ih,
                                          cell.weight_hh, cell.bias_ih, cell.bias_hh)

    def current(self) -> bool:
        return all(p._version == version for p, version in zip(self.sources, self.versions))


@contextlib.contextmanager
def full_fp32_rnn() -> Iterator[None]:
    """cuDNN's recurrent kernels in full float32 while inside: by default they compute float32 in TF32 on Ampere
    and newer GPUs, about 2.5e-4 away from the float32 cell the rollout steps over 64 steps, so training would
    not compute the rollout's function. cuDNN reads the setting each time a kernel runs, so the update's backward
    pass, where the LSTM's backward runs, is inside it too when its forward ran the LSTM here
    (`fp32_rnn_backward_owed`, MinibatchUpdate.backward_step). torch 2.9 and newer say so per operation
    (torch.backends.cudnn.rnn.fp32_precision), and then refuse to say whether cuDNN as a whole allows TF32 while
    inside; before 2.9, one switch governs every cuDNN operation, so a CNN's convolutions run their backward in
    full float32 too."""
    if not torch_has("torch.backends.cudnn.rnn.fp32_precision"):
        with torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled, allow_tf32=False):
            yield
        return
    rnn = torch.backends.cudnn.rnn
    saved = rnn.fp32_precision
    rnn.fp32_precision = "ieee"
    try:
        yield
    finally:
        rnn.fp32_precision = saved


class EpisodePieces:
    """The layout that cuts sequences `starts [T, B]` at their episode starts into pieces, computed on the
    device without reading anything back.

    A piece begins at step 0 of each sequence and at each start after it, and ends before the next start.
    Pieces are ranked longest first (ties by first step, then sequence), as a PackedSequence wants them;
    `order[r]` is the flat first step (t * B + b) of the piece ranked r, `batch_sizes[k]` the number of
    pieces longer than k (trailing zeros where no piece reaches k + 1 steps)."""

    def __init__(self, starts: torch.Tensor):
        T, B = starts.shape
        steps = torch.arange(T, device=starts.device).unsqueeze(1)
        begins = (starts != 0) | (steps == 0)
        first_step = torch.where(begins, steps, 0).cummax(0).values
        # the next start after each step: a reversed running minimum over the starts from the step after it
        next_begin = F.pad(torch.where(begins[1:], steps[1:], T).flip(0).cummin(0).values.flip(0), (0, 0, 0, 1), value=T)
        length = torch.where(begins, next_begin - steps, 0)  # a piece's length, at its first step
        self.order = torch.argsort(torch.where(begins, T - length, T + 1).flatten(), stable=True)
        rank = torch.empty_like(self.order).scatter_(0, self.order, torch.arange(T * B, device=starts.device))
        self.piece = rank.view(T, B).gather(0, first_step).flatten()  # the rank of each step's piece
        self.offset = (steps - first_step).flatten()  # each step's offset in its piece
        counts = torch.zeros(T + 1, dtype=torch.long, device=starts.device).scatter_add_(0, length.flatten(),
                                                                                         begins.flatten().long())
        self.batch_sizes = counts.flip(0).cumsum(0).flip(0)[1:]

    def host_batch_sizes(self) -> torch.Tensor:
        """The batch sizes on the host, as a PackedSequence needs them, trailing zeros
        dropped: the one read of a device value per sequence call (on a GPU, a wait for the queued work)."""
        batch_sizes = self.batch_sizes.cpu()
        return batch_sizes[batch_sizes > 0]

    def packed_index(self) -> torch.Tensor:
        """Where each step (flat t * B + b) sits in the packed data: after the pieces of every shorter offset."""
        return (self.batch_sizes.cumsum(0) - self.batch_sizes)[self.offset] + self.piece
