"""`rlperf attach` on the registry's trainers at settings larger than the tests' (docs/any-trainer.md quotes them):
for each trainer, the named phases' share of the steady time, the agent steps counted against the trainer's own
count, and the verdicts of repeated selfchecks (decisions/attribution.py: each delay in every other epoch, every
share judged against the band from its interval). Timings: run it on a quiet machine.

    python -m benches.attach_trainers --out runs/attach-trainers.json [--trainer sb3] [--selfchecks 10]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from decisions import attribution
from profilers.command_check import ATTACHED_PHASES, command_summary

PYTHON = sys.executable
TRAINERS = {
    "sb3": ([PYTHON, "-m", "benches.trainers.sb3_ppo", "--n-envs", "16", "--n-steps", "128", "--batch-size", "512",
             "--n-epochs", "4", "--net", "256", "--updates", "13"], "num_timesteps"),
    "torchrl": ([PYTHON, "-m", "benches.trainers.torchrl_ppo", "--n-envs", "16", "--n-steps", "64", "--batch-size",
                 "512", "--n-epochs", "4", "--net", "256", "--updates", "13"], "collected_frames"),
    "rsl_rl": ([PYTHON, "-m", "benches.trainers.rsl_rl_ppo", "--n-envs", "256", "--n-steps", "24", "--net", "256",
                "--updates", "13"], "tot_timesteps"),
    "tianshou": ([PYTHON, "-m", "benches.trainers.tianshou_ppo", "--n-envs", "16", "--n-steps", "128",
                  "--batch-size", "512", "--n-epochs", "4", "--net", "256", "--updates", "13"], "train_step"),
    "mlp_loop": ([PYTHON, "-m", "benches.trainers.mlp_loop", "--n-envs", "4", "--n-steps", "128", "--net", "64",
                  "--updates", "13"], "steps"),
}
DELAY_MS = 150.0
MAX_RUNS = 4
TIMEOUT_S = 600.0


def selfcheck(command: list[str]) -> dict:
    """One selfcheck of the command, as `rlperf selfcheck --delay-ms 150 -- COMMAND` runs it."""
    def run(label: str, delays: dict[str, float]) -> list[dict]:
        return command_summary(command, delays, True, TIMEOUT_S, delay_every=attribution.DELAY_EVERY).epochs

    rows = attribution.check(ATTACHED_PHASES, DELAY_MS, run, MAX_RUNS)
    return {row.row: {"verdict": row.verdict, "share": row.estimate, "interval": [row.low, row.high],
                      "pairs": len(row.shares), "runs": len(row.runs)} for row in rows.values()}


def measure(name: str, selfchecks: int) -> dict:
    command, own_key = TRAINERS[name]
    started = time.monotonic()
    plain = command_summary(command, {}, True, TIMEOUT_S)
    own = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
    checks = []
    for index in range(selfchecks):
        checks.append(selfcheck(command))
        verdicts = Counter(row["verdict"] for row in checks[-1].values())
        print(f"{name} selfcheck {index + 1}/{selfchecks}: {dict(verdicts)}", flush=True)
    return {
        "command": command, "delay_ms": DELAY_MS, "phases": plain.phases, "steady_seconds": plain.steady_seconds,
        "phase_coverage": plain.phase_coverage, "other_share": plain.phases["other"] / plain.steady_seconds,
        "sps": plain.sps, "steps_counted": plain.steps, "steady_steps": plain.steady_steps,
        "own_count": own[own_key], "own_count_name": own_key, "versions": plain.versions, "epochs": plain.epochs,
        "selfchecks": checks,
        "seconds": time.monotonic() - started,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benches.attach_trainers", description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", choices=sorted(TRAINERS), action="append")
    parser.add_argument("--selfchecks", type=int, default=10, help="selfchecks per trainer (default 10)")
    parser.add_argument("--out", type=Path, required=True)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    results = {}
    for name in args.trainer or sorted(TRAINERS):
        results[name] = measure(name, args.selfchecks)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))  # after each trainer: a long run keeps what it measured
    for name, result in results.items():
        agree = {row: Counter(check[row]["verdict"] for check in result["selfchecks"])
                 for row in result["selfchecks"][0]} if result["selfchecks"] else {}
        print(f"{name}: named phases {result['phase_coverage']:.1%} of the steady time (other "
              f"{result['other_share']:.1%}); steps counted {result['steps_counted']:,}, {result['own_count_name']} "
              f"{result['own_count']:,}; selfcheck verdicts {', '.join(f'{row}: {dict(c)}' for row, c in agree.items())}")


if __name__ == "__main__":
    main()
