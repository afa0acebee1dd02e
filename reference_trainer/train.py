"""PPO with an LSTM policy, timed phase by phase.

Each epoch: a rollout of `horizon` steps over this rank's environments, stepped in `env_groups` groups in
turn so the host can step one group while the device computes another's actions (env, eval_copy,
eval_forward, eval_misc), then advantages and `update_epochs` passes of minibatches of whole sequences (train_misc,
train_forward, learn), then one read of the epoch's statistics (log).

Built for capture from the first line: every tensor the loops touch is preallocated with a fixed shape,
the policy step and the minibatch update read and write only those tensors, statistics accumulate on the
device and are read once per epoch, and the learning rate is a tensor updated in place.
"""

from __future__ import annotations

import contextlib
import math
import platform
import time
from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch

from reference_trainer.config import ConfigError, TrainConfig, cnn_refusal
from reference_trainer.devices import Autocast, DeviceCalls, Rank, open_compute_stream, training_device
from reference_trainer.envs import make_env
from reference_trainer.policy import Policy
from reference_trainer.ppo import STAT_NAMES, MinibatchUpdate, PolicyStep, gae, normalized
from reference_trainer.solving import time_to_solve
from reference_trainer.timing import PhaseTimer
from reference_trainer.tracing import set_up_cupti_before_capture, start_profiler
from reference_trainer.work import count_work
from rlperf import __version__
from rlperf.cpus import usable_cores
from rlperf.machine import cuda_uuid, torch_versions
from rlperf.torch_api import supported_torch



def train(cfg: TrainConfig, rank: Rank | None = None, on_epoch: Callable[[dict], None] | None = None,
          save_policy: str = "", copy_delay_cycles: int = 0) -> dict:
    """Trains with `cfg` and returns the run's summary (docs/results-format.md).

    `copy_delay_cycles` is a test hook, never set when measuring: on CUDA it spins the stream of every
    rollout copy for that many GPU cycles just before the copy, so that a consumer that does not wait for
    its copy reads stale data and changes the losses (tests/test_gpu_knobs.py). Refused on a CPU."""
    rank = rank or Rank()
    process_start = time.perf_counter()
    supported_torch()
    if copy_delay_cycles < 0 or (copy_delay_cycles and not cfg.is_cuda):
        raise ConfigError("copy_delay_cycles", f"is a test hook for CUDA copies: 0, or a positive number of "
                                               f"cycles on a CUDA device (got {copy_delay_cycles} on {cfg.device})")
    device = training_device(cfg, rank.local_rank)
    compute_stream = open_compute_stream(cfg, device)
    with torch.cuda.stream(compute_stream) if compute_stream is not None else contextlib.nullcontext():
        # torch's default (one thread per physical core it may run on) does not know a container's CPU quota
        torch.set_num_threads(cfg.threads or min(torch.get_num_threads(), usable_cores()))
        torch.manual_seed(cfg.seed)
        trainer = Trainer(cfg, device, rank, compute_stream, copy_delay_cycles, process_start)
        epochs = []
        for epoch in range(cfg.num_epochs):
            if cfg.cuda_graphs and epoch == cfg.warmup_epochs - 1:
                trainer.capture()
            if epoch == cfg.warmup_epochs:
                trainer.start_steady()
            trainer.start_epoch(epoch)
            trainer.rollout()
            trainer.update()
            epochs.append(trainer.end_epoch(epoch))
            if on_epoch is not None:
                on_epoch(epochs[-1])
        summary = trainer.finish(epochs, save_policy)
    if compute_stream is not None:
        torch.cuda.current_stream().wait_stream(compute_stream)
    return summary


