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
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from reference_trainer.config import ConfigError, TrainConfig
from reference_trainer.envs import make_env
from reference_trainer.policy import Policy
from reference_trainer.timing import PhaseTimer
from rlperf.cpus import usable_cores

AUTOCAST_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
STAT_NAMES = ("policy", "value", "entropy", "approx_kl", "clipfrac")


def no_progress_report() -> None:
    pass


@dataclass
class Rank:
    """Where this process sits among the ranks: its share of the environments, its GPU (`local_rank`, its
    index on this machine), its collectives, and `beat`, called as work progresses so a launcher can tell
    a hung rank from a waiting one."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    beat: Callable[[], None] = no_progress_report

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            self.beat()  # entering a collective counts as progress: peers that wait here are not stuck
            torch.distributed.all_reduce(tensor)
        return tensor


def versions() -> dict[str, str | None]:
    from rlperf import __version__

    nccl = None
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "rlperf": __version__,
        "cuda": torch.version.cuda,
        "cudnn": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None,
        "nccl": nccl,
    }


def rank_device(requested: str, local_rank: int) -> str:
    """The device one rank trains on. `cuda` and `cuda:N` name the first GPU of this machine's ranks and
    local rank r takes the r-th one after it, so `cuda:2` with two ranks uses GPUs 2 and 3 (the GPUs the
    bench probe and sampler assign to the point). The config keeps the device as requested."""
    if requested == "cpu":
        return "cpu"
    return f"cuda:{int(requested.partition(':')[2] or 0) + local_rank}"


def training_device(cfg: TrainConfig, local_rank: int) -> torch.device:
    """This rank's device, checked before anything creates a CUDA context."""
    name = rank_device(cfg.device, local_rank)
    if name == "cpu":
        return torch.device(name)
    if not torch.cuda.is_available():
        raise ConfigError("device", f"{cfg.device} requested but CUDA is not available (allowed here: cpu)")
    index, visible = torch.device(name).index, torch.cuda.device_count()
    if index >= visible:
        raise ConfigError("device", f"{cfg.device} with local rank {local_rank} needs GPU {index}, but {visible} "
                                    f"are visible (allowed: cuda:0 to cuda:{visible - 1})")
    return torch.device(name)


def trace_file_name(rank: int) -> str:
    """Rank 0 writes the trace the profiling tools read; every other rank writes its own beside it."""
    return "trace.json.gz" if rank == 0 else f"trace.rank{rank}.json.gz"


def sample_actions(logits: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Gumbel-max sampling from uniform noise drawn by the caller (graph-safe, no host sync)."""
    return (logits - torch.log(-torch.log(noise.clamp_(min=1e-20)))).argmax(dim=-1)


def gae(rewards, values, dones, next_value, gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimates over `[T, N]`; `dones[t]` means the episode ended after step t."""
    advantages = torch.empty_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        next_v = next_value if t == rewards.shape[0] - 1 else values[t + 1]
        alive = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_v * alive - values[t]
        last = delta + gamma * lam * alive * last
        advantages[t] = last
    return advantages


def ppo_loss(cfg: TrainConfig, logits, values, actions, old_logprobs, advantages, returns, old_values):
    logprobs_all = F.log_softmax(logits.float(), dim=-1)
    logprobs = logprobs_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    entropy = -(logprobs_all.exp() * logprobs_all).sum(-1).mean()
    log_ratio = logprobs - old_logprobs
    ratio = log_ratio.exp()
    policy_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)).mean()
    values = values.float()
    clipped = old_values + (values - old_values).clamp(-cfg.clip_coef, cfg.clip_coef)
    value_loss = 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2).mean()
    loss = policy_loss - cfg.ent_coef * entropy + cfg.vf_coef * value_loss
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clipfrac = ((ratio - 1).abs() > cfg.clip_coef).float().mean()
        stats = torch.stack([policy_loss, value_loss, entropy, approx_kl, clipfrac]).detach()
    return loss, stats


