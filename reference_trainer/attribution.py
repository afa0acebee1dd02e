"""The reference trainer's runs for `rlperf selfcheck`: a short training whose delays land in every other epoch
(decisions/attribution.py judges where they landed). Small enough for a selfcheck to take seconds a run."""

from __future__ import annotations

from reference_trainer.config import TrainConfig, validate

WARMUP_EPOCHS = 2


def selfcheck_config(delays_ms: dict[str, float], epochs: int, device: str, delay_every: int = 2) -> TrainConfig:
    """A training of `epochs` epochs with `delays_ms` injected in every `delay_every`th epoch."""
    return validate(TrainConfig(env="synthetic", num_envs=32, horizon=16, minibatch_size=256, update_epochs=1,
                                hidden_size=32, total_steps=32 * 16 * epochs, warmup_epochs=WARMUP_EPOCHS,
                                device=device, inject_delay=dict(delays_ms), inject_delay_every=delay_every))
