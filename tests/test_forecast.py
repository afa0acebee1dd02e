"""The gate's forecast (benches/forecast.py): what a night will cost, from the walls of earlier processes of the
same points on the same machine in a real store, with its fallbacks named; and how far off it was."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from benches import forecast
from benches import suite as suites
from benches.night import MAX_SUSPECTS, REFINE_PAIRS, REFINE_POINTS, SCREEN_PAIRS, gate_plan
from benches.options import ProcessOptions
from decisions import screening as rules
from rlperf.errors import BadInput
from rlperf.store import PointRecord, Store

SUITE = """
    [fixed]
    env = "synthetic"
    horizon = 8
    minibatch_size = 64
    total_steps = 2048
    [axes]
    num_envs = [8, 16, 32]
"""


@pytest.fixture
def points(tmp_path):
    path = tmp_path / "three.toml"
    path.write_text(textwrap.dedent(SUITE))
    return list(suites.load(str(path)).points)


def store_run(store: Store, machine: str, records: list[tuple[suites.Point, list[float], dict]],
              launch: str | None = None) -> str:
    """A run of `records` (point, process walls, settings changed); `launch` None stores processes as the
    harness did before it recorded how they started."""
    run_id = store.create_run("three", "hash", {}, machine)
    account = {} if launch is None else {"launch": launch}
    for point, walls, changed in records:
        record = PointRecord(point.key, {**point.config, **changed}, "ok", "now", sum(walls))
        record.samples = [(repeat, {"sps": 1.0, "wall_seconds": wall - 2,
                                    "interference": {"wall_s": wall, **account}})
                          for repeat, wall in enumerate(walls)]
        store.record_point(run_id, record)
    store.finish_run(run_id, "complete")
    return run_id


def plan(screen_pairs=SCREEN_PAIRS, max_suspects=MAX_SUSPECTS, refine_points=REFINE_POINTS, **options):
    return gate_plan(ProcessOptions(suite="three", **options), screen_pairs, max_suspects, refine_points)


def test_a_point_costs_the_median_of_its_own_processes_on_this_machine_and_an_unknown_one_the_machines_median(
        tmp_path, points):
    eight, sixteen, thirty_two = points
    with Store.open(tmp_path / "results.sqlite") as store:
        store_run(store, "m1", [(eight, [10.0, 12.0, 30.0], {}), (sixteen, [20.0, 21.0], {})])
        # the same points elsewhere, and with another setting here, tell nothing about this machine's night
        store_run(store, "m2", [(thirty_two, [500.0], {}), (eight, [500.0], {})])
        store_run(store, "m1", [(sixteen, [900.0], {"horizon": 4})])
        found = forecast.predict(store, "m1", points, plan(screen_pairs=3, max_suspects=1, refine_points=1,
                                                           max_repeats=10), 1e6, launch="fresh")
    assert [cost.process_s for cost in found.points] == [12.0, 20.5, 20.0]  # 20.0: the median of all five here
    assert [cost.known_from for cost in found.points] == [3, 2, 0]
    assert found.screen_s == pytest.approx(6 * (12.0 + 20.5 + 20.0))
    assert found.confirm_max_s == pytest.approx(2 * 10 * 20.5)  # one suspect, at most 10 pairs of the costliest
    # one leader refined, by REFINE_PAIRS pairs: the cheapest point or the costliest
    assert found.refine_s == pytest.approx((2 * REFINE_PAIRS * 12.0, 2 * REFINE_PAIRS * 20.5))
    first, costliest = found.lines()
    assert f"refinement {forecast.duration(found.refine_s[0])} to {forecast.duration(found.refine_s[1])}" in first
    assert "2 of them from their own earlier processes here, the others at this machine's median process (20 s)" \
        in first
    assert costliest.startswith("forecast: costliest points: num_envs=16 2 min 03 s (20 s a process); "
                                "num_envs=32")


def test_a_night_is_forecast_from_processes_started_as_its_own_will_be(tmp_path, points):
    eight = points[0]
    with Store.open(tmp_path / "results.sqlite") as store:
        store_run(store, "m1", [(eight, [3.0, 3.2], {})])  # before the launch was recorded: fresh
        store_run(store, "m1", [(eight, [3.4], {})], launch="fresh")
        store_run(store, "m1", [(eight, [0.4, 0.5, 0.6], {})], launch="forked")
        forked = forecast.predict(store, "m1", points[:1], plan(), night_s=600.0, launch="forked")
        fresh = forecast.predict(store, "m1", points[:1], plan(), night_s=3600.0, launch="fresh")
    assert (forked.points[0].process_s, forked.points[0].known_from) == (0.5, 3)
    assert (fresh.points[0].process_s, fresh.points[0].known_from) == (3.2, 3)


def test_a_store_that_knows_nothing_of_this_machine_forecasts_nothing_and_says_why(tmp_path, points):
    with Store.open(tmp_path / "results.sqlite") as store:
        assert forecast.predict(store, "m1", points, plan(), night_s=3600.0, launch="fresh") is None
        empty = forecast.unknown(store, "m1")
        store_run(store, "m2", [(points[0], [5.0], {})])
        assert forecast.predict(store, "m1", points, plan(), night_s=3600.0, launch="fresh") is None
        elsewhere = forecast.unknown(store, "m1")
        store_run(store, "m1", [(points[0], [5.0], {})], launch="fresh")
        assert forecast.predict(store, "m1", points, plan(), night_s=3600.0, launch="forked") is None
        started_otherwise = forecast.unknown(store, "m1")
        # one point known: the others cost this machine's median, and the night caps the confirmation
        found = forecast.predict(store, "m1", points, plan(), night_s=3600.0, launch="fresh")
    assert empty == ("forecast: none yet (the store is empty); it follows the screen's first point, from that "
                     "point's processes")
    assert "(the store holds no run of this machine)" in elsewhere
    assert "(the store holds no process of these points on this machine started this way)" in started_otherwise
    assert [cost.process_s for cost in found.points] == [5.0] * 3
    assert [cost.known_from for cost in found.points] == [1, 0, 0]
    assert "the others at this machine's median process (5 s)" in found.lines()[0]
    assert found.confirm_max_s == 2 * 40 * 5.0 * 2  # every suspect's pairs cost less than what the night leaves
    assert found.lines("forecast from the screen's first point")[1].startswith(
        "forecast from the screen's first point: costliest points: ")


def test_the_review_sets_each_stage_s_stored_processes_against_the_forecast(tmp_path, points):
    with Store.open(tmp_path / "results.sqlite") as store:
        store_run(store, "m1", [(point, [10.0], {}) for point in points])
        found = forecast.predict(store, "m1", points, plan(screen_pairs=2, refine_points=2), night_s=800.0,
                                 launch="fresh")
        assert found.screen_s == pytest.approx(120.0)
        assert found.refine_s == pytest.approx((2 * REFINE_PAIRS * 20.0,) * 2)
        runs = {("screen", "ref"): store_run(store, "m1", [(point, [11.0, 11.0], {}) for point in points]),
                ("screen", "new"): store_run(store, "m1", [(point, [13.0, 13.0], {}) for point in points]),
                ("refine", "ref"): store_run(store, "m1", [(point, [10.0] * 2, {}) for point in points[:2]]),
                ("refine", "new"): store_run(store, "m1", [(point, [10.0] * 2, {}) for point in points[:2]]),
                ("confirm", "ref"): store_run(store, "m1", [(points[0], [10.0] * 4, {})]),
                ("confirm", "new"): store_run(store, "m1", [(points[0], [10.0] * 4, {})])}
        line = found.review(store, runs, elapsed_s=250.0)
    assert line == ("forecast against measured: screen 2 min 24 s of processes where 2 min 00 s was forecast "
                    "(+20%); refinement 1 min 20 s (1 min 20 s to 1 min 20 s forecast); confirmation 1 min 20 s (at "
                    "most 10 min 00 s forecast); the night 4 min 10 s in all")


def test_a_gate_without_a_refinement_forecasts_none(tmp_path, points):
    with Store.open(tmp_path / "results.sqlite") as store:
        store_run(store, "m1", [(point, [10.0], {}) for point in points])
        found = forecast.predict(store, "m1", points, plan(refine_points=0), night_s=3600.0, launch="fresh")
    assert found.refine_s == (0.0, 0.0) and "refinement" not in found.lines()[0]


def test_a_night_its_screen_would_fill_is_said_before_it_is_measured(tmp_path, points):
    with Store.open(tmp_path / "results.sqlite") as store:
        store_run(store, "m1", [(point, [10.0], {}) for point in points])
        fits = forecast.predict(store, "m1", points, plan(screen_pairs=2, refine_points=2), night_s=800.0,
                                launch="fresh")
        full = forecast.predict(store, "m1", points, plan(screen_pairs=2, refine_points=2), night_s=150.0,
                                launch="fresh")
    assert not fits.overrun and len(fits.lines()) == 2
    assert full.overrun and full.confirm_max_s == 0.0
    assert full.lines()[1] == ("forecast: the screen and refinement may take 3 min 20 s of the night's 2 min 30 s, "
                               "leaving suspects no time to be confirmed: raise --night-s or lower --screen-pairs")


def store_gate_screen(store: Store, machine: str, sps: list[tuple[suites.Point, list[float], list[float]]],
                      settings: dict | None = None) -> str:
    """A gate night's screen as `rlperf gate` stores it: the baseline's run and the working tree's naming it, each
    point's processes (`sps`: the point, the baseline's SPS and the working tree's, pair by pair) costing 10 s."""
    runs = {}
    for side, index in (("ref", 1), ("new", 2)):
        entry = {"stage": "screen", "side": side, "runs": {f"screen_{s}": r for s, r in runs.items()}}
        runs[side] = run_id = store.create_run("three", "hash", {"gate": entry}, machine)
        for row in sps:
            point = row[0]
            record = PointRecord(point.key, {**point.config, **(settings or {})}, "ok", "now", 10.0)
            record.samples = [(repeat, {"sps": value, "interference": {"wall_s": 10.0, "launch": "forked"}})
                              for repeat, value in enumerate(row[index])]
            store.record_point(run_id, record)
        store.finish_run(run_id, "complete")
    return runs["new"]


