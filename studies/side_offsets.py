"""Offsets one side's processes share: where they come from, and whether the gate's nights still show them.

`python -m studies.side_offsets nights --store STORE` and `python -m studies.side_offsets sources --suite SUITE`;
why and how: docs/decision-rules.md#offsets-one-side-shares.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

ARMS = ("server 1", "server 2", "other path", "fresh")
REFERENCE = ARMS[0]


# ---- what an experiment can see ---------------------------------------------------------------------------------

def detection_power(rounds: int, blocks: int, pair_spread: float, offset_sd: float, level: float = 0.05) -> float:
    """The chance the F test over `rounds` of `blocks` pairs each finds an offset of SD `offset_sd` that lasts a
    round, at pairs spreading by `pair_spread` (normal): the between-round mean square is (1 + blocks x offset
    variance / pair variance) times an F variate."""
    df_between, df_within = rounds - 1, rounds * (blocks - 1)
    inflation = 1 + blocks * offset_sd ** 2 / pair_spread ** 2
    return float(stats.f.sf(stats.f.isf(level, df_between, df_within) / inflation, df_between, df_within))


def offset_in_rounds(differences: list[np.ndarray]) -> dict:
    """One arm against the reference: each round's pairs' log ratios (`differences`). The variance of an offset
    lasting a round, beyond the pairs' noise (one-way random effects), its F test and one-sided upper 95% bound,
    and the mean over rounds with a 95% t interval over the rounds' means."""
    groups = [np.asarray(d, float) for d in differences if len(d) >= 2]
    sizes = np.array([len(g) for g in groups])
    if len(groups) < 3:
        return {"rounds": len(groups)}
    means = np.array([g.mean() for g in groups])
    total = sizes.sum()
    grand = float(np.sum(sizes * means) / total)
    df_between, df_within = len(groups) - 1, int(total - len(groups))
    between = float(np.sum(sizes * (means - grand) ** 2) / df_between)
    within = float(sum(((g - g.mean()) ** 2).sum() for g in groups) / df_within)
    n0 = float((total - np.sum(sizes ** 2) / total) / df_between)  # the effective pairs a round
    ratio = between / within
    upper_ratio = max(0.0, (ratio / stats.f.ppf(0.05, df_between, df_within) - 1) / n0)
    center = float(means.mean())
    half = float(stats.t.ppf(0.975, len(means) - 1) * means.std(ddof=1) / math.sqrt(len(means)))
    return {"rounds": len(groups), "pairs": int(total), "pair_spread": math.sqrt(within),
            "offset_sd": math.sqrt(max(0.0, (between - within) / n0)),
            "offset_sd_upper95": math.sqrt(upper_ratio * within),
            "f": ratio, "p": float(stats.f.sf(ratio, df_between, df_within)),
            "mean": center, "mean_low": center - half, "mean_high": center + half}


def analyse_sources(rows: list[dict]) -> dict:
    """Each arm against `server 1`: the pairs of one block, quiet on both sides, grouped by round."""
    by_block: dict[tuple[int, int], dict[str, dict]] = {}
    for row in rows:
        by_block.setdefault((row["round"], row["block"]), {})[row["arm"]] = row
    found = {}
    for arm in ARMS[1:]:
        rounds: dict[int, list[float]] = {}
        for (round_, _), block in sorted(by_block.items()):
            pair = [block.get(REFERENCE), block.get(arm)]
            if None in pair or any(process["contended"] for process in pair):
                continue
            rounds.setdefault(round_, []).append(math.log(pair[1]["sps"] / pair[0]["sps"]))
        found[arm] = offset_in_rounds(list(rounds.values()))
    processes = {arm: [row for row in rows if row["arm"] == arm] for arm in ARMS}
    found["processes"] = {arm: {"count": len(done), "contended": sum(row["contended"] for row in done),
                                "median_wall_s": float(np.median([row["wall_s"] for row in done])) if done else None}
                          for arm, done in processes.items()}
    return found


