"""Does the trainer still learn? The memory task at 200K agent steps on seeds 1-10, eager on the CPU, the default
path, one fresh `rlperf train` process a seed, one after another.

    python -m studies.memory_learning --out runs/memory-learning

Per seed: the final return (the summary's `mean_episode_return`, the mean over the last tenth of the epochs), the
best epoch's mean return, and the agent steps at which the smoothed return first reached the target (0.9 over 100
episodes; a blind policy scores 0.25). It is a study, not a test: minutes of two cores, and a seed that solves then
falls back is a finding to read, not a failure to gate on.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

SEEDS = tuple(range(1, 11))
TOTAL_STEPS = 200_000
TARGET_RETURN = 0.9


def train_seed(seed: int, out: Path, threads: int) -> dict:
    """The summary of one seed's run, kept in `out` and read back when already there."""
    path = out / f"seed-{seed}.json"
    if not path.is_file():
        command = [sys.executable, "-m", "command.cli", "train", "--env", "memory", "--total-steps", str(TOTAL_STEPS),
                   "--seed", str(seed), "--target-return", str(TARGET_RETURN), "--quiet", "--json", str(path)]
        if threads:
            command += ["--threads", str(threads)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"memory_learning: seed {seed} failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(path.read_text())


def seed_row(seed: int, summary: dict) -> dict:
    returns = [e["mean_episode_return"] for e in summary["epochs"] if e["mean_episode_return"] is not None]
    solve = summary["time_to_solve"]
    return {"seed": seed, "final_return": summary["mean_episode_return"], "best_epoch_return": max(returns),
            "solved_at_steps": solve["steps"] if solve["solved"] else None, "sps": summary["sps"],
            "wall_seconds": summary["wall_seconds"]}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/memory-learning"),
                        help="each seed's summary and results.json (default runs/memory-learning)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads a process (default 0: torch's own)")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for seed in SEEDS:
        row = seed_row(seed, train_seed(seed, args.out, args.threads))
        rows.append(row)
        solved = f"solved at {row['solved_at_steps']:,} steps" if row["solved_at_steps"] else "never solved"
        print(f"seed {seed:2d}: final return {row['final_return']:.3f}, best epoch {row['best_epoch_return']:.3f}, "
              f"{solved}; SPS {row['sps']:,.0f}", flush=True)
    result = {"total_steps": TOTAL_STEPS, "target_return": TARGET_RETURN, "seeds": rows,
              "solved": sum(row["solved_at_steps"] is not None for row in rows),
              "final_at_least_0.99": sum(row["final_return"] >= 0.99 for row in rows)}
    (args.out / "results.json").write_text(json.dumps(result, indent=1))
    print(f"{result['solved']} of {len(rows)} seeds solved; {result['final_at_least_0.99']} end at 0.99 or more")


if __name__ == "__main__":
    main()
