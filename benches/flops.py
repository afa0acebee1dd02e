"""Model FLOP/s the trainer achieves, against what a plain matmul reaches on the same machine.

    python -m benches.flops [--num-envs 1024 --horizon 64 --hidden-size 128 --minibatch-size 8192] [--device cuda]

FLOPs per forward and per forward+backward come from torch's FlopCounterMode on the real policy; the
trainer's own phase times (a real `train` run) turn them into achieved FLOP/s per phase. The reference is
a float32 matmul shaped like the LSTM's gate product over a whole minibatch, on the trainer's device (on CUDA
with torch's default matmul precision, so TF32 only where it has been turned on).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from reference_trainer.config import ConfigError, TrainConfig, validate
from reference_trainer.policy import Policy
from reference_trainer.train import train, training_device


def count_flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def matmul_flops_per_second(rows: int, inner: int, cols: int, device: torch.device, seconds: float = 2.0) -> float:
    a, b = torch.randn(rows, inner, device=device), torch.randn(inner, cols, device=device)
    # On a GPU the host only queues matmuls: wait for each batch of them, so the clock reads work done.
    batch = 1 if device.type == "cpu" else 20

    def wait() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(3):
        a @ b
    wait()
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(batch):
            a @ b
        wait()
        done += batch
    return 2 * rows * inner * cols * done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--horizon", type=int, default=64)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--minibatch-size", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--compile", action="store_true", help="train with torch.compile (compile time excluded)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    args = parser.parse_args()
    try:
        cfg = validate(TrainConfig(env="synthetic", num_envs=args.num_envs, horizon=args.horizon,
                                   hidden_size=args.hidden_size, minibatch_size=args.minibatch_size, update_epochs=1,
                                   total_steps=args.num_envs * args.horizon * args.epochs, warmup_epochs=1,
                                   compile=args.compile, device=args.device))
        device = training_device(cfg, local_rank=0)
    except ConfigError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    T, S, H = cfg.horizon, cfg.minibatch_size // cfg.horizon, cfg.hidden_size
    policy = Policy(cfg.obs_size, cfg.num_actions, H, use_lstm=True, fused_cell=True).to(device)
    params = sum(p.numel() for p in policy.parameters())
    obs, starts = torch.randn(T, S, cfg.obs_size, device=device), torch.zeros(T, S, device=device)
    h = c = torch.zeros(S, H, device=device)

    def forward():
        with torch.no_grad():
            policy(obs, h, c, starts)

    def forward_backward():
        logits, values = policy(obs, h, c, starts)
        (logits.sum() + values.sum()).backward()

    forward_flops = count_flops(forward)  # per minibatch = per cfg.minibatch_size agent steps
    learn_flops = count_flops(forward_backward) - forward_flops
    summary = train(cfg)
    minibatches = cfg.batch_size // cfg.minibatch_size * (cfg.num_epochs - cfg.warmup_epochs)
    phases = summary["phases"]
    rollout_flops = forward_flops * minibatches  # one forward per agent step, batched per env step
    rates = {
        "eval_forward": rollout_flops / phases["eval_forward"],
        "train_forward": forward_flops * minibatches / phases["train_forward"],
        "learn": learn_flops * minibatches / phases["learn"],
    }
    model_total = (2 * forward_flops + learn_flops) * minibatches / summary["steady_seconds"]
    reference = matmul_flops_per_second(cfg.minibatch_size, 2 * H, 4 * H, device)
    where = summary["device_name"] if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"policy: {params:,} parameters, LSTM {H}, horizon {T}, {cfg.num_envs} envs, minibatch {cfg.minibatch_size}, "
          f"{where}{', compiled' if cfg.compile else ''}")
    print(f"steady SPS {summary['sps']:,.0f}; matmul [{cfg.minibatch_size}x{2 * H}]x[{2 * H}x{4 * H}] "
          f"fp32 {reference / 1e9:.1f} GFLOP/s")
    for phase, rate in rates.items():
        print(f"  {phase:<14} {rate / 1e9:7.1f} GFLOP/s  ({100 * rate / reference:5.1f}% of the matmul)")
    print(f"  {'whole epoch':<14} {model_total / 1e9:7.1f} GFLOP/s  ({100 * model_total / reference:5.1f}% of the matmul)")


if __name__ == "__main__":
    main()
