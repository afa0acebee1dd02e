"""The gate (benches/gate.py, benches/night.py, decisions/screening.py): on the nightly suite's points a lone
slowed point is flagged and fails the job, a night that changed nothing passes whatever its offset, a point that
could not be measured fails with its own code; and, on real trainer processes of a copy of this project, a delay
planted in one point's code fails `rlperf gate` naming that point while the report rebuilt from the store says
the same, and the checkout of a gate killed mid-screen is removed by the next gate, which, stopped by SIGTERM,
removes its own."""

from __future__ import annotations

import json
import math
import random
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from projectrepo import environment, git, plant_in_learn_step, project_repo, rlperf

from benches import suite as suites
from benches.night import REFINE_PAIRS, REFINE_POINTS, SCREEN_PAIRS, Night, gate_plan
from benches.pairing import SIDES, frames
from benches.options import ProcessOptions
from studies.simulated import GPU_RUNNER, H100_EAGER, Noise, SimulatedMachine
from decisions import screening as rules
from decisions import sequential
from decisions.rundata import load_run
from decisions.verdicts import judge
from rlperf.store import PointRecord, Store, point_label

NIGHTLY = list(suites.load("nightly").points)


def night(machine: SimulatedMachine, points=NIGHTLY, plan: rules.GatePlan | None = None, seed: int = 0,
          skip=lambda point: None, night_s: float = 1e9) -> list[rules.GateVerdict]:
    plan = plan or gate_plan(ProcessOptions())
    recorded = {}

    def record(stage, side, point_record):
        recorded.setdefault((stage, side), []).append(point_record)

    found = Night(plan, lambda text: None, random.Random(seed), clock=machine.clock).run(
        points, lambda stage: {side: machine.runner(side, Path("/nonexistent")) for side in SIDES}, record, skip,
        lambda point: [], night_s=night_s)
    night.recorded = recorded
    return found


def test_a_lone_point_slowed_by_ten_percent_among_the_nightlys_points_fails_the_gate():
    machine = SimulatedMachine(GPU_RUNNER, np.random.default_rng(5))
    slowed = NIGHTLY[17]
    machine.slowdowns = {("new", slowed.key): 0.10}
    found = night(machine)
    by_point = {verdict.screen.point_key: verdict for verdict in found}
    assert by_point[slowed.key].status == rules.REGRESSED
    assert -0.14 < by_point[slowed.key].confirmation.sps.relative < -0.06
    assert [v for v in found if v.status == rules.REGRESSED] == [by_point[slowed.key]]
    assert rules.exit_code(found) == rules.EXIT_REGRESSED
    assert rules.conclusion(found).startswith(f"gate: regressed: {point_label(slowed.key)} -")


def test_the_old_rule_could_not_flag_that_point():
    """The same night judged as two runs of 5 repeats with Benjamini-Hochberg over the 20 points: at 5 against 5 the
    smallest p is 0.0079 and a lone claim needs 0.01 / 20, so the point is inconclusive whatever its size."""
    machine = SimulatedMachine(GPU_RUNNER, np.random.default_rng(5))
    slowed = NIGHTLY[17]
    machine.slowdowns = {("new", slowed.key): 0.5}
    runs = {}
    for side in SIDES:
        runner = machine.runner(side, Path("/nonexistent"))
        records = []
        for point in NIGHTLY:
            record = PointRecord(point.key, point.config, "ok", "now", 0.0)
            for repeat in range(5):
                record.samples.append((repeat, runner.run_repeat(point, repeat, Path("."), [], record)[2]))
            records.append(record)
        runs[side] = frames(records)
    verdicts = {v.point: v for v in judge(*runs["new"], *runs["ref"])}
    assert verdicts[point_label(slowed.key)].status == "inconclusive"


