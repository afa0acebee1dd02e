"""How often the traced diff's rule (decisions/trace_diff.py) claims a change where there is none, and finds a
planted one, over random N-against-N diffs drawn from real traced processes.

Input: `rlperf profile --against` output (OUT/ref/K and OUT/new/K), whose new side carries a planted change. A/A
draws take two disjoint groups of N from one side's processes (each side in turn); planted draws take N of each
side. A planted draw counts as found when the diff claims `--phase` grew and `--operator` leads that phase's
operators, itself claimed grown. Rates come with 95% Clopper-Pearson intervals over the draws; draws reuse the same
K processes a side, so the processes, not the draws, bound what the rates can tell (results/.../traced-diff).

    python -m studies.traced_diff --traces DIR [--draws N] [--per-side N] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from pathlib import Path

from scipy import stats

from decisions.trace_diff import DEFAULT_ALPHA, diff
from profilers.profile_sets import TracedProcess, read_side
from rlperf.arguments import positive_int


def rate(hits: int, draws: int) -> dict:
    interval = stats.binomtest(hits, draws).proportion_ci(0.95, method="exact")
    return {"hits": hits, "draws": draws, "rate": hits / draws, "low": interval.low, "high": interval.high}


def planted_found(found: dict, phase: str, operator: str) -> bool:
    grown = any(row["phase"] == phase and row["verdict"] == "grown" for row in found["phases"])
    inside = next((entry["operators"] for entry in found["changed"] if entry["phase"] == phase), [])
    return grown and bool(inside) and inside[0]["name"] == operator and inside[0]["verdict"] == "grown"


def study(sides: dict[str, list[TracedProcess]], draws: int, per_side: int, phase: str, operator: str,
          alpha: float, seed: int) -> dict:
    chance = random.Random(seed)
    quiet, found, claimed_phase, led, false_claims = 0, 0, 0, 0, []
    others: Counter[str] = Counter()
    for draw in range(draws):
        pool = sides["ref" if draw % 2 == 0 else "new"]
        chosen = chance.sample(pool, 2 * per_side)
        claims = diff(chosen[:per_side], chosen[per_side:], alpha)["claims"]
        quiet += not claims
        false_claims += claims[:1]
        planted = diff(chance.sample(sides["ref"], per_side), chance.sample(sides["new"], per_side), alpha)
        found += planted_found(planted, phase, operator)
        inside = next((entry["operators"] for entry in planted["changed"]
                       if entry["phase"] == phase and entry["verdict"] == "grown"), None)
        if inside:
            claimed_phase += 1
            led += inside[0]["name"] == operator
            others.update(row["name"] for row in inside[1:] if row["verdict"] == "grown")
    return {"draws": draws, "per_side": per_side, "alpha": alpha, "seed": seed,
            "processes": {side: len(found_side) for side, found_side in sides.items()},
            "aa_claim_nothing": rate(quiet, draws), "planted_found": rate(found, draws),
            "aa_phases_falsely_claimed": sorted({line.split(" ")[0] for line in false_claims}),
            "planted_phase_claimed": claimed_phase, "planted_operator_led_it": led,
            "other_operators_claimed_grown": dict(others.most_common())}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m studies.traced_diff", description=__doc__.splitlines()[0])
    parser.add_argument("--traces", required=True, metavar="DIR", help="rlperf profile --against's --out")
    parser.add_argument("--draws", type=positive_int, default=2000, metavar="N", help="diffs of each kind (default 2000)")
    parser.add_argument("--per-side", type=positive_int, default=2, metavar="N",
                        help="processes a side in each diff, as rlperf profile --processes (default 2)")
    parser.add_argument("--phase", default="learn", help="the phase the plant is in (default learn)")
    parser.add_argument("--operator", default="aten::mm", help="the operator planted (default aten::mm)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help=f"the diff's alpha (default {DEFAULT_ALPHA})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, metavar="FILE", help="also write the result as JSON here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    sides = {side: read_side(Path(args.traces) / side, side) for side in ("ref", "new")}
    result = study(sides, args.draws, args.per_side, args.phase, args.operator, args.alpha, args.seed)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