def test_earlier_gate_screens_share_out_the_screen_and_the_forecast_counts_each_points_pairs(tmp_path, points):
    eight, sixteen, thirty_two = points
    steady, noisy = [100.0, 100.0, 100.0], [90.0, 100.0, 111.0]
    with Store.open(tmp_path / "results.sqlite") as store:
        for night in range(3):
            store_gate_screen(store, "m1", [(eight, steady, [99.0, 100.0, 101.0]), (sixteen, steady, noisy),
                                            (thirty_two, steady, [100.5, 100.0, 99.5])])
        store_gate_screen(store, "m2", [(eight, steady, noisy)])  # another machine's
        store_gate_screen(store, "m1", [(eight, steady, [50.0, 100.0, 200.0])], {"horizon": 4})  # other settings
        history = forecast.screen_history(store, "m1", points, plan())
        shared = rules.screen_allocation(history, plan())
        found = forecast.predict(store, "m1", points, plan(), night_s=3600.0, launch="forked", screen_pairs=shared)
    assert {key: len(nights) for key, nights in history.items()} == {eight.key: 3, sixteen.key: 3, thirty_two.key: 3}
    assert history[sixteen.key][0] == pytest.approx(tuple(np.log(np.array(noisy) / 100.0)))
    assert shared[sixteen.key] > SCREEN_PAIRS and shared[eight.key] == shared[thirty_two.key] == 2
    assert found.screen_s == pytest.approx(2 * 10.0 * sum(shared.values()))
    assert f"(3 points x 4 to {2 * shared[sixteen.key]} processes;" in found.lines()[0]