def test_a_night_that_changed_nothing_passes_however_slow_the_night():
    slow_night = Noise(process=0.02, drift=0.3, night=0.0, point_night=0.0)
    for seed in range(3):
        machine = SimulatedMachine(slow_night, np.random.default_rng(seed), base_sps=6_000.0)
        machine.night_offset = -0.3  # the whole night 26% slower: both sides of every pair meet it
        found = night(machine, seed=seed)
        assert rules.exit_code(found) == rules.EXIT_PASSED, rules.conclusion(found)
        assert all(v.status == rules.PASSED for v in found)


def test_contended_pairs_are_made_up_for_and_too_few_quiet_ones_cannot_pass():
    always = Noise(process=0.02, tail_df=None, contended=1.0, unflagged=0.0)
    machine = SimulatedMachine(always, np.random.default_rng(1))
    found = night(machine, points=NIGHTLY[:3])
    assert rules.exit_code(found) == rules.EXIT_UNMEASURED
    assert all(v.status == rules.UNMEASURED and v.note.startswith(f"too few quiet pairs: 0 of {2 * SCREEN_PAIRS}")
               for v in found)
    assert ("refine", "new") not in night.recorded  # no point had the quiet pairs to lead
    assert rules.conclusion(found).startswith("gate: could not measure 3 points")


def test_a_confirmation_the_night_cuts_short_is_undecided_fails_the_job_and_keeps_to_the_night():
    machine = SimulatedMachine(GPU_RUNNER, np.random.default_rng(4), process_s=20.0)
    machine.slowdowns = {("new", NIGHTLY[1].key): 0.5}
    # four points screened and refined: their pairs of two 20 s processes
    screened_at = (4 * SCREEN_PAIRS + min(4, REFINE_POINTS) * REFINE_PAIRS) * 2 * 20.0
    found = night(machine, points=NIGHTLY[:4], night_s=screened_at + 200.0)  # five pairs: short of the first look
    slowed = found[1]
    assert slowed.status == rules.UNDECIDED, slowed.note
    assert slowed.note.startswith("the night ended after 5 of its pairs, 5 of them quiet, of the 40 its design "), \
        slowed.note
    assert rules.exit_code(found) == rules.EXIT_UNMEASURED
    assert rules.conclusion(found) == (f"gate: undecided 1 suspect (the night ended first: raise --night-s): "
                                       f"{slowed.point} (the night ended after 5 of its pairs, 5 of them quiet, of the "
                                       f"40 its design allows)")
    assert machine.clock() <= screened_at + 200.0


def test_a_suspect_the_night_has_no_pair_left_for_is_stored_as_skipped_and_undecided(tmp_path):
    machine = SimulatedMachine(GPU_RUNNER, np.random.default_rng(4), process_s=20.0)
    machine.slowdowns = {("new", NIGHTLY[1].key): 0.5}
    screened_at = (4 * SCREEN_PAIRS + min(4, REFINE_POINTS) * REFINE_PAIRS) * 2 * 20.0
    found = night(machine, points=NIGHTLY[:4], night_s=screened_at + 30.0)  # less than one pair left
    assert machine.clock() == screened_at
    stored = {record.point_key: record for record in night.recorded[("confirm", "new")]}
    assert stored[NIGHTLY[1].key].status == "skipped" and stored[NIGHTLY[1].key].samples == []
    slowed = found[1]
    assert slowed.status == rules.UNDECIDED
    assert slowed.note == "the night ended before its first pair: 30 s of the night left, a pair takes 40 s"
    assert rules.exit_code(found) == rules.EXIT_UNMEASURED
    # rebuilt from a store holding what the night recorded, as every later report is: the same verdicts
    with Store.open(tmp_path / "results.sqlite") as store:
        runs = {("screen", side): store.create_run("nightly", "hash", {}, "m") for side in SIDES}
        for (stage, side), records in night.recorded.items():
            if stage != "screen":
                entry = {"stage": stage, "side": side, "runs": {"screen_new": runs[("screen", "new")]}}
                runs[(stage, side)] = store.create_run("nightly", "hash", {rules.GATE: entry}, "m")
            for record in records:
                store.record_point(runs[(stage, side)], record)
        for run_id in runs.values():
            store.finish_run(run_id, "complete")
        candidate, baseline = (load_run(store, runs[("screen", side)]) for side in ("new", "ref"))
    plan = gate_plan(ProcessOptions())
    again = rules.stored_verdicts(candidate, baseline, plan)
    assert [(v.status, v.note) for v in again] == [(v.status, v.note) for v in found]
    # a night stored under a plan from before the rule (no such field) is rebuilt as it was judged then
    before = {key: value for key, value in plan.to_dict().items() if key != "night_end_undecided"}
    then = rules.stored_verdicts(candidate, baseline, rules.GatePlan.from_dict(before))
    assert then[1].status == rules.NOT_CONFIRMED and rules.exit_code(then) == rules.EXIT_PASSED