def night_offsets(nights: list[dict[str, list[float]]]) -> dict:
    """A/A nights (each: its quiet pairs' log ratios by point key): each night's mean log ratio against what its
    pairs' noise allows, each point's pair variance read within its nights (no offset of a night widens it). The
    variance ratio is tested against chi-square on nights - 1 degrees of freedom; the excess is the variance of an
    offset one side's processes shared for a night, with a one-sided upper 95% bound."""
    within: dict[str, list[np.ndarray]] = {}
    for found in nights:
        for key, ratios in found.items():
            if len(ratios) >= 2:
                within.setdefault(key, []).append(np.asarray(ratios) - np.mean(ratios))
    variance = {key: float(sum((d ** 2).sum() for d in parts) / sum(len(d) - 1 for d in parts))
                for key, parts in within.items()}
    pooled = float(np.median(list(variance.values()))) if variance else math.nan
    means, allowed = [], []
    for found in nights:
        pairs = [(key, ratio) for key, ratios in found.items() for ratio in ratios]
        if not pairs:
            continue
        means.append(float(np.mean([ratio for _, ratio in pairs])))
        allowed.append(sum(variance.get(key, pooled) for key, _ in pairs) / len(pairs) ** 2)
    if len(means) < 3:
        return {"nights": len(means)}
    spread, expected = float(np.var(means, ddof=1)), float(np.mean(allowed))
    df = len(means) - 1
    return {"nights": len(means), "night_means": means, "pairs_a_night": float(np.mean([sum(map(len, f.values()))
                                                                                         for f in nights])),
            "night_mean_spread": math.sqrt(spread), "allowed_spread": math.sqrt(expected),
            "variance_ratio": spread / expected, "p": float(stats.chi2.sf(df * spread / expected, df)),
            "offset_sd": math.sqrt(max(0.0, spread - expected)),
            "offset_sd_upper95": math.sqrt(max(0.0, df * spread / stats.chi2.ppf(0.05, df) - expected)),
            "point_pair_spreads": {key: math.sqrt(v) for key, v in sorted(variance.items())}}


# ---- the measurements -------------------------------------------------------------------------------------------

def stored_nights(store_path: Path, stages: tuple[str, ...] = ("screen", "refine", "confirm")) \
        -> list[dict[str, list[float]]]:
    """Each gate night in the store: the quiet pairs' log ratios of its `stages` by point."""
    from decisions import screening as rules
    from decisions.verdicts import pairs_of
    from rlperf.store import Store

    with Store.open(store_path, readonly=True) as store:
        runs = store.runs()
        entries = {row.run_id: row.fingerprint.get(rules.GATE) or {} for row in runs.itertuples()}
        nights = []
        for run_id, entry in entries.items():
            if (entry.get("stage"), entry.get("side")) != ("screen", "new"):
                continue
            run_of = {("screen", "new"): run_id, ("screen", "ref"): entry["runs"]["screen_ref"]}
            for other, later in entries.items():
                if (later.get("runs") or {}).get("screen_new") == run_id:
                    run_of[(later["stage"], later["side"])] = other
            found: dict[str, list[float]] = {}
            for stage in stages:
                if (stage, "new") not in run_of or (stage, "ref") not in run_of:
                    continue
                new, ref = (store.samples(run_of[(stage, side)]) for side in ("new", "ref"))
                for key in sorted(set(new["point_key"])):
                    pairs = pairs_of(new[new["point_key"] == key], ref[ref["point_key"] == key])
                    pairs = pairs[~pairs["contended_ref"] & ~pairs["contended_new"]]
                    found.setdefault(key, []).extend(np.log(pairs["sps_new"] / pairs["sps_ref"]).tolist())
            nights.append(found)
    return nights


def csv_nights(path: Path, stages: tuple[str, ...] = ("screen", "refine", "confirm")) -> list[dict[str, list[float]]]:
    """The nights of a pairs CSV (one row a pair: night, stage, point, sps_ref, sps_new, contended_ref and _new), as
    `stored_nights` reads them from a store."""
    import csv

    nights: dict[str, dict[str, list[float]]] = {}
    with open(path, newline="") as file:
        for row in csv.DictReader(file):
            if row["stage"] in stages and row["contended_ref"] == row["contended_new"] == "0":
                ratio = math.log(float(row["sps_new"]) / float(row["sps_ref"]))
                nights.setdefault(row["night"], {}).setdefault(row["point"], []).append(ratio)
    return list(nights.values())


