"""What this machine can run, asked of a process of its own (a fresh interpreter, or a child of the fork server
that will fork the trainers) so that the harness process never creates a CUDA context of its own (each point
gets a clean one), and decided here rather than by letting points crash.

Run as `python -m rlperf.machine`: prints one JSON object.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from rlperf.cpus import cpu_ranks_refusal
from rlperf.errors import BadInput, MachineFault
from rlperf.forkserver import ForkServer, forkable
from rlperf.torch_api import supported_torch


def torch_versions() -> dict[str, Any]:
    """The versions of torch and the CUDA libraries it was built with (null where absent)."""
    import torch

    nccl = None
    if torch.cuda.is_available() and torch.distributed.is_nccl_available():
        nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": nccl,
    }


def cuda_uuid(device) -> str:
    """A CUDA device's UUID as NVML names it (`GPU-<uuid>`): NVML finds the device by it whatever
    CUDA_VISIBLE_DEVICES and CUDA's device order made of its index."""
    import torch

    return f"GPU-{torch.cuda.get_device_properties(device).uuid}"


def describe_torch() -> dict[str, Any]:
    import torch

    supported_torch()
    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append({"index": index, "name": props.name, "uuid": cuda_uuid(index),
                     "bf16": (props.major, props.minor) >= (8, 0)})
    return {**torch_versions(), "gpus": gpus}


@dataclass(frozen=True)
class Machine:
    torch: str
    cuda: str | None
    cudnn: int | None
    nccl: str | None
    gpus: list[dict[str, Any]] = field(default_factory=list)

    def skip_reason(self, config: dict[str, Any]) -> str | None:
        """Why a point cannot run here, or None when it can."""
        if not config["device"].startswith("cuda"):
            return cpu_ranks_refusal(config["world_size"])
        if not self.gpus:
            built = f"torch {self.torch} built with CUDA {self.cuda}" if self.cuda else f"torch {self.torch} (CPU build)"
            return f"device={config['device']} needs a CUDA GPU; none is visible ({built})"
        first = int(config["device"].partition(":")[2] or 0)
        needed = first + config["world_size"]
        if needed > len(self.gpus):
            return (f"device={config['device']} with world_size={config['world_size']} needs {needed} GPUs; "
                    f"{len(self.gpus)} visible")
        if config.get("dtype") == "bf16" and not all(gpu["bf16"] for gpu in self.gpus[first:needed]):
            return f"dtype=bf16 needs compute capability 8.0 or newer ({self.gpus[first]['name']})"
        return None

    def gpu_uuids(self, config: dict[str, Any]) -> list[str]:
        """NVML UUIDs of the GPUs a point runs on (none for a CPU point)."""
        if not config["device"].startswith("cuda"):
            return []
        first = int(config["device"].partition(":")[2] or 0)
        return [gpu["uuid"] for gpu in self.gpus[first:first + config["world_size"]]]

    def resolve_device(self, requested: str) -> str:
        """`auto` means the first GPU when there is one, else the CPU."""
        if requested == "auto":
            return "cuda" if self.gpus else "cpu"
        return requested


BAD_TORCH = 2  # the probe's exit code for a torch rlperf does not support


def probe(python: str = sys.executable, timeout_s: float = 120.0, server: ForkServer | None = None) -> Machine:
    """What `python`'s torch can run, asked of a child forked from `server` (whose imports are done) where one
    is given, else of a fresh interpreter. A torch rlperf does not support is bad input (exit 2); a probe that
    fails otherwise (a broken driver, a torch that cannot start) is a fault of the machine (exit 1)."""
    command = [python, "-m", "rlperf.machine"]
    try:
        if server is not None and forkable(command):
            done = server.run(command, timeout_s)
        else:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise MachineFault(f"torch: `{python} -m rlperf.machine` did not answer within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        if done.returncode == BAD_TORCH:
            raise BadInput(last)  # the probe's own line, naming torch and what is allowed
        raise MachineFault(f"torch: `{python} -m rlperf.machine` failed: {last}")
    return Machine(**json.loads(done.stdout))


REPO_ROOT = Path(__file__).resolve().parents[1]
REPOSITORY_VARIABLE = "RLPERF_REPOSITORY"
# Settings read by the math libraries and the CUDA runtime at start-up; any of them can change SPS.
THREAD_ENV = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
    "OMP_PROC_BIND", "OMP_PLACES", "KMP_AFFINITY", "GOMP_CPU_AFFINITY", "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_LAUNCH_BLOCKING", "PYTORCH_CUDA_ALLOC_CONF", "TORCHINDUCTOR_COMPILE_THREADS",
)