def test_the_strongest_suspect_gets_the_nights_time_before_the_suspects_after_it():
    machine = SimulatedMachine(GPU_RUNNER, np.random.default_rng(7), process_s=20.0)  # pairs of 40 s
    plan = gate_plan(ProcessOptions())
    chosen = [rules.Screened(point.key, point.key, point.label, "ok") for point in NIGHTLY[:2]]
    lead_first_look = plan.confirmation(2, 0).looks[0]
    recorded = {}
    confirmed = Night(plan, lambda text: None, random.Random(0), clock=machine.clock).confirm(
        chosen, NIGHTLY, {side: machine.runner(side, Path("/nonexistent")) for side in SIDES},
        lambda stage, side, record: recorded.setdefault(side, []).append(record), lambda point: [],
        budget_s=(lead_first_look + 1) * 40.0, pair_s={point.key: 40.0 for point in NIGHTLY[:2]})
    # the lead reaches its first look, where holding back the second suspect's first look (12 pairs) would
    # have cut it short; the second then gets what is left
    lead = confirmed[NIGHTLY[0].key]
    assert lead.decision is not None and lead.decision.pairs >= lead_first_look
    assert machine.clock() <= (lead_first_look + 1) * 40.0
    second = confirmed[NIGHTLY[1].key]
    assert second.status == "skipped" or second.decision.pairs <= 1


def test_a_simulated_night_seeded_anew_draws_the_same_processes_whatever_came_before_it():
    # studies/gate_power.py compares plans on the same nights: what one plan did the night before (more
    # processes drawn, another luck left behind) must not change tonight's draws
    first, second = (SimulatedMachine(GPU_RUNNER, np.random.default_rng(seed)) for seed in (1, 2))
    for _ in range(7):
        first.draw("ref", NIGHTLY[0])
    tonight = []
    for machine in (first, second):
        machine.new_night(np.random.default_rng([21, 4]))
        tonight.append([machine.draw(side, point) for point in NIGHTLY[:3] for side in SIDES])
    assert tonight[0] == tonight[1]
    second.new_night(np.random.default_rng([21, 5]))
    assert [second.draw(side, point) for point in NIGHTLY[:3] for side in SIDES] != tonight[0]


def test_a_simulated_graphed_point_draws_its_luck_at_the_graphed_noise():
    # on a GPU an eager step is paced by the host's launches and a graph's by the device: their spreads differ
    quiet, wide = Noise(process=0.0, tail_df=None), Noise(process=0.3, tail_df=None)
    machine = SimulatedMachine(quiet, np.random.default_rng(3), graphed_noise=wide)
    eager, graphed = (suites.Point(key=str(knob), axes={}, config={"cuda_graphs": knob}) for knob in (False, True))
    assert len({machine.draw("ref", eager)[0] for _ in range(5)}) == 1
    assert len({machine.draw("ref", graphed)[0] for _ in range(5)}) == 5


def test_a_study_of_processes_that_take_no_time_is_never_cut_short_by_the_night():
    # without walls a simulated pair costs 0 s: the night's budget cannot bind, and must not divide by it
    from studies import gate_power

    # at the H100's eager noise a suspect's confirmation runs past its first look, where the budget is weighed
    found = gate_power.simulate(NIGHTLY[:4], gate_plan(ProcessOptions()), H100_EAGER, 0.10, 4, 3, {}, 0.0, 3600.0)
    assert found["false night"]["trials"] == 2 and found["caught"]["trials"] == 2