@pytest.mark.parametrize("seconds, text", [(7.4, "7 s"), (125, "2 min 05 s"), (3 * 3600 + 15 * 60, "3 h 15 min")])
def test_durations_read_as_a_person_would_say_them(seconds, text):
    assert forecast.duration(seconds) == text


def test_a_night_that_holds_its_screen_and_the_suspects_first_looks_keeps_every_pair():
    plan = gate_plan(ProcessOptions())
    costs = {"a": 10.0, "b": 10.0, "c": 20.0, "d": 30.0}
    fit = forecast.fit_night(costs, {key: 3 for key in costs}, plan, 3600.0)
    assert fit.cut == {} and fit.pairs == {key: 3 for key in costs} and fit.suspects == plan.max_suspects
    assert fit.screen_s == (420.0, 420.0) and fit.refine_s == 2 * REFINE_PAIRS * 4 * 15.0
    # the lead's first look at the costliest point's pair, the second suspect's at the next costliest
    assert fit.reserve_s == plan.confirmation(2, 0).looks[0] * 60.0 + plan.confirmation(2, 1).looks[0] * 40.0


def test_a_night_too_short_takes_screen_pairs_from_quiet_points_first_then_suspects_then_refuses():
    plan = gate_plan(ProcessOptions())
    costs = {"quiet": 10.0, "loud": 10.0, "costly": 40.0, "done": 10.0}
    pairs = {"quiet": 3, "loud": 4, "costly": 3, "done": 3}
    spreads = {"quiet": 0.4, "loud": 1.5, "costly": 1.0, "done": 0.4}
    roomy = forecast.fit_night(costs, pairs, plan, 1e9, spreads)
    night_s = roomy.screen_s[0] + roomy.refine_s + roomy.reserve_s - 15.0  # less than an ordinary pair too long
    fit = forecast.fit_night(costs, pairs, plan, night_s, spreads, fixed=frozenset({"done"}))
    assert fit.cut == {"quiet": (3, 2)} and fit.suspects == 2  # quiet, and a cheap pair loses least per second
    assert fit.screen_s[1] + fit.refine_s + fit.reserve_s <= night_s
    shorter = forecast.fit_night(costs, pairs, plan, night_s - 100.0, spreads, fixed=frozenset({"done"}))
    assert shorter.pairs["done"] == 3 and shorter.pairs["quiet"] == plan.min_quiet
    assert shorter.cut["costly"] == (3, 2) and shorter.suspects == 2  # a costly pair saves the most seconds
    assert shorter.screen_s[1] + shorter.refine_s + shorter.reserve_s <= night_s - 100.0
    # where two suspects' first looks cannot fit beside the fewest pairs, one suspect is confirmed
    fewest = sum(2 * 2 * cost for cost in costs.values())
    one = forecast.fit_night(costs, pairs, plan, fewest + roomy.refine_s + plan.confirmation(1).looks[0] * 80.0,
                             spreads)
    assert one.suspects == 1 and one.pairs == {key: 2 for key in costs}
    with pytest.raises(BadInput) as refused:  # not before a point is screened: its plan is stored
        forecast.fit_night(costs, pairs, plan, one.screen_s[1] + one.refine_s + one.reserve_s, spreads,
                           fixed=frozenset({"done"}), fewer_suspects=False)
    with pytest.raises(BadInput) as refused:
        forecast.fit_night(costs, pairs, plan, 600.0, spreads)
    message = str(refused.value)
    assert message.startswith("night-s: 600 s cannot hold the screen at its fewest pairs (2 a point, ")
    needed = int(message.rsplit("at least ", 1)[1].split(",")[0])
    assert forecast.fit_night(costs, pairs, plan, float(needed), spreads).pairs == {key: 2 for key in costs}


