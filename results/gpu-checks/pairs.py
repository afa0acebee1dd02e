"""Two variants of the trainer that no flag switches, in pairs of fresh `rlperf train` processes, the order inside
each pair drawn at random (as `rlperf bench --against` pairs two commits), so drift over the run falls on both.

    python results/gpu-checks/pairs.py --variants events-made events-reused --pairs 6 --out DIR -- TRAIN_FLAGS
    python results/gpu-checks/pairs.py --variants spin blocking --pairs 6 --out DIR -- TRAIN_FLAGS

Variants (each process runs the trainer of this checkout, the variant patched in before it starts):
- `events-reused`: as it is: the phase timer records the CUDA events it made in its first epoch again;
- `events-made`: the phase timer makes a new CUDA event at every phase boundary (the timer before the reuse);
- `spin`: as it is: with --non-blocking each env group's worker waits on a `torch.cuda.Event()`, whose
  synchronize polls, keeping a core busy;
- `blocking`: those events made with `blocking=True`: the worker's thread sleeps until the GPU signals.

Prints one line a process (variant, steady SPS, the env's share of the step, the process's CPU seconds, wall)
and, at the end, the pairs' ratios second / first variant: their geometric mean, range, and the exact two-sided
sign-flip p of their logs. Writes every process's line to DIR/processes.jsonl and the summaries to DIR/.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ("events-reused", "events-made", "spin", "blocking")


def patch(variant: str) -> None:
    import torch

    from reference_trainer.timing import PhaseTimer
    from reference_trainer.train import Trainer

    if variant == "events-made":
        def made_at_every_boundary(timer):
            if timer.cuda:
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                return event
            return time.perf_counter()

        PhaseTimer._mark = made_at_every_boundary
    elif variant == "blocking":
        built = Trainer.__init__

        def with_blocking_events(trainer, *args, **kwargs):
            built(trainer, *args, **kwargs)
            if trainer.actions_ready is not None:
                trainer.actions_ready = [torch.cuda.Event(blocking=True) for _ in trainer.envs]

        Trainer.__init__ = with_blocking_events


def child(variant: str, flags: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    patch(variant)
    from command.cli import main

    return main(["train", *flags])


def sign_flip_p(logs: list[float]) -> float:
    """Exact two-sided p of the mean log ratio under 'the variant changes nothing' (each sign equally likely)."""
    observed = abs(sum(logs))
    flips = list(itertools.product((1, -1), repeat=len(logs)))
    return sum(abs(sum(s * x for s, x in zip(signs, logs))) >= observed - 1e-12 for signs in flips) / len(flips)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs=2, choices=VARIANTS, metavar="VARIANT")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--timeout-s", type=float, default=240.0, help="one process's limit")
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="-- then `rlperf train` flags")
    args = parser.parse_args()
    flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    if args.child:
        return child(args.child, flags)
    if not args.variants or args.out is None:
        parser.error("--variants A B and --out DIR are needed")
    args.out.mkdir(parents=True, exist_ok=True)
    draw = random.Random(args.seed)
    logs = []
    for pair in range(args.pairs):
        order = list(args.variants)
        draw.shuffle(order)
        sps = {}
        for variant in order:
            summary = args.out / f"pair{pair}-{variant}.json"
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            done = subprocess.run([sys.executable, __file__, "--child", variant, "--", *flags, "--json", str(summary),
                                   "--quiet"], cwd=REPO, timeout=args.timeout_s)
            wall = time.perf_counter() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            if done.returncode != 0:
                print(f"pair {pair} {variant}: the trainer failed (rc {done.returncode})", flush=True)
                return 1
            result = json.loads(summary.read_text())
            steady = sum(result["phases"].values()) or math.nan
            row = {"pair": pair, "variant": variant, "sps": result["sps"],
                   "env_share": result["phases"]["env"] / steady, "cpu_s": cpu, "wall_s": wall,
                   "steady_s": result["steady_seconds"]}
            sps[variant] = result["sps"]
            print(f"pair {pair} {variant}: {row['sps']:,.0f} SPS, env {row['env_share']:.0%} of the step, "
                  f"{cpu:.1f} CPU s, {wall:.1f} s wall", flush=True)
            with open(args.out / "processes.jsonl", "a") as file:
                file.write(json.dumps(row) + "\n")
        logs.append(math.log(sps[args.variants[1]] / sps[args.variants[0]]))
    ratios = [math.exp(x) for x in logs]
    summary = {"variants": args.variants, "flags": flags, "ratios": ratios,
               "geometric_mean": math.exp(sum(logs) / len(logs)), "p": sign_flip_p(logs)}
    (args.out / "pairs.json").write_text(json.dumps(summary, indent=1))
    print(f"{args.variants[1]} / {args.variants[0]}: {summary['geometric_mean']:.3f} (pairs {min(ratios):.3f} to "
          f"{max(ratios):.3f}, {len(ratios)} pairs), exact sign-flip p {summary['p']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