def test_the_study_simulates_the_night_the_gate_sets_up():
    # docs/decision-rules.md's rates are the gate's only while both take the night's pairs and fit from one place
    from benches.night import set_up_night
    from studies import gate_power

    points, plan = NIGHTLY[:8], gate_plan(ProcessOptions())
    walls = {point.key: 20.0 * (1 + index % 3) for index, point in enumerate(points)}
    # a night that keeps no promise of what it detects: run weaker, as --accept-weaker runs it
    found = gate_power.simulate(points, plan, H100_EAGER, 0.10, 2, 3, walls, 0.0, 3600.0, accept_weaker=True)
    setup = set_up_night(plan, {point.key: [] for point in points}, walls, 3600.0, accept_weaker=True)
    assert found["promise"]["weaker"] == setup.plan.beyond_undecided
    assert setup.fit.cut and found["screen fitted to the night"]["screen_s"] == setup.fit.screen_s
    assert found["screen pairs"] == {point.label: setup.screen_pairs[point.key] for point in points}


def test_skipped_points_neither_pass_nor_fail_the_night():
    machine = SimulatedMachine(GPU_RUNNER, np.random.default_rng(2))
    found = night(machine, points=NIGHTLY[:4], skip=lambda point: "needs 8 GPUs" if point is NIGHTLY[0] else None)
    assert found[0].status == rules.SKIPPED and rules.exit_code(found) == rules.EXIT_PASSED


def test_the_screens_leaders_get_more_pairs_numbered_after_their_screens_and_weighed_with_them():
    machine = SimulatedMachine(GPU_RUNNER, np.random.default_rng(6))
    machine.slowdowns = {("new", NIGHTLY[2].key): 0.3}
    plan = gate_plan(ProcessOptions())
    found = night(machine, points=NIGHTLY[:8], plan=plan)
    screen = {record.point_key: record for record in night.recorded[("screen", "new")]}
    refined = night.recorded[("refine", "new")]
    assert len(refined) == plan.refine_points and NIGHTLY[2].key in {record.point_key for record in refined}
    for record in refined:
        assert [pair for pair, _ in record.samples] == list(range(SCREEN_PAIRS, SCREEN_PAIRS + REFINE_PAIRS))
        assert len(screen[record.point_key].samples) == SCREEN_PAIRS
    by_point = {verdict.screen.point_key: verdict for verdict in found}
    assert by_point[NIGHTLY[2].key].screen.pairs == SCREEN_PAIRS + REFINE_PAIRS
    assert by_point[NIGHTLY[2].key].status == rules.REGRESSED
    unrefined = set(screen) - {record.point_key for record in refined}
    assert all(by_point[key].screen.pairs == SCREEN_PAIRS for key in unrefined)
    without = night(SimulatedMachine(GPU_RUNNER, np.random.default_rng(6)), points=NIGHTLY[:8],
                    plan=gate_plan(ProcessOptions(), refine_points=0))
    assert ("refine", "new") not in night.recorded and all(v.screen.pairs == SCREEN_PAIRS for v in without)


def spread_nights(spread: float, nights: int) -> list[tuple[float, ...]]:
    """Nights of three pairs whose differences give exactly `spread` (each night the same, centred anywhere)."""
    step = spread * stats.norm.ppf(0.75) * math.sqrt(2)
    return [(0.01 * night - step, 0.01 * night, 0.01 * night + step) for night in range(nights)]