def test_a_fitted_night_says_what_it_cut_and_what_each_cut_point_can_then_detect(points):
    plan = gate_plan(ProcessOptions())
    fit = forecast.NightFit({points[0].key: 2}, {points[0].key: (3, 2)}, 1, (600.0, 540.0), 60.0, 300.0)
    history = {points[0].key: [(0.05, -0.02, 0.01), (0.0, 0.04, -0.03)]}
    line = forecast.fit_line(fit, points, plan, 1800.0, history)
    assert line.startswith("night: fitted to 30 min 00 s, keeping 5 min 00 s for the suspects' first looks at the "
                           "costliest points: 1 suspect confirmed rather than 2 (a suspect beyond is undecided); "
                           "1 point gets fewer pairs, the screen 10 min 00 s -> 9 min 00 s: "
                           f"{points[0].label} 3 -> 2 pairs, detecting "), line
    after, before = (float(part.split("%")[0]) for part in line.split("detecting ")[1].split(" rather than "))
    assert after > before > 0
    assert "no earlier screen here" in forecast.fit_line(fit, points, plan, 1800.0, {})
    kept = forecast.NightFit({}, {}, plan.max_suspects, (1.0, 1.0), 0.0, 0.0)
    assert forecast.fit_line(kept, points, plan, 60.0, {}) is None
