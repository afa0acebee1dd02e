"""The GPU paths' logic that does not need a GPU: which device a rank uses, the rules that refuse knobs,
the compile-time accounting and the per-rank trace names. The CUDA behaviour itself is in
tests/test_gpu_knobs.py."""

import pytest

from reference_trainer.config import ConfigError, TrainConfig, validate

SMALL = dict(env="synthetic", num_envs=8, horizon=4, minibatch_size=16, hidden_size=8, total_steps=96, threads=1)


def test_cuda_graphs_need_an_eager_warmup_epoch_before_capture():
    cfg = TrainConfig(**{**SMALL, "device": "cuda", "cuda_graphs": True, "warmup_epochs": 0})
    with pytest.raises(ConfigError) as refused:
        validate(cfg)
    assert refused.value.field_name == "warmup_epochs"
    validate(TrainConfig(**{**SMALL, "device": "cuda", "cuda_graphs": True, "warmup_epochs": 1}))