def test_the_screen_shares_its_pairs_by_each_points_noise_on_earlier_nights():
    plan = gate_plan(ProcessOptions())
    quiet, noisy = {f"q{i}": spread_nights(0.026, 4) for i in range(7)}, {f"n{i}": spread_nights(0.079, 4)
                                                                         for i in range(9)}
    shared = rules.screen_allocation({**quiet, **noisy}, plan)
    # in proportion to each spread, the quiet ones held at the fewest a point can be judged from
    assert {shared[key] for key in quiet} == {plan.min_quiet} and {shared[key] for key in noisy} == {4}
    assert abs(sum(shared.values()) - SCREEN_PAIRS * 16) <= len(shared) / 2  # the plan's pairs, up to rounding
    # a point with too few earlier pairs is taken at the others' median spread
    shared = rules.screen_allocation({**quiet, **noisy, "new": spread_nights(0.5, 1)}, plan)
    assert shared["new"] == max(shared[key] for key in noisy)
    # no history, too little of it, or points alike: every point gets the plan's pairs
    for history in ({key: [] for key in shared}, {key: nights[:1] for key, nights in {**quiet, **noisy}.items()},
                    {f"p{i}": spread_nights(0.05, 4) for i in range(16)}):
        assert set(rules.screen_allocation(history, plan).values()) == {SCREEN_PAIRS}
    # never more than twice the plan's pairs, however noisy a point was
    assert max(rules.screen_allocation({**quiet, "wild": spread_nights(5.0, 8)}, plan).values()) == 2 * SCREEN_PAIRS


def screen_records(side: str, tonight: dict[str, tuple[float, ...]]) -> tuple:
    """One side's frames of a screen whose pairs have these log ratios (new over ref), by point key."""
    records = [PointRecord(key, {}, "ok", "", 0.0, samples=[
        (pair, {"sps": 1000.0 * (math.exp(ratio) if side == "new" else 1.0), "phases": {},
                "interference": {"contended": False}}) for pair, ratio in enumerate(ratios)])
        for key, ratios in tonight.items()]
    return frames(records)


def test_the_screen_weighs_each_points_pairs_at_its_own_spread_on_earlier_nights():
    """A quiet point whose three pairs agree on 6-7% slower leads an unchanged noisy point with two wide pairs
    that way, once each is read at its own spread: at the night's one spread the noisy one led, and a slowed
    point with a narrow noise lost its place among the suspects to eager points' wide pairs."""
    quiet, noisy = ([json.dumps({"point": f"{kind}{i}"}) for i in range(4)] for kind in "qn")
    history = {**{key: spread_nights(0.01, 8) for key in quiet}, **{key: spread_nights(0.08, 8) for key in noisy}}
    tonight = dict(zip(quiet, [(-0.07, -0.06, -0.065), (0.01, -0.005, 0.0), (0.0, 0.01, -0.01), (0.005, -0.01, 0.0)]))
    tonight.update(zip(noisy, [(-0.13, 0.04, -0.11), (0.09, -0.05, 0.02), (-0.06, 0.1, 0.03), (0.05, -0.08, 0.0)]))
    plan = gate_plan(ProcessOptions())
    weighed = replace(plan, point_spreads=rules.relative_spreads(history))
    assert {round(weighed.point_spreads[key] * weighed.point_spreads[other], 6)
            for key, other in zip(quiet, noisy)} == {1.0}  # relative to the median, between the two kinds

    def strongest(plan: rules.GatePlan) -> str:
        found = rules.screen(*screen_records("new", tonight), *screen_records("ref", tonight), plan)
        return rules.suspects(found, replace(plan, max_suspects=1))[0].point_key

    assert strongest(weighed) == quiet[0] and strongest(plan) == noisy[0]
    # points the earlier nights do not tell apart are all read at the night's spread, as before
    assert rules.relative_spreads({key: spread_nights(0.05, 8) for key in quiet + noisy}) == {}


