"""`rlperf attach` on the registry's trainers at settings larger than the tests' (docs/any-trainer.md quotes
them): for stable-baselines3's and TorchRL's PPO, the named phases' share of the steady time, the agent steps
counted against the trainer's own count, and the share of a delay injected into each attached phase that lands
there (`rlperf selfcheck`'s runs: one phase at a time, then all at once). Timings: run it on a quiet machine.

    python -m benches.attach_trainers --out runs/attach-trainers.json [--trainer sb3|torchrl]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from profilers.command_check import ATTACHED_PHASES, command_runs, command_summary
from rlperf.summary import RunSummary

TRAINERS = {
    "sb3": ([sys.executable, "-m", "benches.trainers.sb3_ppo", "--n-envs", "16", "--n-steps", "128",
             "--batch-size", "512", "--n-epochs", "4", "--net", "256", "--updates", "8"], "num_timesteps"),
    "torchrl": ([sys.executable, "-m", "benches.trainers.torchrl_ppo", "--n-envs", "16", "--n-steps", "64",
                 "--batch-size", "512", "--n-epochs", "4", "--net", "256", "--updates", "8"], "collected_frames"),
}
DELAY_MS = 100.0
TIMEOUT_S = 600.0


def measure(name: str) -> dict:
    command, own_key = TRAINERS[name]
    started = time.monotonic()
    outputs: dict[str, RunSummary] = {}

    def run(label: str, delays: dict[str, float]):
        summary = command_summary(command, delays, True, TIMEOUT_S)
        print(f"{name} {label}: SPS {summary.sps:,.0f}, named phases {summary.phase_coverage:.1%}", flush=True)
        outputs[label] = summary
        return summary

    shares = command_runs(command, DELAY_MS, ATTACHED_PHASES, True, TIMEOUT_S, run)
    plain = outputs["baseline"]
    own = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
    return {
        "command": command, "delay_ms": DELAY_MS,
        "phases": plain.phases, "steady_seconds": plain.steady_seconds, "phase_coverage": plain.phase_coverage,
        "other_share": plain.phases["other"] / plain.steady_seconds, "sps": plain.sps,
        "steps_counted": plain.steps, "steady_steps": plain.steady_steps, "own_count": own[own_key],
        "own_count_name": own_key, "selfcheck_shares": shares, "seconds": time.monotonic() - started,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benches.attach_trainers", description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", choices=sorted(TRAINERS), action="append")
    parser.add_argument("--out", type=Path, required=True)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    results = {name: measure(name) for name in (args.trainer or sorted(TRAINERS))}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    for name, result in results.items():
        worst = min(result["selfcheck_shares"].items(), key=lambda item: item[1])
        print(f"{name}: named phases {result['phase_coverage']:.1%} of the steady time (other "
              f"{result['other_share']:.1%}); steps counted {result['steps_counted']:,} = {result['own_count_name']} "
              f"{result['own_count']:,}: {result['steps_counted'] == result['own_count']}; selfcheck lowest share "
              f"{worst[0]} {worst[1]:.1%}")


if __name__ == "__main__":
    main()
