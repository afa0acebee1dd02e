"""Can `rlperf selfcheck`'s verdicts flip between identical runs, and does a wrong attribution fail? Simulated
through the real decision code (decisions/attribution.py `check`) at noise measured on real attached runs.

    python -m studies.selfcheck_power --noise results/cpu-epyc-2core/attach/attach-trainers.json --checks 1000

Each simulated epoch's phase seconds are a real run's epoch, drawn at random from the measured steady epochs of one
trainer (heavy tails and all), times a per-process offset (lognormal, `--process-sd`) and a drift across the run
(`--drift` per epoch), plus the delay's share where an epoch is delayed. A correct attribution has a true share of
1; the broken ones charge part of the delay elsewhere (0, 0.5, 0.9) or count it twice (1.1, 2). For each true
share, the rates of ok, FAIL and undecided over `--checks` selfchecks, and how often 10 selfchecks in a row would
not all agree. docs/decision-rules.md#selfchecks-band gives the table.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import Counter
from pathlib import Path

from decisions import attribution
from profilers.command_check import ATTACHED_PHASES
from rlperf.phases import delayed_epoch

TRUE_SHARES = (1.0, 0.0, 0.5, 0.9, 1.1, 2.0)


def measured_epochs(path: Path, trainer: str) -> list[dict[str, float]]:
    """The steady epochs of `trainer`'s plain run in a benches.attach_trainers result: seconds by phase."""
    result = json.loads(path.read_text())[trainer]
    return [epoch["phases"] for epoch in result["epochs"] if not epoch["warmup"]]


def simulated_run(epochs: list[dict[str, float]], delays: dict[str, float], epochs_per_run: int, true_share: float,
                  process_sd: float, drift: float, rng: random.Random) -> list[dict]:
    """One simulated process: a warm-up epoch, then `epochs_per_run` steady ones drawn from the measured epochs,
    every other one delayed."""
    offset = rng.lognormvariate(0.0, process_sd)
    run = [{"warmup": True, "delayed": [], "phases": dict(rng.choice(epochs))}]
    for index in range(1, epochs_per_run + 1):
        drawn = rng.choice(epochs)
        delayed = delayed_epoch(index, attribution.DELAY_EVERY, 1)
        scale = offset * (1 + drift * index)
        phases = {phase: seconds * scale for phase, seconds in drawn.items()}
        if delayed:
            for phase, ms in delays.items():
                phases[phase] = phases.get(phase, 0.0) + true_share * ms / 1000.0
        run.append({"warmup": False, "delayed": sorted(delays) if delayed else [], "phases": phases})
    return run


def simulate(epochs: list[dict[str, float]], true_share: float, checks: int, delay_ms: float, epochs_per_run: int,
             max_runs: int, process_sd: float, drift: float, seed: int) -> dict:
    rng = random.Random(seed)
    phases = tuple(phase for phase in ATTACHED_PHASES if any(epoch.get(phase, 0.0) > 0 for epoch in epochs))
    verdicts: Counter = Counter()
    runs_taken = []
    for _ in range(checks):
        rows = attribution.check(phases, delay_ms, lambda name, delays: simulated_run(
            epochs, delays, epochs_per_run, true_share, process_sd, drift, rng), max_runs)
        verdicts.update(row.verdict for row in rows.values())
        runs_taken.append(sum(len(row.runs) for row in rows.values()))
    rows_judged = sum(verdicts.values())
    rates = {verdict: verdicts[verdict] / rows_judged for verdict in ("ok", "FAIL", "undecided")}
    # a row's verdict in 10 selfchecks in a row agrees unless two different verdicts appear among them
    agree_10 = sum(rate ** 10 for rate in rates.values())
    return {"true_share": true_share, "rows": rows_judged, **rates, "ten_agree": agree_10,
            "mean_runs": sum(runs_taken) / len(runs_taken)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m studies.selfcheck_power", description=__doc__.splitlines()[0])
    parser.add_argument("--noise", type=Path, required=True, help="a benches.attach_trainers result (JSON)")
    parser.add_argument("--trainer", action="append", help="trainers of that result to draw from (default: all)")
    parser.add_argument("--checks", type=int, default=1000)
    parser.add_argument("--delay-ms", type=float, default=150.0)
    parser.add_argument("--epochs-per-run", type=int, default=8, help="steady epochs per simulated process")
    parser.add_argument("--max-runs", type=int, default=4)
    parser.add_argument("--process-sd", type=float, default=0.05, help="log-SD of a process's speed")
    parser.add_argument("--drift", type=float, default=0.0, help="a process's slowing per epoch (0.01: 1%%)")
    parser.add_argument("--noise-scale", type=float, default=1.0,
                        help="spread the measured epochs about their median by this factor (3: a busier machine)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    return parser


def spread(epochs: list[dict[str, float]], factor: float) -> list[dict[str, float]]:
    """The epochs with each phase's deviation from its median multiplied by `factor` (kept at 0 or more)."""
    if factor == 1.0:
        return epochs
    medians = {phase: sorted(epoch[phase] for epoch in epochs)[len(epochs) // 2] for phase in epochs[0]}
    return [{phase: max(0.0, medians[phase] + factor * (seconds - medians[phase])) for phase, seconds in epoch.items()}
            for epoch in epochs]


def main() -> None:
    args = build_parser().parse_args()
    trainers = args.trainer or sorted(json.loads(args.noise.read_text()))
    table = []
    for trainer in trainers:
        epochs = spread(measured_epochs(args.noise, trainer), args.noise_scale)
        for true_share in TRUE_SHARES:
            row = {"trainer": trainer, **simulate(epochs, true_share, args.checks, args.delay_ms, args.epochs_per_run,
                                                  args.max_runs, args.process_sd, args.drift, args.seed)}
            table.append(row)
            print(f"{trainer:9} true {true_share:4.2f}: ok {row['ok']:.4f}, FAIL {row['FAIL']:.4f}, undecided "
                  f"{row['undecided']:.4f}; 10 in a row agree {row['ten_agree']:.4f}; {row['mean_runs']:.1f} runs",
                  flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()}, "rows": table},
                                       indent=1))


if __name__ == "__main__":
    main()
