"""`rlperf selfcheck`: proves the phase breakdown puts time where it was spent.

For each phase, a short training with a known delay injected into that phase once per epoch; the share
of the delay that the breakdown attributed to that phase is (delayed run's median per-epoch phase time -
baseline's) / delay. Medians over epochs keep one noisy epoch from deciding the verdict. A last run
injects the delay into every phase at once: each phase must still receive its own delay, so a delay
charged to the phase after it (or counted in both) cannot pass by landing where another was expected.
"""

from __future__ import annotations

import argparse
import statistics

from reference_trainer.config import PHASES, TrainConfig, validate

REQUIRED_SHARE = 0.95
ALL_AT_ONCE = "(all phases delayed)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--delay-ms", type=float, default=40.0, help="delay injected per epoch (default 40)")
    parser.add_argument("--epochs", type=int, default=12, help="epochs per run (default 12)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")


def median_phase_seconds(summary: dict, phase: str) -> float:
    return statistics.median(e["phases"][phase] for e in summary["epochs"] if not e["warmup"])


def attributed_shares(delay_ms: float, epochs: int, device: str) -> dict[str, float]:
    from reference_trainer.train import train

    base = dict(env="synthetic", num_envs=32, horizon=16, minibatch_size=256, update_epochs=1, hidden_size=32,
                total_steps=32 * 16 * epochs, warmup_epochs=2, device=device)
    baseline = train(validate(TrainConfig(**base)))
    shares = {}
    for phase in PHASES:
        delayed = train(validate(TrainConfig(**base, inject_delay={phase: delay_ms})))
        extra = median_phase_seconds(delayed, phase) - median_phase_seconds(baseline, phase)
        shares[phase] = extra / (delay_ms / 1000.0)
    together = train(validate(TrainConfig(**base, inject_delay=dict.fromkeys(PHASES, delay_ms))))
    for phase in PHASES:
        extra = median_phase_seconds(together, phase) - median_phase_seconds(baseline, phase)
        shares[f"{phase} {ALL_AT_ONCE}"] = extra / (delay_ms / 1000.0)
    return shares


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from rlperf.errors import BadInput

    if args.delay_ms <= 0 or args.epochs < 4:
        raise BadInput("--delay-ms must be positive and --epochs at least 4")
    shares = attributed_shares(args.delay_ms, args.epochs, args.device)
    table = Table(title=f"{args.delay_ms:g} ms injected per epoch; share attributed to the phase")
    table.add_column("phase")
    table.add_column("attributed", justify="right")
    table.add_column("verdict")
    for phase, share in shares.items():
        ok = share >= REQUIRED_SHARE
        table.add_row(phase, f"{100 * share:.1f}%", "[green]ok[/green]" if ok else "[red]FAIL[/red]")
    Console().print(table)
    return 0 if all(share >= REQUIRED_SHARE for share in shares.values()) else 1
