"""Steady SPS of trainer configurations on one GPU, one after another in one process (no interpreter, import
or CUDA start-up between them), each for a steady window of `steady_seconds` after two warm-up epochs.

    python results/nvidia-h100-2026-11-27/sweep.py DEADLINE_UNIX OUT.jsonl

Stops before a configuration once less than 15 s are left before DEADLINE_UNIX. Each line of OUT.jsonl is one
configuration's name, settings, steady SPS, phase shares, warm-up and capture seconds, dtype used and peak
GPU memory."""

import gc
import json
import sys
import time

import torch

from reference_trainer.config import from_dict
from reference_trainer.train import train

BASE = {"device": "cuda", "hidden_size": 128, "horizon": 64, "update_epochs": 1, "warmup_epochs": 2,
        "steady_seconds": 2.5}


def point(envs: int, **knobs) -> dict:
    return {**BASE, "env": "synthetic-device", "num_envs": envs, "minibatch_size": 4 * envs,
            "total_steps": 64 * envs * 40, **knobs}


CONFIGS = [
    ("eager 4096 synthetic", point(4096, env="synthetic")),
    ("graphs 4096 synthetic", point(4096, env="synthetic", cuda_graphs=True)),
    ("eager 4096 synthetic-device", point(4096)),
    ("graphs 4096 synthetic-device", point(4096, cuda_graphs=True)),
    ("graphs 8192 synthetic-device", point(8192, cuda_graphs=True)),
    ("graphs 8192 synthetic", point(8192, env="synthetic", cuda_graphs=True)),
    ("eager 8192 synthetic-device", point(8192)),
    ("LSTM-512 graphs fp32", point(4096, hidden_size=512, cuda_graphs=True)),
    ("LSTM-512 graphs bf16", point(4096, hidden_size=512, cuda_graphs=True, dtype="bf16")),
    ("LSTM-512 eager fp32", point(4096, hidden_size=512)),
    ("LSTM-512 eager bf16", point(4096, hidden_size=512, dtype="bf16")),
    ("LSTM-1024 graphs fp32", point(4096, hidden_size=1024, cuda_graphs=True)),
    ("LSTM-1024 graphs bf16", point(4096, hidden_size=1024, cuda_graphs=True, dtype="bf16")),
    ("LSTM-128 graphs bf16", point(4096, cuda_graphs=True, dtype="bf16")),
    ("LSTM-128 eager bf16", point(4096, dtype="bf16")),
    ("graphs 1024 synthetic-device", point(1024, cuda_graphs=True)),
    ("graphs 16384 synthetic-device", point(16384, cuda_graphs=True)),
    ("graphs 65536 synthetic-device", point(65536, cuda_graphs=True)),
]


def main() -> None:
    deadline, out = float(sys.argv[1]), sys.argv[2]
    for name, settings in CONFIGS:
        if time.time() > deadline - 15:
            print(f"stopped before {name}: deadline", flush=True)
            break
        started = time.time()
        torch.cuda.reset_peak_memory_stats()
        try:
            summary = train(from_dict(settings))
            total = sum(summary["phases"].values())
            row = {"name": name, "settings": settings, "sps": summary["sps"],
                   "shares": {k: round(v / total, 3) for k, v in summary["phases"].items()},
                   "warmup_seconds": summary["warmup_seconds"], "setup_seconds": summary["setup_seconds"],
                   "compile_seconds": summary["compile_seconds"],
                   "steady_steps": summary["steady_steps"], "dtype_used": summary["dtype_used"],
                   "peak_gib": torch.cuda.max_memory_allocated() / 2 ** 30, "wall": time.time() - started}
        except Exception as error:  # one configuration's failure must not cost the others their figures
            row = {"name": name, "settings": settings, "error": f"{type(error).__name__}: {error}"}
        print(json.dumps(row), flush=True)
        with open(out, "a") as handle:
            handle.write(json.dumps(row) + "\n")
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