def train(cfg: TrainConfig, rank: Rank | None = None, on_epoch: Callable[[dict], None] | None = None,
          save_policy: str = "", copy_delay_cycles: int = 0) -> dict:
    """Trains with `cfg` and returns the run's summary (docs/results-format.md).

    `copy_delay_cycles` is a test hook, never set when measuring: on CUDA it spins the stream of every
    rollout copy for that many GPU cycles just before the copy, so that a consumer that does not wait for
    its copy reads stale data and changes the losses (tests/test_gpu_knobs.py). Refused on a CPU."""
    rank = rank or Rank()
    process_start = time.perf_counter()
    if copy_delay_cycles < 0 or (copy_delay_cycles and not cfg.is_cuda):
        raise ConfigError("copy_delay_cycles", f"is a test hook for CUDA copies: 0, or a positive number of "
                                               f"cycles on a CUDA device (got {copy_delay_cycles} on {cfg.device})")
    device = training_device(cfg, rank.local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # A graphed run computes on a side stream from its first kernel, so the eager warm-up epochs and the
    # capture run on one stream, as torch's CUDA-graph notes prescribe: state created lazily per stream
    # (cuBLAS workspaces, autograd's stream bookkeeping) exists before capture instead of inside it.
    compute_stream = torch.cuda.Stream(device) if cfg.cuda_graphs else None
    if compute_stream is not None:
        compute_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(compute_stream) if compute_stream is not None else contextlib.nullcontext():
        summary = _train(cfg, device, rank, on_epoch, save_policy, copy_delay_cycles, compute_stream, process_start)
    if compute_stream is not None:
        torch.cuda.current_stream().wait_stream(compute_stream)
    return summary


def _train(cfg: TrainConfig, device: torch.device, rank: Rank, on_epoch: Callable[[dict], None] | None,
           save_policy: str, copy_delay_cycles: int, compute_stream: torch.cuda.Stream | None,
           process_start: float) -> dict:
    # torch's default (one thread per physical core it may run on) does not know a container's CPU quota
    torch.set_num_threads(cfg.threads or min(torch.get_num_threads(), usable_cores()))
    torch.manual_seed(cfg.seed)
    autocast_dtype = AUTOCAST_DTYPES[cfg.dtype]

    def autocast():
        # Cached weight casts would outlive a CUDA graph capture; casts must be part of each replay.
        return torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None,
                              cache_enabled=not cfg.cuda_graphs)

    # --- environments and policy -------------------------------------------------------------------
    n = cfg.envs_per_rank
    group_size = n // cfg.env_groups
    groups = [slice(g * group_size, (g + 1) * group_size) for g in range(cfg.env_groups)]
    envs = [make_env(cfg, group_size, env_offset=rank.rank * n + rows.start) for rows in groups]
    obs_size, num_actions = envs[0].obs_size, envs[0].num_actions
    T, H = cfg.horizon, cfg.hidden_size
    fused_cell = device.type == "cuda" or autocast_dtype is None
    policy = Policy(obs_size, num_actions, H, cfg.lstm, fused_cell).to(device)
    with autocast():
        dtype_used = policy.compute_dtype(device)
    expected = autocast_dtype or torch.float32
    if dtype_used != expected:
        raise ConfigError("dtype", f"{cfg.dtype} was requested but the recurrent core computes in {dtype_used}")
    train_model = policy
    if rank.world_size > 1:
        train_model = torch.nn.parallel.DistributedDataParallel(
            policy, device_ids=[device.index] if cfg.is_cuda else None, gradient_as_bucket_view=True
        )
    lr = torch.tensor(cfg.learning_rate, device=device)
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr, eps=1e-5, capturable=cfg.is_cuda, fused=cfg.is_cuda or None)
    scaler = torch.amp.GradScaler(device.type, enabled=cfg.dtype == "fp16")

    # --- experience, preallocated on the training device --------------------------------------------
    obs_buf = torch.zeros(T + 1, n, obs_size, device=device)  # slot T holds the bootstrap observation
    starts_buf = torch.zeros(T + 1, n, device=device)
    actions_buf = torch.zeros(T, n, dtype=torch.long, device=device)
    logprobs_buf = torch.zeros(T, n, device=device)
    values_buf = torch.zeros(T, n, device=device)
    rewards_buf = torch.zeros(T, n, device=device)
    dones_buf = torch.zeros(T, n, device=device)
    h0, c0 = torch.zeros(n, H, device=device), torch.zeros(n, H, device=device)
    h, c = torch.zeros(n, H, device=device), torch.zeros(n, H, device=device)
    stats = torch.zeros(len(STAT_NAMES), device=device)

    # The policy step reads and writes only these, so it can be replayed as a CUDA graph.
    step_obs = torch.zeros(n, obs_size, device=device)
    step_start = torch.zeros(n, device=device)
    step_action = torch.zeros(n, dtype=torch.long, device=device)
    step_logprob = torch.zeros(n, device=device)
    step_value = torch.zeros(n, device=device)
    step_noise = torch.zeros(n, num_actions, device=device)

    # Host side of the copies: pinned staging lets copies run asynchronously; two observation slots so
    # an observation is never overwritten while its copy may still be in flight.
    pin = cfg.pinned
    host_obs = torch.zeros(2, n, obs_size, pin_memory=pin)
    host_rewards = torch.zeros(2, n, pin_memory=pin)
    host_dones = torch.zeros(2, n, pin_memory=pin)
    host_actions = torch.zeros(n, dtype=torch.long, pin_memory=pin)
    copy_stream = torch.cuda.Stream(device) if cfg.copy_stream else None
    slot_free = [[torch.cuda.Event() for _ in range(2)] for _ in groups] if cfg.is_cuda else None
    obs_ready = torch.cuda.Event() if cfg.is_cuda else None
    actions_ready = [torch.cuda.Event() for _ in groups] if cfg.is_cuda else None
    nb = cfg.non_blocking

    # Each group's view of every buffer the rollout touches, made once: the rollout is bound by host time,
    # and making a view costs about a microsecond.
    by_step = dict(obs=obs_buf, starts=starts_buf, actions=actions_buf, logprobs=logprobs_buf, values=values_buf,
                   rewards=rewards_buf, dones=dones_buf, host_obs=host_obs, host_rewards=host_rewards,
                   host_dones=host_dones)
    by_env = dict(step_obs=step_obs, step_start=step_start, step_action=step_action, step_logprob=step_logprob,
                  step_value=step_value, step_noise=step_noise, h=h, c=c, host_actions=host_actions)
    views = [SimpleNamespace(**{name: buf[:, rows] for name, buf in by_step.items()},
                             **{name: buf[rows] for name, buf in by_env.items()}) for rows in groups]

    def policy_step(group: int) -> None:
        """One rollout step of one group of environments. The first group draws the step's noise for all,
        so the actions do not depend on how the environments are grouped."""
        v = views[group]
        with torch.no_grad():
            if group == 0:
                step_noise.copy_(torch.rand(rank.world_size, n, num_actions, device=device)[rank.rank])
            with autocast():
                logits, value, h_new, c_new = policy.step(v.step_obs, v.h, v.c, v.step_start)
            logits = logits.float()
            action = sample_actions(logits, v.step_noise)
            v.step_action.copy_(action)
            v.step_logprob.copy_(F.log_softmax(logits, -1).gather(-1, action.unsqueeze(-1)).squeeze(-1))
            v.step_value.copy_(value.float())
            if cfg.lstm:
                v.h.copy_(h_new)
                v.c.copy_(c_new)

    # Minibatch tensors the update reads: gathered into place, then the update runs on them.
    S = cfg.minibatch_sequences_per_rank
    mb = {
        "obs": torch.zeros(T, S, obs_size, device=device), "starts": torch.zeros(T, S, device=device),
        "h0": torch.zeros(S, H, device=device), "c0": torch.zeros(S, H, device=device),
        "actions": torch.zeros(T, S, dtype=torch.long, device=device), "logprobs": torch.zeros(T, S, device=device),
        "advantages": torch.zeros(T, S, device=device), "returns": torch.zeros(T, S, device=device),
        "values": torch.zeros(T, S, device=device),
    }
    loss_holder: dict[str, torch.Tensor] = {}

    def forward_loss() -> None:
        with autocast():
            logits, values = train_model(mb["obs"], mb["h0"], mb["c0"], mb["starts"])
            loss, mb_stats = ppo_loss(cfg, logits, values, mb["actions"], mb["logprobs"], mb["advantages"],
                                      mb["returns"], mb["values"])
        loss_holder["loss"] = loss
        stats.add_(mb_stats)

    def backward_step() -> None:
        scaler.scale(loss_holder.pop("loss")).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm, foreach=True)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=False)

    compile_seconds = 0.0

    def timed_first_call(fn: Callable[[], None]) -> Callable[[], None]:
        """torch.compile compiles on the first call; that call's time is reported as compile time."""
        called = False

        def call() -> None:
            nonlocal called, compile_seconds
            if called:
                return fn()
            called = True
            start = time.perf_counter()
            fn()
            compile_seconds += time.perf_counter() - start

        return call

    def group_step(group: int) -> Callable[[], None]:
        return lambda: policy_step(group)

    step_fns = [group_step(g) for g in range(len(groups))]
    if cfg.compile:
        step_fns = [timed_first_call(torch.compile(fn)) for fn in step_fns]
        forward_loss = timed_first_call(torch.compile(forward_loss))
        backward_step = timed_first_call(backward_step)  # the compiled backward is built on its first use
    forward_fn, learn_fn = forward_loss, backward_step

    def capture_graphs() -> None:
        """Replaces the eager steps and update with CUDA graphs, after eager warm-up epochs ran them on the
        same stream (validate() refuses cuda_graphs without a warm-up epoch: Adam's state, created at its
        first step, and compilation must not be captured).

        Capture records kernels without running them, so no state advances here. The update is two graphs
        (forward+loss, then backward+optimizer) so their phases stay separately timed; they share a memory
        pool because the backward graph reads what the forward graph saved."""
        nonlocal step_fns, forward_fn, learn_fn
        step_graphs = [torch.cuda.CUDAGraph() for _ in step_fns]
        for graph, step_fn in zip(step_graphs, step_fns):
            with torch.cuda.graph(graph, stream=compute_stream):
                step_fn()
        forward_graph, learn_graph = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(forward_graph, stream=compute_stream):
            forward_fn()
        with torch.cuda.graph(learn_graph, pool=forward_graph.pool(), stream=compute_stream):
            learn_fn()
        step_fns = [graph.replay for graph in step_graphs]
        forward_fn, learn_fn = forward_graph.replay, learn_graph.replay

    # --- the loop ------------------------------------------------------------------------------------
    timer = PhaseTimer(device, cfg.timers, cfg.inject_delay)
    profiler = None

    def delay_copy() -> None:
        if copy_delay_cycles:
            torch.cuda._sleep(copy_delay_cycles)  # the test hook of train()'s docstring

    def launch_step(group: int, t: int) -> None:
        """Queues one group's policy step on observation t, and the copy of its actions to the host."""
        v = views[group]
        timer.enter("eval_forward")
        v.step_obs.copy_(v.obs[t])
        v.step_start.copy_(v.starts[t])
        step_fns[group]()
        timer.enter("eval_misc")
        v.actions[t].copy_(v.step_action)
        v.logprobs[t].copy_(v.step_logprob)
        v.values[t].copy_(v.step_value)
        timer.enter("eval_copy")
        delay_copy()
        v.host_actions.copy_(v.step_action, non_blocking=nb)
        if nb:
            actions_ready[group].record()

    def step_envs(group: int, t: int) -> None:
        """Steps one group's environments with the actions of step t, and queues the copy of what they
        return into slot t + 1 of the experience."""
        v = views[group]
        if nb:
            actions_ready[group].synchronize()
        timer.enter("env")
        next_obs, rewards, dones = envs[group].step(v.host_actions.numpy())
        timer.enter("eval_copy")
        slot = t % 2
        if nb:
            slot_free[group][slot].synchronize()
        v.host_obs[slot].numpy()[:] = next_obs
        v.host_rewards[slot].numpy()[:] = rewards
        v.host_dones[slot].numpy()[:] = dones
        with torch.cuda.stream(copy_stream) if copy_stream is not None else contextlib.nullcontext():
            delay_copy()
            v.obs[t + 1].copy_(v.host_obs[slot], non_blocking=nb)
            v.rewards[t].copy_(v.host_rewards[slot], non_blocking=nb)
            v.dones[t].copy_(v.host_dones[slot], non_blocking=nb)
            if slot_free is not None:
                slot_free[group][slot].record()
        if copy_stream is not None:
            obs_ready.record(copy_stream)
            torch.cuda.current_stream().wait_event(obs_ready)
        v.starts[t + 1].copy_(v.dones[t])

    first_obs = np.concatenate([env.reset() for env in envs])
    obs_buf[T].copy_(torch.from_numpy(first_obs))
    starts_buf[T].fill_(1.0)
    epochs: list[dict] = []
    total_episodes = 0
    warmup_end = None

    for epoch in range(cfg.num_epochs):
        if epoch == cfg.warmup_epochs:
            # Capture, then the profiler, then the steady clock: capture's launches are never traced, and
            # neither is charged to a steady epoch.
            if cfg.cuda_graphs:
                capture_start = time.perf_counter()
                capture_graphs()
                compile_seconds += time.perf_counter() - capture_start
            if cfg.trace_dir:
                profiler = start_profiler(cfg, device, rank.rank)
            warmup_end = time.perf_counter()
            steady_start_ns = time.time_ns()
        traced = profiler is not None and epoch < cfg.warmup_epochs + cfg.trace_epochs
        timer.trace_ranges = timer.record_timeline = traced
        timer.start_epoch()

        # rollout: while the host steps one group's environments, the device computes the next group's
        # actions (with one group, the steps simply alternate)
        timer.enter("eval_misc")
        obs_buf[0].copy_(obs_buf[T])
        starts_buf[0].copy_(starts_buf[T])
        h0.copy_(h)
        c0.copy_(c)
        if copy_stream is not None:
            copy_stream.wait_stream(torch.cuda.current_stream())  # the last update read the buffers it writes
        for group in range(len(groups)):
            launch_step(group, 0)
        for t in range(T):
            rank.beat()
            for group in range(len(groups)):
                step_envs(group, t)
                if t + 1 < T:
                    launch_step(group, t + 1)

        # bootstrap value of the observation after the rollout, then advantages
        timer.enter("eval_forward")
        step_obs.copy_(obs_buf[T])
        step_start.copy_(starts_buf[T])
        saved_h, saved_c = h.clone(), c.clone()
        for step_fn in step_fns:
            step_fn()
        h.copy_(saved_h)
        c.copy_(saved_c)
        timer.enter("train_misc")
        advantages = gae(rewards_buf, values_buf, dones_buf, step_value, cfg.gamma, cfg.gae_lambda)
        returns = advantages + values_buf
        moments = rank.all_reduce_sum(torch.stack([advantages.sum(), (advantages**2).sum()]))
        count = advantages.numel() * rank.world_size
        mean = moments[0] / count
        std = (moments[1] / count - mean**2).clamp(min=0).sqrt()
        advantages = (advantages - mean) / (std + 1e-8)

        # update: minibatches of whole sequences
        stats.zero_()
        for _ in range(cfg.update_epochs):
            order = torch.randperm(n, device=device)
            for start in range(0, n, S):
                rank.beat()
                timer.enter("train_misc")
                idx = order[start:start + S]
                for name, source in (("obs", obs_buf[:T]), ("starts", starts_buf[:T]), ("actions", actions_buf),
                                     ("logprobs", logprobs_buf), ("advantages", advantages), ("returns", returns),
                                     ("values", values_buf)):
                    torch.index_select(source, 1, idx, out=mb[name])
                torch.index_select(h0, 0, idx, out=mb["h0"])
                torch.index_select(c0, 0, idx, out=mb["c0"])
                timer.enter("train_forward")
                forward_fn()
                timer.enter("learn")
                learn_fn()

        # log: the one read of device statistics this epoch
        timer.enter("log")
        finished = np.concatenate([env.drain_episodes()[0] for env in envs])
        totals = torch.cat([stats, torch.tensor([finished.sum(), finished.size], device=device, dtype=stats.dtype)])
        totals = rank.all_reduce_sum(totals).cpu()
        updates = cfg.update_epochs * (n // S) * rank.world_size
        losses = {name: float(totals[i]) / updates for i, name in enumerate(STAT_NAMES)}
        episodes_done = int(totals[-1])
        total_episodes += episodes_done
        if cfg.anneal_lr:
            lr.fill_(cfg.learning_rate * (1.0 - (epoch + 1) / cfg.num_epochs))
        seconds, phases = timer.end_epoch()
        if profiler is not None:
            profiler.step()
        record = {
            "epoch": epoch, "steps": cfg.batch_size, "seconds": seconds, "warmup": epoch < cfg.warmup_epochs,
            "phases": phases, "losses": losses,
            "mean_episode_return": float(totals[-2]) / episodes_done if episodes_done else None,
        }
        epochs.append(record)
        if on_epoch is not None:
            on_epoch(record)

    steady_end_ns = time.time_ns()
    if profiler is not None:
        profiler.stop()
    if save_policy and rank.rank == 0:
        torch.save(policy.state_dict(), save_policy)
    wall = time.perf_counter() - process_start
    summary = summarize(cfg, epochs, wall, warmup_end - process_start, compile_seconds, total_episodes, dtype_used,
                        device, timer.timeline, profiler)
    summary["steady_window_unix_ns"] = [steady_start_ns, steady_end_ns]
    return summary


def start_profiler(cfg: TrainConfig, device: torch.device, rank: int):
    """Starts recording the next `trace_epochs` epochs. The profiler's warm-up step is taken here, outside
    every epoch, so its start-up cost lands in no traced or timed epoch."""
    from pathlib import Path

    out = Path(cfg.trace_dir)
    out.mkdir(parents=True, exist_ok=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)

    def export(prof) -> None:
        path = out / trace_file_name(rank)
        prof.export_chrome_trace(str(path))
        prof.trace_path = str(path)

    profiler = torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=0, warmup=1, active=cfg.trace_epochs, repeat=1),
        on_trace_ready=export,
    )
    profiler.start()
    profiler.step()
    return profiler


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
        "device_uuid": f"GPU-{torch.cuda.get_device_properties(device).uuid}" if device.type == "cuda" else None,
        "versions": versions(),
    }
    if profiler is not None:
        summary["trace"] = getattr(profiler, "trace_path", None)
        summary["timeline"] = [list(mark) for mark in timeline]
    return summary