def test_a_night_screens_each_point_in_the_pairs_it_was_given():
    machine = SimulatedMachine(replace(GPU_RUNNER, contended=0.0), np.random.default_rng(4))  # none made up for
    given = {NIGHTLY[0].key: 5, NIGHTLY[1].key: 2}
    recorded = {}
    Night(gate_plan(ProcessOptions(), refine_points=0), lambda text: None, random.Random(0), clock=machine.clock,
          screen_pairs=given).run(
        NIGHTLY[:3], lambda stage: {side: machine.runner(side, Path("/nonexistent")) for side in SIDES},
        lambda stage, side, record: recorded.setdefault((stage, side), []).append(record), lambda point: None,
        lambda point: [], night_s=1e9)
    screened = {record.point_key: len(record.samples) for record in recorded[("screen", "new")]}
    assert screened == {NIGHTLY[0].key: 5, NIGHTLY[1].key: 2, NIGHTLY[2].key: SCREEN_PAIRS}


def test_only_the_suspects_with_the_strongest_evidence_are_confirmed_each_at_its_share_of_alpha():
    machine = SimulatedMachine(GPU_RUNNER, np.random.default_rng(3))
    slowdowns = (0.2, 0.25, 0.3, 0.35, 0.5, 0.6)  # the two slowest apart from the rest by far more than the noise
    machine.slowdowns = {("new", point.key): slowdown for point, slowdown in zip(NIGHTLY, slowdowns)}
    plan = gate_plan(ProcessOptions(), max_suspects=2)
    found = night(machine, points=NIGHTLY[:8], plan=plan)
    regressed = [v.screen.point_key for v in found if v.status == rules.REGRESSED]
    assert sorted(regressed) == sorted(point.key for point in NIGHTLY[4:6])  # the two slowest: the most evidence
    assert all(v.status == rules.NOT_CONFIRMED and v.confirmation is None for v in found[:4])  # beyond the two
    assert all(v.status in (rules.PASSED, rules.NOT_CONFIRMED) for v in found[6:])
    assert found[5].confirmation.decision is not None
    # the strongest suspect at 80% of alpha, the other at the rest, or at all of it once the first is claimed
    assert plan.confirmation(2, 0).alpha == pytest.approx(0.008)
    assert plan.confirmation(2, 1).alpha == pytest.approx(0.002)
    assert plan.confirmation(2, 1, (True,)).alpha == pytest.approx(0.01)
    assert plan.confirmation(1).alpha == pytest.approx(0.01)
    # a plan stored before the shares: alpha / suspects, nothing passed on
    before = rules.GatePlan.from_dict({key: value for key, value in plan.to_dict().items() if key != "lead_share"})
    assert before.confirmation(2, 1, (True,)).alpha == pytest.approx(0.005)


def test_the_screens_evidence_grows_with_the_slowdown_and_a_pair_far_out_counts_little():
    scale, toward = 0.03, 0.10
    slowed = [float(rules.evidence(np.full(4, np.log1p(-slowdown)), scale, toward)) for slowdown in (0.05, 0.1, 0.5)]
    assert slowed[0] < slowed[1] < slowed[2] and rules.evidence(np.zeros(4), scale, toward) < 0
    # two wide pairs on the faster side leave two pairs 10% slower a suspect, which by their estimate (+2%) it
    # would not be
    pairs = np.log([0.90, 0.91, 1.06, 1.25])
    assert rules.evidence(pairs, scale, toward) > rules.EVIDENCE_BAR and sequential.hodges_lehmann(pairs) > 0


def test_a_point_screened_in_more_pairs_detects_a_smaller_slowdown():
    # the report's 'detects' weighs a point at the pairs its share of the screen (or the refinement) gave it
    plan = gate_plan(ProcessOptions())
    few, many = (rules.Screened("k", "k", "p", "ok", pairs=n, quiet=n, spread=0.06) for n in (2, 5))
    assert rules.point_detectable(plan, many) < rules.point_detectable(plan, few)
    assert rules.point_detectable(plan, replace(few, quiet=SCREEN_PAIRS)) == rules.detectable(plan, 0.06)


