"""Model FLOP/s the trainer achieves per phase, against the peaks measured on this machine.

    python -m benches.flops [--num-envs 1024 --horizon 64 --hidden-size 128 --minibatch-size 8192] [--compile]
    python -m benches.flops --encoder cnn --obs-shape 4,84,84 --obs-dtype uint8 --num-envs 64 --minibatch-size 1024

One real `train` run of the synthetic env; its summary counts each phase's work from the policy's shapes
(reference_trainer/work.py). Right after it, this process measures the peaks that work needs (benches/peak_probe.py:
the matrix-product peak, memory bandwidth, one op's cost, and each of the model's kernels at its own shape),
and holds the phases against them as every report does (reports/roofline.py). Nothing is stored.
"""

from __future__ import annotations

import argparse

import pandas as pd

from benches.peak_probe import measure
from reference_trainer.config import ConfigError, TrainConfig, validate
from reference_trainer.train import train
from reports.formatting import fmt_rate
from reports.roofline import point_figures, reading
from rlperf.peaks import MEMORY, Peaks, needs_for_work
from rlperf.store import utc_now


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--horizon", type=int, default=64)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--minibatch-size", type=int, default=8192)
    parser.add_argument("--encoder", default="mlp", help="mlp or cnn (default mlp)")
    parser.add_argument("--obs-shape", default="",
                        help="synthetic observations' shape, e.g. 4,84,84 (default: 32 values)")
    parser.add_argument("--obs-dtype", default="float32", help="float32 or uint8 (default float32)")
    parser.add_argument("--dtype", default="fp32", help="fp32, bf16 or fp16 (default fp32)")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--compile", action="store_true", help="train with torch.compile (compile time excluded)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    try:
        cfg = validate(TrainConfig(env="synthetic", num_envs=args.num_envs, horizon=args.horizon,
                                   hidden_size=args.hidden_size, minibatch_size=args.minibatch_size, update_epochs=1,
                                   encoder=args.encoder, obs_shape=args.obs_shape, obs_dtype=args.obs_dtype,
                                   dtype=args.dtype, total_steps=args.num_envs * args.horizon * args.epochs,
                                   warmup_epochs=1, compile=args.compile, device=args.device))
        summary = train(cfg)
    except ConfigError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    work = summary["work"]
    rows = measure(needs_for_work(cfg.device, summary["device_name"], work["threads"], work))
    known = Peaks(pd.DataFrame(rows).assign(measured_at=utc_now()))
    point = point_figures("", [summary], known)
    where = summary["device_name"] if cfg.is_cuda else f"{work['threads']} threads"
    print(f"policy: {summary['parameters']:,} parameters, {cfg.encoder} encoder, LSTM {cfg.hidden_size}, horizon "
          f"{cfg.horizon}, {cfg.num_envs} envs, minibatch {cfg.minibatch_size}, {where}"
          + (", compiled" if cfg.compile else ""))
    print(f"steady SPS {summary['sps']:,.0f}; {point.dtype} matrix-product peak {fmt_rate(point.roof, 'FLOP/s')}, "
          f"memory {fmt_rate(known.value(point.device_name, point.threads, MEMORY), 'B/s')}, one tiny op "
          f"{point.op_seconds * 1e6:.2f} µs")
    for phase in point.phases:
        print(f"  {phase.phase:<14} {fmt_rate(phase.achieved, 'FLOP/s'):>14}  {phase.of_ceiling:6.1%} of its ceiling "
              f"({fmt_rate(phase.ceiling, 'FLOP/s')}), {phase.of_roof:6.1%} of the peak")
    print(f"  {'whole epoch':<14} {fmt_rate(point.model_rate, 'FLOP/s'):>14}  {point.of_roof:6.1%} of the peak")
    for line in reading(point):
        print(f"  {line}")


if __name__ == "__main__":
    main()
