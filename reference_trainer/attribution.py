"""What `rlperf selfcheck` checks: that the phase breakdown puts time where it was spent.

For each phase, a short training with a known delay injected into that phase once per epoch; the share
of the delay that the breakdown attributed to that phase is (delayed run's median per-epoch phase time -
baseline's) / delay. Medians over epochs keep one noisy epoch from deciding the verdict. A last run
injects the delay into every phase at once: each phase must still receive its own delay, so a delay
charged to the phase after it (or counted in both) cannot pass by landing where another was expected.
The command itself (command/selfcheck.py) brackets every training with the interference monitor.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from reference_trainer.config import PHASES, TrainConfig, validate

REQUIRED_SHARE = 0.95
ALL_AT_ONCE = "(all phases delayed)"
BASELINE = "baseline"


def median_phase_seconds(summary: dict, phase: str) -> float:
    return statistics.median(e["phases"][phase] for e in summary["epochs"] if not e["warmup"])


def runs(delay_ms: float, epochs: int, device: str) -> dict[str, TrainConfig]:
    """The trainings a check takes, by name: the baseline, one per phase delayed, and all delayed at once."""
    base = dict(env="synthetic", num_envs=32, horizon=16, minibatch_size=256, update_epochs=1, hidden_size=32,
                total_steps=32 * 16 * epochs, warmup_epochs=2, device=device)
    return {
        BASELINE: validate(TrainConfig(**base)),
        **{phase: validate(TrainConfig(**base, inject_delay={phase: delay_ms})) for phase in PHASES},
        ALL_AT_ONCE: validate(TrainConfig(**base, inject_delay=dict.fromkeys(PHASES, delay_ms))),
    }


def attributed_shares(delay_ms: float, epochs: int, device: str,
                      trained: Callable[[str, TrainConfig], dict] | None = None) -> dict[str, float]:
    """Per row (a phase alone, then each phase with all delayed), the share of the delay attributed to the
    phase; `trained(name, config)` runs one of `runs` and returns its summary (default: `train`, here)."""
    if trained is None:
        from reference_trainer.train import train

        def trained(name: str, config: TrainConfig) -> dict:
            return train(config)

    summaries = {name: trained(name, config) for name, config in runs(delay_ms, epochs, device).items()}
    shares = {}
    for row in [*PHASES, *(f"{phase} {ALL_AT_ONCE}" for phase in PHASES)]:
        phase = row.split()[0]
        extra = median_phase_seconds(summaries[delayed_run(row)], phase) - \
            median_phase_seconds(summaries[BASELINE], phase)
        shares[row] = extra / (delay_ms / 1000.0)
    return shares


def delayed_run(row: str) -> str:
    """The name of the run whose delay a row of `attributed_shares` measures."""
    return ALL_AT_ONCE if row.endswith(ALL_AT_ONCE) else row
