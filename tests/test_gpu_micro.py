"""The micro-benchmarks' CUDA cases, run once each with timing off under `-m gpu`, so the nightly GPU job
(which collects tests/ only) checks their results too. Skips without CUDA."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_gpu_micro_benchmarks_run_and_agree_with_their_references():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "benches/micro", "-m", "gpu", "-p", "no:cacheprovider",
         "-o", "testpaths=benches/micro", "--benchmark-disable", "-q"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    passed = re.search(r"(\d+) passed", done.stdout)
    # 16 copy cases, 2 GAE, 10 LSTM and 2 PPO-loss cases on CUDA; none may skip or vanish
    assert passed and int(passed.group(1)) >= 30 and "skipped" not in done.stdout, done.stdout[-3000:]