def measured_repository() -> Path:
    """The git repository whose commits are measured: rlperf's own, or the one a suite of commands lives in
    (RLPERF_REPOSITORY, set when such a suite is loaded: benches/suite.py)."""
    named = os.environ.get(REPOSITORY_VARIABLE)
    return Path(named) if named else REPO_ROOT


def git_state() -> dict[str, Any]:
    """Commit and whether tracked files differ from it (untracked files do not count)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=measured_repository(), capture_output=True, text=True, check=True,
                              timeout=30).stdout.strip()

    try:
        state = {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
        if measured_repository() != REPO_ROOT:  # a suite of commands' own repository: where its commits are
            state["repository"] = str(measured_repository())
        return state
    except (OSError, subprocess.SubprocessError) as exc:
        return {"commit": None, "dirty": None, "unavailable": f"git: {exc}"}


def commit_state(commit: str, ref: str | None = None) -> dict[str, Any]:
    """The fingerprint's `git` of a run that measured `commit` checked out clean (the gate's baseline, bisect's,
    confirm's): named as `git_state` names the working tree's, with the repository of a suite of commands, and the
    `ref` it was asked by, if any."""
    state: dict[str, Any] = {"commit": commit, "dirty": False}
    if ref is not None:
        state["ref"] = ref
    if measured_repository() != REPO_ROOT:
        state["repository"] = str(measured_repository())
    return state


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


def gpu_names(fingerprint: dict[str, Any]) -> list[str]:
    """NVML's list when it answered, else the devices torch saw (the fingerprint keeps NVML's reason)."""
    gpus = fingerprint.get("gpus")
    gpus = gpus if isinstance(gpus, list) else fingerprint.get("cuda_devices") or []
    return [gpu.get("name", "?") for gpu in gpus]


# What makes two runs comparable: machine_key hashes these, and reports name the ones that differ.
COMPARABLE = {
    "gpus": ("GPU models", gpu_names),
    "cpu_model": ("CPU model", lambda fp: (fp.get("cpu") or {}).get("model")),
    "cores_logical": ("CPU cores", lambda fp: (fp.get("cpu") or {}).get("cores_logical")),
    "torch": ("torch", lambda fp: fp.get("torch")),
    "cuda": ("CUDA", lambda fp: fp.get("cuda")),
}


def machine_key(fingerprint: dict[str, Any]) -> str:
    """Hash of what makes two runs comparable: GPU models, CPU model and cores, torch and CUDA versions."""
    comparable = {key: read(fingerprint) for key, (_, read) in COMPARABLE.items()}
    return hashlib.sha256(json.dumps(comparable, sort_keys=True).encode()).hexdigest()[:16]


def comparability_differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """`CPU cores: 2 vs 16`, one line per comparability field where two fingerprints differ."""
    def shown(value: Any) -> Any:
        return (sorted(value) or "none") if isinstance(value, list) else value

    return [f"{name}: {shown(read(a))} vs {shown(read(b))}" for name, read in COMPARABLE.values()
            if read(a) != read(b)]


def main() -> int:
    """Prints the description as one JSON object; a failure is one line on stderr, never a traceback, and
    exit code BAD_TORCH when the torch is one rlperf does not support."""
    try:
        described = describe_torch()
    except BadInput as exc:
        sys.stderr.write(f"{exc}\n")
        return BAD_TORCH
    except Exception as exc:  # whatever torch or the driver raised: the probe's caller reports it in one line
        sys.stderr.write(f"{type(exc).__name__}: {' '.join(str(exc).split())}\n")
        return 1
    json.dump(described, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
