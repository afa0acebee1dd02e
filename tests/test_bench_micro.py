"""The micro-benchmarks run (once each, timing off) and check their own results, so they cannot rot: their CPU
cases here, whatever the machine has; their CUDA cases in tests/test_gpu_micro.py, under `-m gpu`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_micro_benchmarks_run_and_agree_with_their_references_on_the_cpu():
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "benches/micro", "-p", "no:cacheprovider", "-o", "testpaths=benches/micro",
         "--benchmark-disable", "-q", "-rA", "-m", "not gpu"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    passed = re.search(r"(\d+) passed", done.stdout)
    assert passed and int(passed.group(1)) >= 12, done.stdout[-3000:]
    ran = re.findall(r"^PASSED (\S+)", done.stdout, re.MULTILINE)
    assert ran and not [case for case in ran if "cuda" in case], done.stdout[-3000:]
