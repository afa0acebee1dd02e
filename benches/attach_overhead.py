"""What `rlperf attach` costs a command: pairs of processes of the same command, one attached and one not, in an
order drawn at random per pair, each timed by the command's own clock around its training (the last line it
prints: JSON with `learn_seconds` and its count of agent steps), so both sides are measured the same way. The
cost is 1 - the median over pairs of SPS attached / SPS plain, with the Hodges-Lehmann interval of the pairs'
ratios. Run it on a quiet machine: it is a timing.

    python -m benches.attach_overhead --pairs 10 --out runs/attach-overhead.json -- python -m benches.trainers.sb3_ppo
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
from pathlib import Path

from decisions.attribution import walsh_interval
from profilers.attach_command import attached_environment, resolved

# the trainers' own counts of agent steps, by the names benches/trainers/ print them under
STEP_COUNTS = ("num_timesteps", "collected_frames", "tot_timesteps", "train_step", "steps")


def own_sps(output: str) -> tuple[float, float]:
    """SPS by the command's own wall clock and count, from the JSON of its last line, and by its CPU time (less
    sensitive to what else the machine runs)."""
    last = json.loads(output.strip().splitlines()[-1])
    count = next(last[key] for key in STEP_COUNTS if key in last)
    return count / last["learn_seconds"], count / last.get("learn_cpu_seconds", float("nan"))


def one(command: list[str], attached: bool, scratch: Path) -> tuple[float, float]:
    env = attached_environment(scratch / "summary.json") if attached else dict(os.environ)
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return own_sps(done.stdout)


def measure(command: list[str], pairs: int, seed: int = 0) -> dict:
    rng = random.Random(seed)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(pairs):
            order = [True, False] if rng.random() < 0.5 else [False, True]
            both = {attached: one(command, attached, Path(scratch)) for attached in order}
            sps = {attached: wall for attached, (wall, _) in both.items()}
            cpu = {attached: per_cpu for attached, (_, per_cpu) in both.items()}
            rows.append({"pair": index, "attached_first": order[0], "sps_attached": sps[True],
                         "sps_plain": sps[False], "ratio": sps[True] / sps[False],
                         "cpu_ratio": cpu[True] / cpu[False]})
            print(f"pair {index + 1}/{pairs}: attached {sps[True]:,.0f} SPS, plain {sps[False]:,.0f} "
                  f"({sps[True] / sps[False] - 1:+.1%}; by CPU time {cpu[True] / cpu[False] - 1:+.1%})", flush=True)
    ratios = [row["ratio"] for row in rows]
    cpu_ratios = [row["cpu_ratio"] for row in rows]
    _, low, high = walsh_interval(ratios)
    return {"command": command, "pairs": rows, "median_ratio": statistics.median(ratios),
            "cost": 1 - statistics.median(ratios), "cpu_cost": 1 - statistics.median(cpu_ratios),
            "cost_interval": [1 - high, 1 - low] if low is not None else None}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benches.attach_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None, help="write every pair and the median here (JSON)")
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    command = resolved(args.argv[1:] if args.argv[:1] == ["--"] else args.argv)
    result = measure(command, args.pairs)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    interval = result["cost_interval"]
    within = f", 95% interval {100 * interval[0]:.1f}% to {100 * interval[1]:.1f}%" if interval else ""
    print(f"attach costs {100 * result['cost']:.1f}% of SPS (median of {args.pairs} interleaved pairs{within}; "
          f"{100 * result['cpu_cost']:.1f}% by CPU time)")


if __name__ == "__main__":
    main()
