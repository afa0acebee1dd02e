"""Steady SPS of the frontier's targets on one GPU, one configuration after another in one process (no interpreter,
import or CUDA start-up between them), each for a steady window of `steady_seconds` after two warm-up epochs.

    python results/gpu-checks-frontier/sweep.py old|new DEADLINE_UNIX OUT.jsonl [TRACE_DIR]

Run from the root of the code to measure: `old` is the code before graph_scope (the step path only, from a worktree
or `git archive` of it, with PYTHONPATH=. there), `new` this checkout. Stops before a configuration once less than
20 s are left before DEADLINE_UNIX. Each line of OUT.jsonl is one configuration's side, name, settings, the
reference_trainer it imported, steady SPS, phase shares, warm-up and capture seconds, dtype used and peak GPU
memory, or the error that ended it. With TRACE_DIR, each configuration also runs three epochs with the last one
traced, and its line adds that epoch's GPU busy share, kernels and launches per agent step and kernels by phase.
"""

import gc
import json
import sys
import time

import torch

from reference_trainer import train as trainer
from reference_trainer.config import from_dict

BASE = {"device": "cuda", "hidden_size": 128, "horizon": 64, "update_epochs": 1, "warmup_epochs": 2,
        "steady_seconds": 2.5}


def point(envs: int, **knobs) -> dict:
    return {**BASE, "env": "synthetic-device", "num_envs": envs, "minibatch_size": 4 * envs,
            "total_steps": 64 * envs * 40, **knobs}


# the targets' two points on both sides, then the whole calls this code adds
BOTH_SIDES = [
    ("graphs 8192 synthetic-device", point(8192, cuda_graphs=True)),
    ("eager 8192 synthetic-device", point(8192)),
    ("eager 4096 synthetic", point(4096, env="synthetic")),
]
NEW_ONLY = [
    ("graphs 8192 synthetic-device, graph_scope both", point(8192, cuda_graphs=True, graph_scope="both")),
    ("graphs 8192 synthetic-device, graph_scope update", point(8192, cuda_graphs=True, graph_scope="update")),
    ("graphs 8192 synthetic-device, graph_scope rollout", point(8192, cuda_graphs=True, graph_scope="rollout")),
]


def main() -> None:
    side, deadline, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    trace_root = sys.argv[4] if len(sys.argv) > 4 else None
    configs = BOTH_SIDES + (NEW_ONLY if side == "new" else [])
    for name, settings in configs:
        if time.time() > deadline - 20:
            print(f"stopped before {name}: deadline", flush=True)
            break
        started = time.time()
        torch.cuda.reset_peak_memory_stats()
        row = {"side": side, "name": name, "settings": settings, "code": trainer.__file__}
        try:
            summary = trainer.train(from_dict(settings))
            total = sum(summary["phases"].values())
            # a trainer that records its memory resets the allocator's peaks at each phase boundary: its own figure
            # (the steady epochs') is the peak then; an older one's is the allocator's over the whole run
            steady_peak = (summary.get("memory") or {}).get("device_peak_allocated_bytes")
            row.update({"sps": summary["sps"], "shares": {k: round(v / total, 3) for k, v in summary["phases"].items()},
                        "warmup_seconds": summary["warmup_seconds"], "compile_seconds": summary["compile_seconds"],
                        "steady_steps": summary["steady_steps"], "dtype_used": summary["dtype_used"],
                        "peak_gib": (steady_peak if steady_peak is not None else torch.cuda.max_memory_allocated())
                        / 2 ** 30, "peak_of": "steady epochs" if steady_peak is not None else "whole run",
                        "wall": time.time() - started})
            if trace_root and time.time() < deadline - 20:
                row["traced"] = traced_epoch(settings, f"{trace_root}/{side}-{name.replace(' ', '_').replace(',', '')}")
        except Exception as error:  # one configuration's failure must not cost the others their figures
            row["error"] = f"{type(error).__name__}: {error}"
        print(json.dumps(row), flush=True)
        with open(out, "a") as handle:
            handle.write(json.dumps(row) + "\n")
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def traced_epoch(settings: dict, trace_dir: str) -> dict:
    """One traced steady epoch after the warm-up, summarised as `rlperf profile` does: what each configuration puts
    on the GPU per agent step, read from the trace rather than from timers."""
    from profilers.trace_summary import summarize_trace

    traced = {**settings, "total_steps": 3 * settings["num_envs"] * settings["horizon"], "steady_seconds": 0.0,
              "trace_dir": trace_dir, "trace_epochs": 1}
    summary = trainer.train(from_dict(traced))
    trace = summarize_trace(summary["trace"], summary)
    return {"busy_fraction": (trace.get("gpu") or {}).get("busy_fraction"),
            "kernels_per_agent_step": trace.get("kernels_per_env_step"),
            "launches_per_agent_step": trace.get("launches_per_env_step"),
            "kernels_by_phase": trace.get("kernels_by_phase"), "gpu_unavailable": trace.get("gpu_unavailable")}


if __name__ == "__main__":
    main()
