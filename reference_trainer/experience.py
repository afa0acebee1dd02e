"""The fixed buffers of one rank's training, made once with their shapes and never reallocated, so every
call into the device reads and writes the same tensors (a CUDA graph replays on them)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from reference_trainer.config import TrainConfig


class Experience:
    """An epoch's experience on the training device, `[T + 1, N, ...]` by step and environment (slot T
    holds the observation after the rollout, the next epoch's slot 0); the recurrent state; what one policy
    step reads and writes (`step_*`); the host staging of the copies (`host_*`); each group's view of all
    of these (`groups`); and the minibatch the update gathers into (`batch`).

    `valid` is 0 where a step only reset its env (for envs that reset on the step after an episode's end,
    `masked`): that step is no transition, and the losses and advantage statistics give it no weight."""

    def __init__(self, cfg: TrainConfig, obs_shape: tuple[int, ...], obs_dtype: torch.dtype, num_actions: int,
                 masked: bool, device: torch.device):
        T, n, H, S = cfg.horizon, cfg.envs_per_rank, cfg.hidden_size, cfg.minibatch_sequences_per_rank
        self.masked = masked
        # pixels stay uint8 here and are scaled inside the policy
        self.obs = torch.zeros(T + 1, n, *obs_shape, dtype=obs_dtype, device=device)
        self.starts = torch.zeros(T + 1, n, device=device)
        self.actions = torch.zeros(T, n, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(T, n, device=device)
        self.values = torch.zeros(T, n, device=device)
        self.arrivals = torch.zeros(T, n, 3 if masked else 2, device=device)
        self.rewards, self.dones = self.arrivals[..., 0], self.arrivals[..., 1]
        self.valid = self.arrivals[..., 2] if masked else torch.ones(T, n, device=device)
        self.h0, self.c0 = torch.zeros(n, H, device=device), torch.zeros(n, H, device=device)
        self.h, self.c = torch.zeros(n, H, device=device), torch.zeros(n, H, device=device)

        self.step_obs = torch.zeros(n, *obs_shape, dtype=obs_dtype, device=device)
        self.step_start = torch.zeros(n, device=device)
        self.step_action = torch.zeros(n, dtype=torch.long, device=device)
        self.step_logprob = torch.zeros(n, device=device)
        self.step_value = torch.zeros(n, device=device)
        self.step_noise = torch.zeros(n, num_actions, device=device)

        # Pinned staging lets copies run asynchronously (Trainer.finish_env_step says why one buffer of each is
        # enough).
        pin = cfg.pinned
        self.host_obs = torch.zeros(n, *obs_shape, dtype=obs_dtype, pin_memory=pin)
        self.host_arrivals = torch.zeros(n, self.arrivals.shape[-1], pin_memory=pin)
        self.host_actions = torch.zeros(n, dtype=torch.long, pin_memory=pin)

        # Each group's view of every buffer the rollout touches, made once: the rollout is bound by host
        # time, and making a view costs about a microsecond.
        # A numpy view costs a few operator calls each time it is made, so the host writes through views made here.
        by_step = ("obs", "starts", "actions", "logprobs", "values", "arrivals", "rewards", "dones", "valid")
        by_env = ("step_obs", "step_start", "step_action", "step_logprob", "step_value", "step_noise", "h", "c",
                  "host_actions", "host_obs", "host_arrivals")
        group_size = n // cfg.env_groups
        self.group_rows = [slice(g * group_size, (g + 1) * group_size) for g in range(cfg.env_groups)]
        self.groups = []
        for rows in self.group_rows:
            view = SimpleNamespace(**{name: getattr(self, name)[:, rows] for name in by_step},
                                   **{name: getattr(self, name)[rows] for name in by_env})
            view.host_actions_array = view.host_actions.numpy()
            view.host_obs_array = view.host_obs.numpy()
            view.host_arrivals_array = view.host_arrivals.numpy()
            for name in by_step:  # each step's slot: `obs_at[t]` is `obs[t]`, made once
                setattr(view, f"{name}_at", getattr(view, name).unbind(0))
            view.step_action_column = view.step_action.unsqueeze(-1)
            view.step_logprob_column = view.step_logprob.unsqueeze(-1)
            self.groups.append(view)

        self.batch = {"obs": torch.zeros(T, S, *obs_shape, dtype=obs_dtype, device=device),
                      "starts": torch.zeros(T, S, device=device),
                      "h0": torch.zeros(S, H, device=device),
                      "c0": torch.zeros(S, H, device=device),
                      "actions": torch.zeros(T, S, dtype=torch.long, device=device),
                      "logprobs": torch.zeros(T, S, device=device),
                      "advantages": torch.zeros(T, S, device=device),
                      "returns": torch.zeros(T, S, device=device),
                      "values": torch.zeros(T, S, device=device),
                      **({"valid": torch.ones(T, S, device=device)} if masked else {})}

    @property
    def h2d_bytes_per_step(self) -> int:
        """Bytes one agent step copies from the host staging into the experience."""
        return self.host_obs[0].nbytes + self.host_arrivals[0].nbytes

    def start_rollout(self) -> None:
        """The last epoch's final observation and recurrent state become this epoch's first."""
        T = self.obs.shape[0] - 1
        self.obs[0].copy_(self.obs[T])
        self.starts[0].copy_(self.starts[T])
        self.h0.copy_(self.h)
        self.c0.copy_(self.c)

    def by_sequence(self, advantages: torch.Tensor, returns: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each `[T, N]` tensor a minibatch gathers whole sequences (columns) from, by its name in `batch`."""
        sources = {"obs": self.obs[:-1], "starts": self.starts[:-1], "actions": self.actions,
                   "logprobs": self.logprobs, "advantages": advantages, "returns": returns, "values": self.values}
        return {**sources, "valid": self.valid} if self.masked else sources

    def gather_minibatch(self, sources: dict[str, torch.Tensor], sequences: torch.Tensor) -> None:
        """Copies the `sequences` (environment indices) of every source, and their starting state, into `batch`."""
        for name, source in sources.items():
            torch.index_select(source, 1, sequences, out=self.batch[name])
        torch.index_select(self.h0, 0, sequences, out=self.batch["h0"])
        torch.index_select(self.c0, 0, sequences, out=self.batch["c0"])
