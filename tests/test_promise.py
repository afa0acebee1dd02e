"""A night states what it can detect before it measures, and keeps that promise or refuses (benches/promise.py):
nothing slower passes green because the night was fitted past what it could see."""

from __future__ import annotations

import numpy as np

from benches import suite as suites
from benches.night import gate_plan, set_up_night
from benches.options import ProcessOptions
from benches.promise import Promise, weaker_line
from decisions import screening as rules
from decisions.verdicts import PointVerdict

POINTS = list(suites.load("nightly").points)[:4]
PLAN = gate_plan(ProcessOptions())
COSTS = {point.key: 30.0 * (1 + index) for index, point in enumerate(POINTS)}
LABELS = {point.key: point.label for point in POINTS}


def history(spread: float = 0.05, nights: int = 8) -> dict[str, list[tuple]]:
    rng = np.random.default_rng(3)
    return {point.key: [tuple(rng.normal(0, spread, 3)) for _ in range(nights)] for point in POINTS}


def one_suspect_night_s() -> float:
    """A night that holds the fewest screen pairs and one suspect's first look, not two."""
    roomy = set_up_night(PLAN, history(), COSTS, 1e6).fit
    first_looks = PLAN.confirmation(1).looks[0] * 2 * max(COSTS.values())
    return sum(2 * 2 * cost for cost in COSTS.values()) + roomy.refine_s + first_looks + 1.0


def test_a_night_that_keeps_its_promise_runs_and_says_what_each_point_detects():
    setup = set_up_night(PLAN, history(), COSTS, 1e6)
    assert setup.refused is None and setup.promise.kept and setup.plan.max_suspects == 2
    assert setup.promise.slowdown == 2 * PLAN.threshold and set(setup.promise.detects) == set(COSTS)
    assert all(0 < after <= setup.promise.slowdown for _, after in setup.promise.detects.values())


def test_a_night_fitted_to_fewer_suspects_refuses_naming_the_night_or_the_points_that_would_keep_it():
    night_s = one_suspect_night_s()
    setup = set_up_night(PLAN, history(), COSTS, night_s, labels=LABELS)
    assert setup.promise.confirmed == 1 and not setup.promise.kept
    assert setup.refused.startswith("night-s: ") and "fitted, it confirms 1 suspect; raise --night-s to at least " \
        in setup.refused and "\n" not in setup.refused
    least = int(setup.refused.split("at least ")[1].split(",")[0])
    assert set_up_night(PLAN, history(), COSTS, float(least)).promise.kept
    assert set_up_night(PLAN, history(), COSTS, float(least - 1)).refused
    # or the costliest points' screens dropped, the costliest first, until both suspects fit
    assert setup.refused.endswith(", or run the weaker night with --accept-weaker")
    dropped = setup.refused.split("or drop the costliest point")[1].split("(")[1].split(")")[0].split("; ")
    assert dropped[0] == POINTS[-1].label
    kept = {point.key: COSTS[point.key] for point in POINTS if point.label not in dropped}
    assert len(kept) >= 2 and set_up_night(PLAN, {key: history()[key] for key in kept}, kept, night_s).refused is None


def test_a_point_the_fit_takes_past_the_promise_breaks_it_one_its_own_noise_keeps_there_does_not():
    promise = Promise(0.10, 2, 2, {"cut past": (0.08, 0.12), "noisy": (0.11, 0.11), "cut within": (0.08, 0.09)})
    assert promise.broken == ["cut past"] and not promise.kept


def test_a_weaker_night_leaves_every_suspect_beyond_those_it_confirms_undecided_and_says_what_it_promised():
    setup = set_up_night(PLAN, history(), COSTS, one_suspect_night_s(), accept_weaker=True)
    assert setup.refused is None and setup.plan.beyond_undecided and setup.plan.max_suspects == 1
    screened = [rules.Screened(point.key, point.key, point.label, "ok", pairs=3, quiet=3, suspect=True,
                               evidence=3.0 - index) for index, point in enumerate(POINTS[:2])]
    confirmed = {POINTS[0].key: PointVerdict(POINTS[0].key, POINTS[0].label, "not slower",
                                             decision=None)}
    found = rules.verdicts(screened, confirmed, setup.plan)
    assert found[1].status == rules.UNDECIDED and rules.exit_code(found) == rules.EXIT_UNMEASURED
    assert rules.conclusion(found).endswith(f"undecided 1 suspect beyond the weaker night's confirmed (raise "
                                            f"--night-s): {POINTS[1].label}")
    line = weaker_line(setup.promise, setup.fit, {point.key: point.label for point in POINTS})
    assert line.startswith("gate: a weaker night than promised (--accept-weaker): 1 suspect confirmed rather than "
                           "2, every other suspect undecided; each cut point flagged 95% of the time when slower by: ")
    for key, (before, after) in setup.fit.cut.items():
        assert f"{POINTS[[p.key for p in POINTS].index(key)].label} " \
               f"{setup.promise.detects[key][1]:.1%} ({before} -> {after} pairs)" in line
    # the gate's rule before: a night that keeps its promise lists a suspect beyond those it confirms
    assert rules.verdicts(screened, confirmed, set_up_night(PLAN, history(), COSTS, 1e6).plan)[1].status \
        != rules.UNDECIDED


def test_the_study_counts_a_night_the_gate_refuses_as_refused_before_it_measures():
    from studies import gate_power
    from studies.simulated import H100_EAGER

    walls = dict(COSTS)
    found = gate_power.simulate(POINTS, PLAN, H100_EAGER, 0.10, 6, 3, walls, 0.0, one_suspect_night_s())
    assert found["refused"].startswith("night-s: ")
    assert {kind: codes[2]["hits"] for kind, codes in found["exit codes"].items()} == {"null": 3, "slowed": 3}
    assert all(codes[0]["hits"] == 0 for codes in found["exit codes"].values())
