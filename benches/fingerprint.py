"""A run's fingerprint: everything about the code and the machine that can move a throughput figure.

Results are only compared between runs whose `machine_key` (a hash of the comparability fields) matches;
the rest of the fingerprint explains differences (clocks, power limits, thread settings, a dirty tree).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from benches.probe import Machine

REPO_ROOT = Path(__file__).resolve().parents[1]
# Settings read by the math libraries and the CUDA runtime at start-up; any of them can change SPS.
THREAD_ENV = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "OMP_PROC_BIND", "OMP_PLACES", "KMP_AFFINITY", "GOMP_CPU_AFFINITY", "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_LAUNCH_BLOCKING", "PYTORCH_CUDA_ALLOC_CONF", "TORCHINDUCTOR_COMPILE_THREADS",
)


def git_state() -> dict[str, Any]:
    """Commit and whether tracked files differ from it (untracked files do not count)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, subprocess.SubprocessError) as exc:
        return {"commit": None, "dirty": None, "unavailable": f"git: {exc}"}


def nvml_gpus() -> list[dict[str, Any]] | str:
    """Every GPU NVML sees (NVML ignores CUDA_VISIBLE_DEVICES), or "unavailable: <why>"."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # the library raises its own error classes, or ImportError when absent
        return f"unavailable: {type(exc).__name__}: {exc}"
    try:
        driver = text(pynvml.nvmlSystemGetDriverVersion())
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)

            def ask(query, *args, scale=1.0, _handle=handle):
                try:
                    return query(_handle, *args) * scale
                except pynvml.NVMLError:
                    return None  # not supported on this board

            gpus.append({
                "index": index,
                "name": text(pynvml.nvmlDeviceGetName(handle)),
                "uuid": text(pynvml.nvmlDeviceGetUUID(handle)),
                "driver": driver,
                "sm_clock_max_mhz": ask(pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_SM),
                "mem_clock_max_mhz": ask(pynvml.nvmlDeviceGetMaxClockInfo, pynvml.NVML_CLOCK_MEM),
                "power_limit_w": ask(pynvml.nvmlDeviceGetEnforcedPowerLimit, scale=1e-3),
            })
        return gpus
    except pynvml.NVMLError as exc:
        return f"unavailable: {exc}"
    finally:
        pynvml.nvmlShutdown()


def text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def collect(machine: Machine, suite_hash: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "git": git_state(),
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "torch": machine.torch,
        "cuda": machine.cuda,
        "cudnn": machine.cudnn,
        "nccl": machine.nccl,
        "gpus": nvml_gpus(),
        "cuda_devices": machine.gpus,
        "cpu": {"model": cpu_model(), "cores_logical": psutil.cpu_count(logical=True),
                "cores_physical": psutil.cpu_count(logical=False)},
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "thread_env": {name: os.environ.get(name) for name in THREAD_ENV},
        "suite_hash": suite_hash,
        "suite_overrides": overrides or {},
    }


def machine_key(fingerprint: dict[str, Any]) -> str:
    """Hash of what makes two runs comparable: GPU models, CPU model and cores, torch and CUDA versions."""
    gpus = fingerprint["gpus"]
    comparable = {
        "gpus": [gpu["name"] for gpu in (gpus if isinstance(gpus, list) else fingerprint["cuda_devices"])],
        "cpu_model": fingerprint["cpu"]["model"],
        "cores_logical": fingerprint["cpu"]["cores_logical"],
        "torch": fingerprint["torch"],
        "cuda": fingerprint["cuda"],
    }
    return hashlib.sha256(json.dumps(comparable, sort_keys=True).encode()).hexdigest()[:16]