def test_a_point_that_got_much_slower_makes_no_other_point_a_suspect():
    """In a suite of two, one point 75% slower is half the night's pairs: pooled, they widened the night's spread
    so far that the unchanged point looked as likely slowed as not, and was confirmed for nothing."""
    two = NIGHTLY[:2]
    capped = gate_plan(ProcessOptions())
    pooled_suspects = 0
    for seed in range(3):
        for plan in (capped, replace(capped, spread_cap=0.0)):  # the second judges as plans stored before did
            machine = SimulatedMachine(GPU_RUNNER, np.random.default_rng(seed))
            machine.slowdowns = {("new", two[1].key): 0.75}
            by_point = {v.screen.point_key: v for v in night(machine, points=two, plan=plan, seed=seed)}
            assert by_point[two[1].key].status == rules.REGRESSED
            if plan.spread_cap:
                assert not by_point[two[0].key].screen.suspect and by_point[two[0].key].status == rules.PASSED
            else:
                pooled_suspects += by_point[two[0].key].screen.suspect
    assert pooled_suspects == 3


def test_what_the_gate_detects_grows_with_the_noise():
    plan = gate_plan(ProcessOptions())
    quiet, noisy = rules.detectable(plan, 0.028), rules.detectable(plan, 0.12)
    assert plan.threshold < quiet < 0.08 < noisy < 0.6


# ---- real trainer processes --------------------------------------------------------------------------------------