class Trainer:
    """One rank's training over fixed buffers: `rollout()` fills the epoch's experience, `update()` learns
    from it, `end_epoch()` reads the epoch's statistics once.

    The rollout steps the environments in `env_groups` groups in turn, so the host can step one group while
    the device computes another's actions (with one group the steps simply alternate). The policy step and
    the minibatch update are separate objects that read and write only preallocated tensors: they can be
    compiled and captured as CUDA graphs, and they hold no reference back to the trainer."""

    def __init__(self, cfg: TrainConfig, device: torch.device, rank: Rank,
                 compute_stream: torch.cuda.Stream | None, copy_delay_cycles: int, process_start: float):
        self.cfg, self.device, self.rank, self.process_start = cfg, device, rank, process_start
        self.compute_stream, self.copy_delay_cycles = compute_stream, copy_delay_cycles
        autocast = Autocast(device, cfg)

        # --- environments and policy ---------------------------------------------------------------
        self.n = n = cfg.envs_per_rank
        group_size = n // cfg.env_groups
        groups = [slice(g * group_size, (g + 1) * group_size) for g in range(cfg.env_groups)]
        self.envs = [make_env(cfg, group_size, env_offset=rank.rank * n + rows.start) for rows in groups]
        env = self.envs[0]
        obs_shape, num_actions = env.obs_shape, env.num_actions
        obs_dtype = torch.from_numpy(np.zeros(0, env.obs_dtype)).dtype
        # Where an env spends the step after an episode's end on its reset, that step is no transition: the
        # `valid` buffer gives it no weight in the losses and the advantage statistics.
        self.masked = env.next_step_reset
        T, H = cfg.horizon, cfg.hidden_size
        refusal = cnn_refusal(obs_shape) if cfg.encoder == "cnn" else None
        if refusal:
            raise ConfigError("encoder", f"{refusal}; {cfg.env} observations are {list(obs_shape)}")
        fused_cell = device.type == "cuda" or autocast.dtype is None
        self.policy = Policy(obs_shape, num_actions, H, cfg.lstm, fused_cell, encoder=cfg.encoder,
                             cnn_channels=cfg.cnn_channels, pixels=obs_dtype == torch.uint8).to(device)
        with autocast():
            self.dtype_used = self.policy.compute_dtype(device)
        if self.dtype_used != (autocast.dtype or torch.float32):
            raise ConfigError("dtype", f"{cfg.dtype} was requested but the recurrent core computes in {self.dtype_used}")
        train_model = self.policy
        if rank.world_size > 1:
            train_model = torch.nn.parallel.DistributedDataParallel(
                self.policy, device_ids=[device.index] if cfg.is_cuda else None, gradient_as_bucket_view=True
            )
        self.lr = torch.tensor(cfg.learning_rate, device=device)
        optimizer = torch.optim.Adam(self.policy.parameters(), lr=self.lr, eps=1e-5, capturable=cfg.is_cuda,
                                     fused=cfg.is_cuda or None)
        scaler = torch.amp.GradScaler(device.type, enabled=cfg.dtype == "fp16")

        # --- experience, preallocated on the training device ----------------------------------------
        # slot T holds the bootstrap observation; pixels stay uint8 here and are scaled inside the policy
        self.obs = torch.zeros(T + 1, n, *obs_shape, dtype=obs_dtype, device=device)
        self.starts = torch.zeros(T + 1, n, device=device)
        self.actions = torch.zeros(T, n, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(T, n, device=device)
        self.values = torch.zeros(T, n, device=device)
        self.rewards = torch.zeros(T, n, device=device)
        self.dones = torch.zeros(T, n, device=device)
        self.valid = torch.ones(T, n, device=device)  # 0 where a step only reset its env (written only if masked)
        self.h0, self.c0 = torch.zeros(n, H, device=device), torch.zeros(n, H, device=device)
        self.h, self.c = torch.zeros(n, H, device=device), torch.zeros(n, H, device=device)
        self.stats = torch.zeros(len(STAT_NAMES), device=device)

        # What the policy step reads and writes, so it can be replayed as a CUDA graph.
        self.step_obs = torch.zeros(n, *obs_shape, dtype=obs_dtype, device=device)
        self.step_start = torch.zeros(n, device=device)
        self.step_action = torch.zeros(n, dtype=torch.long, device=device)
        self.step_logprob = torch.zeros(n, device=device)
        self.step_value = torch.zeros(n, device=device)
        step_noise = torch.zeros(n, num_actions, device=device)

        # Host side of the copies: pinned staging lets copies run asynchronously (step_envs says why one buffer
        # of each is enough).
        pin = cfg.pinned
        host_obs = torch.zeros(n, *obs_shape, dtype=obs_dtype, pin_memory=pin)
        host_rewards = torch.zeros(n, pin_memory=pin)
        host_dones = torch.zeros(n, pin_memory=pin)
        host_valid = torch.ones(n, pin_memory=pin)
        copied_per_step = [host_obs, host_rewards, host_dones] + ([host_valid] if self.masked else [])
        self.h2d_bytes_per_step = sum(buf[0].nbytes for buf in copied_per_step)
        self.work = count_work(cfg, obs_shape, host_obs.element_size(), num_actions,
                               sum(p.numel() for p in self.policy.parameters()), self.masked,
                               str(self.dtype_used).removeprefix("torch."), torch.get_num_threads())
        host_actions = torch.zeros(n, dtype=torch.long, pin_memory=pin)
        self.copy_stream = torch.cuda.Stream(device) if cfg.copy_stream else None
        self.obs_ready = torch.cuda.Event() if cfg.is_cuda else None
        self.actions_ready = [torch.cuda.Event() for _ in groups] if cfg.is_cuda else None

        # Each group's view of every buffer the rollout touches, made once: the rollout is bound by host
        # time, and making a view costs about a microsecond.
        by_step = dict(obs=self.obs, starts=self.starts, actions=self.actions, logprobs=self.logprobs,
                       values=self.values, rewards=self.rewards, dones=self.dones, valid=self.valid)
        by_env = dict(step_obs=self.step_obs, step_start=self.step_start, step_action=self.step_action,
                      step_logprob=self.step_logprob, step_value=self.step_value, step_noise=step_noise,
                      h=self.h, c=self.c, host_actions=host_actions, host_obs=host_obs, host_rewards=host_rewards,
                      host_dones=host_dones, host_valid=host_valid)
        self.views = [SimpleNamespace(**{name: buf[:, rows] for name, buf in by_step.items()},
                                      **{name: buf[rows] for name, buf in by_env.items()}) for rows in groups]
        steps = [PolicyStep(self.policy, view, autocast, cfg.lstm, step_noise if g == 0 else None, rank.rank, rank.world_size)
                 for g, view in enumerate(self.views)]

        S = cfg.minibatch_sequences_per_rank
        minibatch_valid = {"valid": torch.ones(T, S, device=device)} if self.masked else {}
        self.minibatch = MinibatchUpdate(cfg, train_model, self.policy, optimizer, scaler, autocast, self.stats,
                                         batch={"obs": torch.zeros(T, S, *obs_shape, dtype=obs_dtype, device=device),
                                                "starts": torch.zeros(T, S, device=device),
                                                "h0": torch.zeros(S, H, device=device),
                                                "c0": torch.zeros(S, H, device=device),
                                                "actions": torch.zeros(T, S, dtype=torch.long, device=device),
                                                "logprobs": torch.zeros(T, S, device=device),
                                                "advantages": torch.zeros(T, S, device=device),
                                                "returns": torch.zeros(T, S, device=device),
                                                "values": torch.zeros(T, S, device=device), **minibatch_valid})
        self.calls = DeviceCalls([step.run for step in steps], self.minibatch.forward_loss,
                                 self.minibatch.backward_step, cfg.compile)

        self.timer = PhaseTimer(device, cfg.timers, cfg.inject_delay)
        self.profiler = None
        self.total_episodes = 0
        self.warmup_end = self.steady_start_ns = None
        self.obs[T].copy_(torch.from_numpy(np.concatenate([env.reset() for env in self.envs])))
        self.starts[T].fill_(1.0)

    def capture(self) -> None:
        """Replaces the eager steps and update with CUDA graphs before the last warm-up epoch (validate() asks
        for two or more with cuda_graphs). The eager epochs before it ran them on the same stream, so Adam's
        state, created at its first step, and compilation are not captured; the warm-up epoch after it replays
        every graph, so the first replays' one-time costs (each graph's upload, and the eager temporaries
        allocated again because capture emptied the allocator's cache) are paid before the steady clock starts."""
        if self.cfg.trace_dir:
            set_up_cupti_before_capture(self.device)
        self.calls.capture(self.compute_stream)

    def start_steady(self) -> None:
        """The profiler, then the steady clock: the profiler's start is charged to no steady epoch, and
        capture, an epoch earlier, is never traced."""
        if self.cfg.trace_dir:
            self.profiler = start_profiler(self.cfg, self.device, self.rank.rank)
        self.warmup_end = time.perf_counter()
        self.steady_start_ns = time.time_ns()

    def start_epoch(self, epoch: int) -> None:
        traced = self.profiler is not None and epoch < self.cfg.warmup_epochs + self.cfg.trace_epochs
        self.timer.trace_ranges = self.timer.record_timeline = traced
        self.timer.start_epoch()

    def rollout(self) -> None:
        """`horizon` steps of every environment, then the value of the observation after them."""
        T = self.cfg.horizon
        self.timer.enter("eval_misc")
        self.obs[0].copy_(self.obs[T])
        self.starts[0].copy_(self.starts[T])
        self.h0.copy_(self.h)
        self.c0.copy_(self.c)
        # The copy stream waits for nothing here, though the last update read the buffers it writes: it copies
        # only after the host has waited for this epoch's first actions, computed after that update.
        for group in range(len(self.envs)):
            self.launch_step(group, 0)
        for t in range(T):
            self.rank.beat()
            for group in range(len(self.envs)):
                self.step_envs(group, t)
                if t + 1 < T:
                    self.launch_step(group, t + 1)

        self.timer.enter("eval_forward")
        self.step_obs.copy_(self.obs[T])
        self.step_start.copy_(self.starts[T])
        saved_h, saved_c = self.h.clone(), self.c.clone()
        for step in self.calls.steps:
            step()
        self.h.copy_(saved_h)
        self.c.copy_(saved_c)

    def launch_step(self, group: int, t: int) -> None:
        """Queues one group's policy step on observation t, and the copy of its actions to the host."""
        v = self.views[group]
        self.timer.enter("eval_forward")
        v.step_obs.copy_(v.obs[t])
        v.step_start.copy_(v.starts[t])
        self.calls.steps[group]()
        self.timer.enter("eval_misc")
        v.actions[t].copy_(v.step_action)
        v.logprobs[t].copy_(v.step_logprob)
        v.values[t].copy_(v.step_value)
        self.timer.enter("eval_copy")
        self.delay_copy()
        v.host_actions.copy_(v.step_action, non_blocking=self.cfg.non_blocking)
        if self.cfg.non_blocking:
            self.actions_ready[group].record()

    def step_envs(self, group: int, t: int) -> None:
        """Steps one group's environments with the actions of step t, and queues the copy of what they
        return into slot t + 1 of the experience."""
        v, nb = self.views[group], self.cfg.non_blocking
        if nb:
            self.actions_ready[group].synchronize()
        self.timer.enter("env")
        next_obs, rewards, dones, valid = self.envs[group].step(v.host_actions.numpy())
        self.timer.enter("eval_copy")
        # No copy out of the staging buffers can still be running when the host refills them: the actions the
        # envs just took were computed on the device from observation t, after the compute stream had waited
        # for the copies out of these buffers that brought it in (on the same stream, or through obs_ready).
        v.host_obs.numpy()[:] = next_obs
        v.host_rewards.numpy()[:] = rewards
        v.host_dones.numpy()[:] = dones
        if self.masked:
            v.host_valid.numpy()[:] = valid
        with torch.cuda.stream(self.copy_stream) if self.copy_stream is not None else contextlib.nullcontext():
            self.delay_copy()
            v.obs[t + 1].copy_(v.host_obs, non_blocking=nb)
            v.rewards[t].copy_(v.host_rewards, non_blocking=nb)
            v.dones[t].copy_(v.host_dones, non_blocking=nb)
            if self.masked:
                v.valid[t].copy_(v.host_valid, non_blocking=nb)
        if self.copy_stream is not None:
            self.obs_ready.record(self.copy_stream)
            torch.cuda.current_stream().wait_event(self.obs_ready)
        if self.masked:  # the observation after a reset-only step is the new episode's first
            torch.mul(v.valid[t], -1.0, out=v.starts[t + 1]).add_(1.0)
        else:
            v.starts[t + 1].copy_(v.dones[t])

    def delay_copy(self) -> None:
        if self.copy_delay_cycles:
            torch.cuda._sleep(self.copy_delay_cycles)  # the test hook of train()'s docstring

    def update(self) -> None:
        """Advantages, then `update_epochs` passes of minibatches of whole sequences."""
        cfg, n, S = self.cfg, self.n, self.cfg.minibatch_sequences_per_rank
        self.timer.enter("train_misc")
        advantages = gae(self.rewards, self.values, self.dones, self.step_value, cfg.gamma, cfg.gae_lambda)
        returns = advantages + self.values
        advantages = normalized(advantages, self.valid if self.masked else None, self.rank.world_size,
                                self.rank.all_reduce_sum)

        batch = self.minibatch.batch
        sources = (("obs", self.obs[:-1]), ("starts", self.starts[:-1]), ("actions", self.actions),
                   ("logprobs", self.logprobs), ("advantages", advantages), ("returns", returns),
                   ("values", self.values)) + ((("valid", self.valid),) if self.masked else ())
        self.stats.zero_()
        for _ in range(cfg.update_epochs):
            order = torch.randperm(n, device=self.device)
            for start in range(0, n, S):
                self.rank.beat()
                self.timer.enter("train_misc")
                idx = order[start:start + S]
                for name, source in sources:
                    torch.index_select(source, 1, idx, out=batch[name])
                torch.index_select(self.h0, 0, idx, out=batch["h0"])
                torch.index_select(self.c0, 0, idx, out=batch["c0"])
                self.timer.enter("train_forward")
                self.calls.forward()
                self.timer.enter("learn")
                self.calls.learn()

    def end_epoch(self, epoch: int) -> dict:
        """The one read of device statistics this epoch; returns the epoch's record."""
        cfg = self.cfg
        self.timer.enter("log")
        finished = np.concatenate([env.drain_episodes()[0] for env in self.envs])
        totals = torch.cat([self.stats, torch.tensor([finished.sum(), finished.size], device=self.device,
                                                     dtype=self.stats.dtype)])
        totals = self.rank.all_reduce_sum(totals).cpu()
        updates = cfg.update_epochs * (self.n // cfg.minibatch_sequences_per_rank) * self.rank.world_size
        losses = {name: float(totals[i]) / updates for i, name in enumerate(STAT_NAMES)}
        episodes_done = int(totals[-1])
        self.total_episodes += episodes_done
        if cfg.anneal_lr:
            self.lr.fill_(cfg.learning_rate * (1.0 - (epoch + 1) / cfg.num_epochs))
        seconds, phases = self.timer.end_epoch()
        if self.profiler is not None:
            self.profiler.step()
        return {
            "epoch": epoch, "steps": cfg.batch_size, "seconds": seconds, "warmup": epoch < cfg.warmup_epochs,
            "phases": phases, "losses": losses, "episodes": episodes_done,
            "mean_episode_return": float(totals[-2]) / episodes_done if episodes_done else None,
            "end_seconds": time.perf_counter() - self.process_start,
        }

    def finish(self, epochs: list[dict], save_policy: str) -> dict:
        steady_end_ns = time.time_ns()
        if self.profiler is not None:
            self.profiler.stop()
        if save_policy and self.rank.rank == 0:
            torch.save(self.policy.state_dict(), save_policy)
        wall = time.perf_counter() - self.process_start
        summary = summarize(self.cfg, epochs, wall, self.warmup_end - self.process_start, self.calls.compile_seconds,
                            self.total_episodes, self.dtype_used, self.device, self.timer.timeline, self.profiler)
        summary["steady_window_unix_ns"] = [self.steady_start_ns, steady_end_ns]
        summary["h2d_bytes_per_step"] = self.h2d_bytes_per_step
        summary["work"] = self.work
        summary["parameters"] = sum(p.numel() for p in self.policy.parameters())
        summary["time_to_solve"] = time_to_solve(self.cfg, epochs, summary["sps"])
        for env in self.envs:
            env.close()
        return summary


def summarize(cfg, epochs, wall, warmup_seconds, compile_seconds, total_episodes, dtype_used, device, timeline,
              profiler) -> dict:
    steady = [e for e in epochs if not e["warmup"]]
    steady_seconds = sum(e["seconds"] for e in steady)
    steady_steps = sum(e["steps"] for e in steady)
    phases = {name: sum(e["phases"][name] for e in steady) for name in epochs[0]["phases"]}
    tail = epochs[-max(1, math.ceil(len(epochs) / 10)):]
    tail_returns = [e["mean_episode_return"] for e in tail if e["mean_episode_return"] is not None]
    summary = {
        "schema": 1,
        "config": cfg.to_dict(),
        "sps": steady_steps / steady_seconds,
        "sps_end_to_end": sum(e["steps"] for e in epochs) / wall,
        "warmup_seconds": warmup_seconds,
        "compile_seconds": compile_seconds,
        "wall_seconds": wall,
        "steps": sum(e["steps"] for e in epochs),
        "steady_steps": steady_steps,
        "steady_seconds": steady_seconds,
        "phases": phases,
        "phase_coverage": sum(phases.values()) / steady_seconds if cfg.timers else None,
        "epochs": epochs,
        "mean_episode_return": float(np.mean(tail_returns)) if tail_returns else None,
        "episodes": total_episodes,
        "losses": epochs[-1]["losses"],
        "dtype_used": str(dtype_used).removeprefix("torch."),
        "world_size": cfg.world_size,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "device_uuid": cuda_uuid(device) if device.type == "cuda" else None,
        "versions": {"python": platform.python_version(), "numpy": np.__version__, "rlperf": __version__,
                     **torch_versions()},
    }
    if profiler is not None:
        summary["trace"] = getattr(profiler, "trace_path", None)
        summary["timeline"] = [list(mark) for mark in timeline]
    return summary