def measure_sources(suite_name: str, rounds: int, blocks: int, out: Path, seed: int,
                    say=lambda text: print(text, flush=True)) -> list[dict]:
    """The rounds of the `sources` experiment, each process's SPS and whether the monitor saw it contended."""
    from benches import suite as suites
    from benches.runner import Launcher, PointRunner, UtilizationProbe
    from benches.worktrees import git, worktree
    from rlperf.machine import REPO_ROOT
    from rlperf.store import PointRecord, utc_now

    suite = suites.load(suite_name)
    rng = random.Random(seed)
    head = git("rev-parse", "HEAD")
    utilization = UtilizationProbe(suite.sample_hz)
    rows: list[dict] = []
    started = time.monotonic()
    for round_ in range(rounds):
        with worktree(head) as other, Launcher("forked", REPO_ROOT) as first, Launcher("forked", REPO_ROOT) as second, \
                Launcher("fresh", REPO_ROOT) as fresh:
            launchers = {"server 1": first, "server 2": second, "other path": first.beside(other), "fresh": fresh}
            for launcher in rng.sample([first, second], 2):  # their imports, before any process is measured
                launcher.prepare([sys.executable, "-m", "rlperf", "train"])
            runners = {arm: PointRunner(out / "processes" / arm.replace(" ", "-"), 1, suite.timeout_s, utilization,
                                        launcher=launcher) for arm, launcher in launchers.items()}
            for block in range(blocks):
                point = suite.points[(round_ * blocks + block) % len(suite.points)]
                for arm in rng.sample(ARMS, len(ARMS)):
                    directory = runners[arm].point_dir(0, point)
                    directory.mkdir(parents=True, exist_ok=True)
                    status, reason, summary = runners[arm].run_repeat(
                        point, round_ * blocks + block, directory, [],
                        PointRecord(point.key, point.config, "ok", utc_now(), 0.0))
                    if status != "ok":
                        raise RuntimeError(f"a process of {arm} failed: {reason}")
                    account = summary["interference"]
                    rows.append({"round": round_, "block": block, "arm": arm, "point": point.key,
                                 "sps": summary["sps"], "contended": bool(account.get("contended")),
                                 "launch": account.get("launch"), "wall_s": account.get("wall_s")})
        done = [row for row in rows if row["round"] == round_]
        say(f"round {round_ + 1}/{rounds} ({time.monotonic() - started:.0f} s): " + ", ".join(
            f"{arm} {np.median([row['sps'] for row in done if row['arm'] == arm]):,.0f}" for arm in ARMS))
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m studies.side_offsets", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    nights = commands.add_parser("nights", help="A/A gate nights' means against what their pairs allow")
    source = nights.add_mutually_exclusive_group(required=True)
    source.add_argument("--store", type=Path, help="a store holding A/A gate nights")
    source.add_argument("--pairs", type=Path, help="a CSV of their pairs, one row a pair (results/*/gate-offsets)")
    nights.add_argument("--stages", default="screen,refine,confirm",
                        help="the stages whose pairs count, comma-separated (default screen,refine,confirm)")
    nights.add_argument("--json", type=Path, help="also write the results here")
    sources = commands.add_parser("sources", help="server instances, paths and launch methods taken apart")
    sources.add_argument("--suite", default="gate", help="the suite whose points the blocks cycle over")
    sources.add_argument("--rounds", type=int, default=30, help="rounds, each with servers started anew")
    sources.add_argument("--blocks", type=int, default=8, help="blocks a round, one process of each arm each")
    sources.add_argument("--out", type=Path, default=Path("runs/side-offsets"), help="logs and the JSON go here")
    sources.add_argument("--seed", type=int, default=1)
    sources.add_argument("--json", type=Path, help="also write the results here (default OUT/sources.json)")
    sources.add_argument("--pair-spread", type=float, default=0.045,
                         help="the pair spread the experiment is sized for (default 0.045)")
    sources.add_argument("--offset-sd", type=float, default=0.015,
                         help="the offset SD the experiment is sized to see (default 0.015)")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    if args.command == "nights":
        stages = tuple(args.stages.split(","))
        results = night_offsets(stored_nights(args.store, stages) if args.store else csv_nights(args.pairs, stages))
    else:
        power = detection_power(args.rounds, args.blocks, args.pair_spread, args.offset_sd)
        print(f"sized: {args.rounds} rounds of {args.blocks} blocks see an offset of {args.offset_sd:.1%} SD at "
              f"pairs spreading by {args.pair_spread:.1%} with power {power:.0%} (F test at 5%)", flush=True)
        args.out.mkdir(parents=True, exist_ok=True)
        rows = measure_sources(args.suite, args.rounds, args.blocks, args.out, args.seed)
        results = {"suite": args.suite, "rounds": args.rounds, "blocks": args.blocks, "power": power,
                   **analyse_sources(rows), "rows": rows}
        args.json = args.json or args.out / "sources.json"
    text = json.dumps(results, indent=1)
    print(json.dumps({key: value for key, value in results.items() if key not in ("rows", "night_means")}, indent=1))
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
