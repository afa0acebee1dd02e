"""What this machine can run, asked of a fresh interpreter so that the harness process never creates a CUDA
context of its own (each point gets a clean one), and decided here rather than by letting points crash.

Run as `python -m benches.probe`: prints one JSON object.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from rlperf.errors import BadInput


def describe_torch() -> dict[str, Any]:
    import torch

    gpus = []
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        gpus.append({
            "index": index,
            "name": props.name,
            # NVML names GPUs "GPU-<uuid>"; matching that form lets the sampler find the GPUs a point uses
            # even when CUDA_VISIBLE_DEVICES renumbers them.
            "uuid": f"GPU-{props.uuid}",
            "bf16": (props.major, props.minor) >= (8, 0),
        })
    nccl = None
    if torch.cuda.is_available() and torch.distributed.is_nccl_available():
        nccl = ".".join(str(part) for part in torch.cuda.nccl.version())
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "nccl": nccl,
        "gpus": gpus,
    }


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
            return None
        if not self.gpus:
            built = f"torch {self.torch} built with CUDA {self.cuda}" if self.cuda else f"torch {self.torch} (CPU build)"
            return f"device={config['device']} needs a CUDA GPU; none is visible ({built})"
        first = int(config["device"].partition(":")[2] or 0)
        needed = first + config["world_size"]
        if needed > len(self.gpus):
            return (f"device={config['device']} with world_size={config['world_size']} needs {needed} GPUs; "
                    f"{len(self.gpus)} visible")
        if config["dtype"] == "bf16" and not all(gpu["bf16"] for gpu in self.gpus[first:needed]):
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


def probe(python: str = sys.executable, timeout_s: float = 120.0) -> Machine:
    try:
        done = subprocess.run([python, "-m", "benches.probe"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BadInput(f"torch: `{python} -m benches.probe` did not answer within {timeout_s:.0f} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise BadInput(f"torch: `{python} -m benches.probe` failed: {last}")
    return Machine(**json.loads(done.stdout))


if __name__ == "__main__":
    json.dump(describe_torch(), sys.stdout)
    sys.stdout.write("\n")
