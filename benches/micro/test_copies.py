"""Host<->device copies of an observation-sized buffer: pageable against pinned host memory, blocking
against non_blocking. Needs CUDA; skipped without it."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="host<->device copies need a CUDA device")]

SIZES = {"obs_1MiB": 1 << 20, "batch_64MiB": 64 << 20}


def host_buffer(nbytes, pinned):
    return torch.empty(nbytes // 4, dtype=torch.float32, pin_memory=pinned).uniform_()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
@pytest.mark.parametrize("non_blocking", [False, True], ids=["blocking", "non_blocking"])
def test_host_to_device(benchmark, size, pinned, non_blocking):
    source = host_buffer(SIZES[size], pinned)
    target = torch.empty_like(source, device="cuda")

    def copy():
        target.copy_(source, non_blocking=non_blocking)
        torch.cuda.synchronize()

    copy()
    benchmark(copy)
    torch.testing.assert_close(target.cpu(), source)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
@pytest.mark.parametrize("non_blocking", [False, True], ids=["blocking", "non_blocking"])
def test_device_to_host(benchmark, size, pinned, non_blocking):
    source = torch.rand(SIZES[size] // 4, device="cuda")
    target = host_buffer(SIZES[size], pinned)

    def copy():
        target.copy_(source, non_blocking=non_blocking)
        # a non_blocking copy into host memory is only safe to read after the stream has reached it
        torch.cuda.synchronize()

    copy()
    benchmark(copy)
    torch.testing.assert_close(target, source.cpu())
