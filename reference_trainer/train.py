"""PPO with an LSTM policy, timed phase by phase: each epoch a rollout in env groups, an update over whole
sequences, one read of the statistics. Every tensor the loop touches is preallocated (experience.py), so any
part of it can be captured; docs/trainer.md walks through it.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from typing import Callable

import numpy as np
import torch

from reference_trainer.config import ConfigError, TrainConfig, cnn_refusal
from reference_trainer.devices import Autocast, DeviceCalls, Rank, open_compute_stream, training_device
from reference_trainer.envs import make_env_groups
from reference_trainer.epoch_calls import (LearningRateSchedule, WholeRollout, WholeUpdate, bootstrap_value,
                                           device_env_step, policy_step, update_pass)
from reference_trainer.experience import Experience
from reference_trainer.policy import Policy
from reference_trainer.ppo import STAT_NAMES, MinibatchUpdate, PolicyStep
from reference_trainer.stepping import busy_seconds, env_stepper
from reference_trainer.run_summary import summary_of_run
from rlperf.summary import RunSummary
from reference_trainer.timing import PhaseTimer, SetupClock
from reference_trainer.tracing import set_up_cupti_before_capture, start_profiler
from reference_trainer.work import count_work
from rlperf.cpus import usable_cores
from rlperf.errors import written_whole
from rlperf.memory import reset_device_peaks
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
        setup = SetupClock(process_start)
        setup.lap("device")
        trainer = Trainer(cfg, device, rank, compute_stream, copy_delay_cycles, process_start, setup)
        epochs = []
        for epoch in range(cfg.num_epochs):  # or fewer, once a steady window of steady_seconds is full
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
            if cfg.steady_seconds and epoch >= cfg.warmup_epochs and trainer.steady_window_full(epochs):
                break
        summary = trainer.finish(epochs, save_policy)
    if compute_stream is not None:
        torch.cuda.current_stream().wait_stream(compute_stream)
    return summary.to_dict()


class Trainer:
    """One rank's training over fixed buffers: `rollout()` fills the epoch's experience, `update()` learns
    from it, `end_epoch()` reads the epoch's statistics once.

    The rollout steps the environments in `env_groups` groups in turn: each group's env step starts once its
    actions are on the host and is collected when its next observations are needed, so it runs beside the
    other groups' policy steps (with one group the steps simply alternate). The policy step and
    the minibatch update are separate objects that read and write only preallocated tensors: they can be
    compiled and captured as CUDA graphs, and they hold no reference back to the trainer."""

    def __init__(self, cfg: TrainConfig, device: torch.device, rank: Rank, compute_stream: torch.cuda.Stream | None,
                 copy_delay_cycles: int, process_start: float, setup: SetupClock):
        self.cfg, self.device, self.rank, self.process_start = cfg, device, rank, process_start
        self.compute_stream, self.copy_delay_cycles = compute_stream, copy_delay_cycles
        autocast = Autocast(device, cfg)
        n = cfg.envs_per_rank

        def import_what_adam_imports() -> None:
            # Adam's constructor imports torch._dynamo, seconds of a fresh process: they pass beside the envs'
            # start-up, or after the building of an env that holds the interpreter lock as it builds (ale-py's)
            importlib.import_module("torch._dynamo")

        groups = make_env_groups(cfg, n, rank.rank * n, device, meanwhile=import_what_adam_imports)
        setup.lap_beside("envs", groups.ended, "libraries")
        self.envs = groups.envs
        self.env_start_seconds, self.env_build_seconds = groups.start_seconds, groups.build_seconds
        self.env_on_device = cfg.env == "synthetic-device"
        self.steppers = [] if self.env_on_device else [env_stepper(env, cfg.env_groups > 1, device)
                                                       for env in self.envs]
        setup.lap("envs")
        # Each eager step casts the weights to the autocast dtype anew on entering its autocast region; one
        # region around the whole rollout keeps those casts for the epoch, the weights unchanged until the
        # update. A graph holds its casts, and compiled steps are traced in the region they run in.
        self.rollout_casts = autocast if autocast.dtype and autocast.cache_enabled and not cfg.compile \
            else contextlib.nullcontext
        env = self.envs[0]
        obs_dtype = torch.from_numpy(np.zeros(0, env.obs_dtype)).dtype
        self.policy, self.dtype_used = build_policy(cfg, env.obs_shape, env.num_actions, obs_dtype, device, autocast)
        self.experience = Experience(cfg, env.obs_shape, obs_dtype, env.num_actions, env.next_step_reset, device)
        parameters = sum(p.numel() for p in self.policy.parameters())
        self.work = count_work(cfg, env.obs_shape, self.experience.host_obs.element_size(), env.num_actions,
                               parameters, env.next_step_reset, str(self.dtype_used).removeprefix("torch."),
                               torch.get_num_threads(), written_out=device.type == "cpu" and not cfg.compile
                               and self.dtype_used == torch.float32)
        setup.lap("model")

        steps = [PolicyStep(self.policy, view, autocast, cfg.lstm, self.experience.step_noise if g == 0 else None,
                            rank.rank, rank.world_size)
                 for g, view in enumerate(self.experience.groups)]
        self.lr = torch.tensor(cfg.learning_rate, device=device)
        self.stats = torch.zeros(len(STAT_NAMES), device=device)
        self.minibatch = MinibatchUpdate(cfg, *learner(cfg, self.policy, self.lr, device, rank), autocast,
                                         self.stats, self.experience.batch)
        self.calls = DeviceCalls([step.run for step in steps], self.minibatch.forward_loss,
                                 self.minibatch.backward_step, cfg.compile)
        if cfg.whole_rollout:
            experience, envs = self.experience, self.envs
            self.calls.cover_rollout(lambda steps: WholeRollout(experience, steps, envs, cfg.horizon))
        if cfg.whole_update:
            schedule = LearningRateSchedule(cfg, self.lr) if cfg.anneal_lr else None
            experience, stats = self.experience, self.stats
            self.calls.cover_update(lambda forward, learn: WholeUpdate(cfg, experience, stats, forward, learn, device,
                                                                       schedule))

        self.copy_stream = torch.cuda.Stream(device) if cfg.copy_stream else None
        self.obs_ready = torch.cuda.Event() if cfg.is_cuda else None
        # recorded after each group's non_blocking copy of its actions: the env steps once it has passed
        self.actions_ready = [torch.cuda.Event() for _ in self.envs] if cfg.non_blocking else None
        self.timer = PhaseTimer(device, cfg.timers, cfg.inject_delay, cfg.phases, cfg.inject_delay_every,
                                cfg.warmup_epochs)
        self.profiler: torch.profiler.profile | None = None
        self.phase_peaks: dict[str, list[int]] = {}  # CUDA with timers: each phase's, in the last warm-up epoch
        self.warmup_end = self.steady_start_ns = None
        setup.lap("optimizer")
        T = cfg.horizon
        first = groups.first_obs
        self.experience.obs[T].copy_(torch.cat(first) if self.env_on_device else torch.from_numpy(np.concatenate(first)))
        self.experience.starts[T].fill_(1.0)
        setup.lap("envs")
        self.setup_seconds = setup.seconds

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
        if self.device.type == "cuda":
            reset_device_peaks(self.device)  # the run's device peaks: the steady epochs' alone
        self.warmup_end = time.perf_counter()
        self.steady_start_ns = time.time_ns()

    def start_epoch(self, epoch: int) -> None:
        traced = self.profiler is not None and epoch < self.cfg.warmup_epochs + self.cfg.trace_epochs
        self.timer.trace_ranges = self.timer.record_timeline = traced
        self.timer.start_epoch()

    def rollout(self) -> None:
        """`horizon` steps of every environment, then the value of the observation after them: step by step, or
        as one call (graph_scope rollout or both)."""
        with self.rollout_casts():
            if self.calls.rollout is None:
                self.rollout_steps()
                return
            self.rank.beat()
            self.timer.enter("rollout_graph")
            self.calls.rollout()

    def rollout_steps(self) -> None:
        T, x = self.cfg.horizon, self.experience
        self.timer.enter("eval_misc")
        x.start_rollout()
        # Each group's env step starts right after its own policy step and runs beside the other groups' (its
        # stepper waits for non_blocking actions), so the device always has a step queued (docs/trainer.md).
        for group in range(len(self.envs)):
            self.launch_step(group, 0)
            self.start_env_step(group, 0)
        for t in range(T):
            self.rank.beat()
            for group in range(len(self.envs)):
                self.finish_env_step(group, t)
                if t + 1 < T:
                    self.launch_step(group, t + 1)
                    self.start_env_step(group, t + 1)

        self.timer.enter("eval_forward")
        bootstrap_value(x, self.calls.steps)

    def launch_step(self, group: int, t: int) -> None:
        """Queues one group's policy step on observation t, and the copy of its actions to the host."""
        v = self.experience.groups[group]
        self.timer.enter("eval_forward")
        policy_step(v, self.calls.steps[group], t, self.timer.enter)
        if self.env_on_device:
            return
        self.timer.enter("eval_copy")
        self.delay_copy()
        # the one blocking read of the step, unless non_blocking leaves the env's stepper to wait for its event
        v.host_actions.copy_(v.step_action, non_blocking=self.cfg.non_blocking)
        if self.actions_ready is not None:
            self.actions_ready[group].record()

    def start_env_step(self, group: int, t: int) -> None:
        """Starts one group's env step on the actions of step t, once they are on the host; the device env
        is stepped by finish_env_step alone."""
        if self.env_on_device:
            return
        self.timer.enter("env")
        # host_actions is next written by this group's launch_step(t + 1), after finish_env_step(t) collected it
        self.steppers[group].start(self.experience.groups[group].host_actions_array,
                                   self.actions_ready[group] if self.actions_ready is not None else None)

    def finish_env_step(self, group: int, t: int) -> None:
        """Collects one group's env step on the actions of step t, and queues the copy of what it returned
        into slot t + 1 of the experience (the device env writes it there itself)."""
        v, masked = self.experience.groups[group], self.experience.masked
        if self.env_on_device:
            self.timer.enter("env")
            device_env_step(v, self.envs[group], t)
            return
        self.timer.enter("env")
        next_obs, rewards, dones, valid = self.steppers[group].finish()
        self.timer.enter("eval_copy")
        # Safe to refill: the actions just read were computed after the copies out of these buffers had landed
        # (docs/trainer.md, GPU knobs), so the copies in never block the host.
        v.host_obs_array[:] = next_obs
        v.host_arrivals_array[:, 0] = rewards
        v.host_arrivals_array[:, 1] = dones
        if masked:
            v.host_arrivals_array[:, 2] = valid
        with torch.cuda.stream(self.copy_stream) if self.copy_stream is not None else contextlib.nullcontext():
            self.delay_copy()
            v.obs_at[t + 1].copy_(v.host_obs, non_blocking=True)
            v.arrivals_at[t].copy_(v.host_arrivals, non_blocking=True)
        if self.copy_stream is not None:
            self.obs_ready.record(self.copy_stream)
            torch.cuda.current_stream().wait_event(self.obs_ready)
        if masked:  # the observation after a reset-only step is the new episode's first
            torch.mul(v.valid_at[t], -1.0, out=v.starts_at[t + 1]).add_(1.0)
        else:
            v.starts_at[t + 1].copy_(v.dones_at[t])

    def delay_copy(self) -> None:
        if self.copy_delay_cycles:
            torch.cuda._sleep(self.copy_delay_cycles)  # the test hook of train()'s docstring

    def update(self) -> None:
        """Advantages, then `update_epochs` passes of minibatches of whole sequences: minibatch by minibatch, or
        as one call (graph_scope update or both)."""
        if self.calls.update is None:
            update_pass(self.cfg, self.experience, self.stats, self.calls.forward, self.calls.learn, self.device,
                        self.rank.world_size, self.rank.all_reduce_sum, self.rank.beat, self.timer.enter)
            return
        self.rank.beat()
        self.timer.enter("update_graph")
        self.calls.update()

    def end_epoch(self, epoch: int) -> dict:
        """The one read of device statistics this epoch; returns the epoch's record."""
        cfg = self.cfg
        self.timer.enter("log")
        episodes = sum(env.episode_totals(self.device) for env in self.envs)
        totals = torch.cat([self.stats, episodes.to(self.stats.dtype)])
        totals = self.rank.all_reduce_sum(totals).cpu()
        updates = cfg.update_epochs * (cfg.envs_per_rank // cfg.minibatch_sequences_per_rank) * self.rank.world_size
        losses = {name: float(totals[i]) / updates for i, name in enumerate(STAT_NAMES)}
        episodes_done = int(totals[-1])
        if cfg.anneal_lr and not cfg.whole_update:  # a whole update anneals it on the device
            self.lr.fill_(cfg.learning_rate * (1.0 - (epoch + 1) / cfg.num_epochs))
        seconds, phases = self.timer.end_epoch()
        if epoch == cfg.warmup_epochs - 1:
            self.phase_peaks = dict(self.timer.phase_peaks)
        env_times = [stepper.take_times() for stepper in self.steppers]
        env_busy = busy_seconds([span for spans, _ in env_times for span in spans]) if env_times else None
        env_wait = sum(wait for _, wait in env_times) if env_times else None
        if self.profiler is not None:
            self.profiler.step()
        return {
            "epoch": epoch, "steps": cfg.batch_size, "seconds": seconds, "warmup": epoch < cfg.warmup_epochs,
            "phases": phases, "delayed": sorted(self.timer.delayed_this_epoch), "losses": losses,
            "episodes": episodes_done,
            "env_busy_seconds": env_busy, "env_wait_seconds": env_wait,
            "mean_episode_return": float(totals[-2]) / episodes_done if episodes_done else None,
            "end_seconds": time.perf_counter() - self.process_start,
        }

    def steady_window_full(self, epochs: list[dict]) -> bool:
        """Whether the steady epochs so far reach `steady_seconds`, over at least two of them (and every
        traced one). Ranks stop together: any rank's full window ends every rank's run."""
        steady = epochs[self.cfg.warmup_epochs:]
        enough = max(2, self.cfg.trace_epochs if self.cfg.trace_dir else 0)
        full = len(steady) >= enough and sum(e["seconds"] for e in steady) >= self.cfg.steady_seconds
        return self.rank.any_rank(full, self.device)

    def finish(self, epochs: list[dict], save_policy: str) -> RunSummary:
        steady_end_ns = time.time_ns()
        if self.profiler is not None:
            self.profiler.stop()
        if save_policy and self.rank.rank == 0:
            # through a Python file, so that a write the disk refuses is an OSError rather than torch's RuntimeError
            with written_whole(save_policy) as partial, open(partial, "wb") as file:
                torch.save(self.policy.state_dict(), file)
        wall = time.perf_counter() - self.process_start
        for stepper in self.steppers:
            stepper.close()
        for env in self.envs:
            env.close()
        return summary_of_run(
            self.cfg, epochs, wall_seconds=wall, warmup_seconds=self.warmup_end - self.process_start,
            compile_seconds=self.calls.compile_seconds, env_start_seconds=self.env_start_seconds,
            env_build_seconds=self.env_build_seconds,
            setup_seconds=self.setup_seconds, dtype_used=self.dtype_used, device=self.device,
            steady_window_unix_ns=[self.steady_start_ns, steady_end_ns],
            h2d_bytes_per_step=0 if self.env_on_device else self.experience.h2d_bytes_per_step, work=self.work,
            parameters=sum(p.numel() for p in self.policy.parameters()), profiler=self.profiler,
            timeline=self.timer.timeline, rank=self.rank, phase_peaks=self.phase_peaks)


def build_policy(cfg: TrainConfig, obs_shape: tuple[int, ...], num_actions: int, obs_dtype: torch.dtype,
                 device: torch.device, autocast: Autocast) -> tuple[Policy, torch.dtype]:
    """The policy on `device`, and the dtype its recurrent core really computes in, checked against the
    requested one."""
    refusal = cnn_refusal(obs_shape) if cfg.encoder == "cnn" else None
    if refusal:
        raise ConfigError("encoder", f"{refusal}; {cfg.env} observations are {list(obs_shape)}")
    fused_cell = device.type == "cuda" or autocast.dtype is None
    policy = Policy(obs_shape, num_actions, cfg.hidden_size, cfg.lstm, fused_cell, encoder=cfg.encoder,
                    cnn_channels=cfg.cnn_channels, pixels=obs_dtype == torch.uint8,
                    sequences_as_captured=cfg.cuda_graphs).to(device)
    with autocast():
        dtype_used = policy.compute_dtype(device)
    if dtype_used != (autocast.dtype or torch.float32):
        raise ConfigError("dtype", f"{cfg.dtype} was requested but the recurrent core computes in {dtype_used}")
    return policy, dtype_used


def learner(cfg: TrainConfig, policy: Policy, lr: torch.Tensor, device: torch.device, rank: Rank) -> tuple:
    """What the minibatch update trains with: the model its forward runs (the policy, wrapped for
    DistributedDataParallel with several ranks), the policy, Adam (fused, and capturable on CUDA, reading its
    learning rate from the tensor `lr`), and the loss scaler (on for fp16 only). Fused on a CPU too: one operator
    for every parameter, where torch's default loop dispatches about thirty a parameter."""
    model = policy
    if rank.world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            policy, device_ids=[device.index] if cfg.is_cuda else None, gradient_as_bucket_view=True
        )
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr, eps=1e-5, capturable=cfg.is_cuda, fused=True)
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.dtype == "fp16")
    return model, policy, optimizer, scaler
