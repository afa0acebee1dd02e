"""Shared fixtures for the micro-benchmarks: the devices to measure on, and timing that waits for the GPU."""

from __future__ import annotations

import pytest
import torch

# The CUDA cases carry the gpu marker: tests/test_gpu_micro.py runs them in the GPU job's `pytest -m gpu`, and
# tests/test_bench_micro.py only the CPU cases, whatever the machine has.
DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.gpu)] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    return torch.device(request.param)


@pytest.fixture
def timed(benchmark, device):
    """Runs `fn` under pytest-benchmark, synchronizing after each call so queued GPU work is counted."""

    def run(fn, *args):
        def call():
            result = fn(*args)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return result

        call()  # the first call pays for allocator growth and kernel selection
        return benchmark(call)

    return run