TINY_POINTS = """
description = "two tiny points"
repeats = 3
timeout_s = 300
sample_hz = 0

[fixed]
device = "cpu"
env = "synthetic"
horizon = 8
minibatch_size = 64
hidden_size = 32
total_steps = 2048
threads = 1

[axes]
num_envs = [16, 24]
"""
# four learn steps an epoch, each 10 ms longer at num_envs=24 only: several times slower there, nowhere else
PLANT = 'if cfg.num_envs == 24: __import__("time").sleep(0.01)  # planted: only this point waits'


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_delay_planted_in_one_point_fails_the_gate_naming_it(tmp_path):
    repo = project_repo(tmp_path)
    (tmp_path / "two.toml").write_text(TINY_POINTS)
    bad = rlperf(repo, "gate", "--suite", "missing.toml", "--baseline", "HEAD", timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("rlperf gate: error: suite:")
    plant_in_learn_step(repo, PLANT)
    done = rlperf(repo, "gate", "--suite", str(tmp_path / "two.toml"), "--baseline", "HEAD", "--max-repeats", "8",
                  "--out", "../out", timeout=880)
    assert done.returncode == 1, done.stdout + done.stderr
    *_, last, which = done.stdout.strip().splitlines()
    assert last.startswith("gate: regressed: num_envs=24 -")
    # the last line: the traced diff that says which operator grew
    assert which.startswith("which operator: rlperf profile ") and " --against HEAD --out " in which
    # a new store knows nothing of this machine: the forecast comes from the screen's first point
    assert "forecast: none yet (the store is empty)" in done.stdout
    assert "forecast from the screen's first point: screen " in done.stdout
    assert "forecast against measured: screen " in done.stdout
    with Store.open(tmp_path / "out" / "results.sqlite", readonly=True) as store:
        runs = store.runs()
        stages = {(f["gate"]["stage"], f["gate"]["side"]) for f in runs["fingerprint"]}
        assert stages == {(stage, side) for stage in ("screen", "refine", "confirm") for side in SIDES}
        assert set(runs["status"]) == {"complete"}
        screen_new = runs[[f["gate"] == {**f["gate"], "stage": "screen", "side": "new"} for f in runs["fingerprint"]]]
        run_id = screen_new["run_id"].iloc[0]
    report = (tmp_path / "out" / run_id / "report" / "report.md").read_text()
    assert "Gate: did any point get slower?" in report and "gate: regressed: num_envs=24" in report
    # the same runs shown again later: the same verdicts, from the store alone
    ref_run = screen_new["fingerprint"].iloc[0]["gate"]["runs"]["screen_ref"]
    again = rlperf(repo, "report", f"../out/results.sqlite::{run_id}", "--baseline",
                   f"../out/results.sqlite::{ref_run}", "--out", "../again", timeout=120)
    assert again.returncode == 1, again.stdout + again.stderr
    assert "gate: regressed: num_envs=24" in (tmp_path / "again" / "report.md").read_text()
    # the same code on both sides passes (exit 0); the stages were all seen above, so a screen of two pairs will do
    git(repo, "checkout", "--", ".")
    clean = rlperf(repo, "gate", "--suite", str(tmp_path / "two.toml"), "--baseline", "HEAD", "--max-repeats", "8",
                   "--screen-pairs", "2", "--refine-points", "0", "--out", "../clean", "--summary", "../clean.json",
                   timeout=880)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert json.dumps(clean.stdout.strip().splitlines()[-1]).startswith('"gate: no point got slower')
    # peak memory beside the verdicts, as information: each point's on both sides
    memory = json.loads((tmp_path / "clean.json").read_text())["memory"]
    assert {row["point"] for row in memory} == {"num_envs=16", "num_envs=24"}
    assert all(row["measure"] == "host_peak_rss_bytes" and row["baseline_bytes"] > 0 for row in memory)
    assert "peak memory (information, not a verdict)" in clean.stdout


def start_gate(repo: Path, out: Path, temp: Path) -> subprocess.Popen:
    """`rlperf gate` of one tiny point in two screen pairs, making its checkouts in `temp`."""
    (out.parent / "one.toml").write_text(TINY_POINTS.replace("[16, 24]", "[16]"))
    return subprocess.Popen([sys.executable, "-m", "rlperf", "gate", "--suite", str(out.parent / "one.toml"),
                             "--baseline", "HEAD", "--screen-pairs", "2", "--out", str(out)], cwd=repo,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=environment(repo, TMPDIR=str(temp), PYTHONUNBUFFERED="1"))


def wait_for_screen(gate: subprocess.Popen, out: Path) -> None:
    """Until the gate's screen has started its first process."""
    deadline = time.monotonic() + 120
    while not list(out.glob("*/points/*")):
        assert gate.poll() is None, gate.communicate()
        assert time.monotonic() < deadline, "the gate did not start its screen within 120 s"
        time.sleep(0.1)


def checkouts(repo: Path, temp: Path) -> tuple[int, list[Path]]:
    """The checkouts git lists beside the repository's own, and the folders made for them."""
    listed = [line for line in git(repo, "worktree", "list", "--porcelain").splitlines()
              if line.startswith("worktree ")]
    return len(listed) - 1, sorted(temp.glob("rlperf-worktree-*"))


@pytest.mark.timeout(300)
def test_a_killed_gates_checkout_is_pruned_by_the_next_gate_and_a_stopped_gate_leaves_none(tmp_path):
    repo = project_repo(tmp_path)
    temp = tmp_path / "tmp"
    temp.mkdir()
    killed = start_gate(repo, tmp_path / "killed", temp)
    wait_for_screen(killed, tmp_path / "killed")
    killed.kill()  # SIGKILL, as a CI step's timeout ends what ignores its SIGTERM
    killed.communicate()
    left, left_folders = checkouts(repo, temp)
    # a SIGKILL leaves its twin checkouts, in one folder: no process can remove them then
    assert left == 2 and len(left_folders) == 1
    stopped = start_gate(repo, tmp_path / "stopped", temp)
    wait_for_screen(stopped, tmp_path / "stopped")
    running, folders = checkouts(repo, temp)
    assert running == 2 and len(folders) == 1 and folders != left_folders  # the killed one's are gone, not its own
    stopped.send_signal(signal.SIGTERM)  # a timeout's first signal: the gate ends as Ctrl-C ends it
    stdout, stderr = stopped.communicate(timeout=120)
    assert stopped.returncode == 130 and stderr.strip().splitlines()[-1] == "rlperf gate: interrupted", stderr
    assert f"removed 1 checkout(s) left by a killed process: {left_folders[0]}" in stdout
    assert checkouts(repo, temp) == (0, [])
    with Store.open(tmp_path / "stopped" / "results.sqlite", readonly=True) as store:
        assert set(store.runs()["status"]) == {"interrupted"}

