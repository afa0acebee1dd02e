"""Change points in the history: synthetic histories drawn from fixed seeds (studies/changepoint_power.py) test
the detection itself (a step is found at its run, noise and night offsets yield none, the p-values hold their
level, every split clears one critical value, the shift is corrected for picking it); a history of real trainer
runs made in a copy of this project, with a commit that slows `learn` from one run on, must show that change
point, at that run, with `learn` among the phases that moved, on the page and on the terminal, and `rlperf
confirm` must confirm it by measuring the two commits again in pairs."""

from __future__ import annotations

import dataclasses
import re
import textwrap

import numpy as np
import pytest
from projectrepo import commit, plant_in_learn_step, project_repo, rlperf

from reference_trainer.config import PHASES
from studies.changepoint_power import SHARES, history as simulated_history, synthetic_run
from decisions import changepoints
from decisions.rundata import RunData, load_run
from reports.history import measures_its_moment
from rlperf.store import Store


def history(seed: int, runs: int, shift_at: int | None = None, slower: dict[str, float] | None = None,
            **options) -> list[RunData]:
    options = {"process_noise": 0.06, **options}
    return simulated_history(np.random.default_rng(seed), runs, shift_at, slower, **options)


def test_the_trend_holds_a_gate_night_once_its_screen_of_tonights_commit():
    gate_runs = {(stage, side): {"gate": {"stage": stage, "side": side}}
                 for stage in ("screen", "refine", "confirm") for side in ("ref", "new")}
    in_trend = {key for key, fingerprint in gate_runs.items() if measures_its_moment(fingerprint)}
    assert in_trend == {("screen", "new")}
    assert measures_its_moment({}) and not measures_its_moment({"bisect": {}})


def test_a_slower_learn_phase_is_found_at_its_run_with_its_size_and_phase():
    runs = history(1, 16, shift_at=9, slower={"learn": 2.0})
    found = changepoints.find(runs, threshold=0.05, alpha=0.05)
    assert [(c.metric, c.order, c.run_id) for c in found] == [("SPS", 9, "run-9")]
    change = found[0]
    # learn is 35% of the step: twice as long makes the step 1.35 times as long.
    assert change.shift.low < 1 / 1.35 - 1 < change.shift.high
    assert change.shift.high < 0 and change.worse
    assert change.p_value < 0.01
    assert (change.runs_before, change.runs_after) == (9, 7)
    assert [phase for phase, _ in change.phases_moved] == ["learn"]
    assert change.phases_moved[0][1].low > 0.5  # learn at least 50% slower, from its own interval
    assert change.sentence().startswith("SPS fell 2") and "(learn +" in change.sentence()
    assert "at 0009abc" in change.sentence()


def test_a_step_up_and_back_gives_two_change_points():
    slow = {"eval_forward": 3.0}
    runs = history(2, 24, slower=None)
    slowed = history(2, 24, shift_at=0, slower=slow)
    runs = runs[:8] + slowed[8:16] + runs[16:]
    found = changepoints.find(runs, threshold=0.05, alpha=0.05)
    assert [(c.metric, c.order, c.worse) for c in found] == [("SPS", 8, True), ("SPS", 16, False)]
    assert all(c.phases_moved[0][0] == "eval_forward" for c in found)
    # Each shift is measured between its neighbours: 8 runs before the first, 8 between, 8 after the second.
    assert [(c.runs_before, c.runs_after) for c in found] == [(8, 8), (8, 8)]


def test_a_phase_that_moved_without_moving_sps_gets_its_own_change_point():
    # env twice as slow while eval_forward is as much faster: the step, and so SPS, stays the same.
    runs = history(3, 16, shift_at=8, slower={"env": 2.0, "eval_forward": 0.8}, repeats=4)
    found = changepoints.find(runs, threshold=0.05, alpha=0.05)
    assert {(c.metric, c.order) for c in found} == {("env", 8), ("eval_forward", 8)}
    env = next(c for c in found if c.metric == "env")
    assert env.worse and env.sentence().startswith("env got ") and " slower at 0008abc" in env.sentence()


def test_noise_and_night_offsets_alone_yield_no_change_points():
    """Forty histories of process noise and night offsets, 5 to 30 runs of one or three points: runs are the
    unit and Benjamini-Hochberg runs over every series of a history, so the chance of any change point in it
    stays near alpha."""
    with_change = 0
    for seed in range(40):
        runs = history(100 + seed, runs=5 + (seed * 5) % 26, points=1 + seed % 3 // 2 * 2, run_offset=0.05,
                       process_noise=0.02, repeats=5, tail_df=4.0)
        with_change += bool(changepoints.find(runs, threshold=0.05, alpha=0.05))
    assert with_change <= 4, with_change  # about 2 expected at alpha 0.05


def test_shuffling_repeats_across_runs_would_take_night_offsets_for_changes():
    """Why runs are the unit: the same offsets, scanned with the repeats pooled and shuffled among runs, reach
    a small p in most series; scanned run by run they do not."""
    pooled = by_run = 0
    rng = np.random.default_rng(9)
    for seed in range(20):
        series = next(iter(changepoints.point_series(history(200 + seed, 10, run_offset=0.03, process_noise=0.02,
                                                             repeats=5)).values()))["SPS"]
        by_run += changepoints.scan(series.levels, rng).p_value <= 0.01
        repeats = np.concatenate(series.values)
        shuffled_levels = np.array([np.median(np.log(chunk)) for chunk in np.split(rng.permutation(repeats), 10)])
        pooled += changepoints.scan(np.log([np.median(v) for v in series.values]), rng).p_value <= 0.01 and \
            changepoints.scan(shuffled_levels, rng).p_value > 0.01
    assert by_run <= 1 and pooled == by_run


def test_the_scan_p_value_holds_its_level_and_finds_the_split():
    rng = np.random.default_rng(4)
    shuffles = np.random.default_rng(changepoints.SEED)
    null = [changepoints.scan(rng.normal(0, 0.05, length), shuffles).p_value
            for length in (5, 10, 20, 30) for _ in range(40)]
    assert np.mean(np.array(null) < 0.05) <= 0.09  # 8 of 160 expected
    assert np.mean(np.array(null) < 0.5) >= 0.35  # and it is not stuck at 1
    levels = np.r_[rng.normal(0, 0.03, 8), rng.normal(np.log(0.7), 0.03, 8)]
    found = changepoints.scan(levels, shuffles)
    assert 8 in found.stretch and found.p_value < 0.01


def test_every_split_of_a_series_clears_one_critical_value():
    levels = np.r_[np.zeros(6), np.full(6, -0.3), np.full(6, -0.36)] + np.linspace(-0.001, 0.001, 18)
    whole = changepoints.scan(levels, np.random.default_rng(0))
    assert 6 in whole.stretch
    strict = changepoints.critical_value(whole.null, whole.p_value)  # the level a family accepted it at
    loose = changepoints.critical_value(whole.null, 0.9)
    assert loose < strict
    assert changepoints.segment(levels, 0, 18, strict, threshold=0.05) == [6]
    assert changepoints.segment(levels, 0, 18, loose, threshold=0.05) == [6, 12]
    assert changepoints.segment(levels, 0, 18, loose, threshold=0.1) == [6]  # the second step is under 10%


def test_the_shift_is_corrected_for_picking_the_split():
    """Where a shift barely clears the noise, the split picked is the one noise helped most: the correction
    pulls the estimate back towards the shift drawn in, on average."""
    naive, corrected = [], []
    for seed in range(40):
        runs = history(300 + seed, 12, shift_at=6, slower={phase: 1 / 0.9 for phase in SHARES}, run_offset=0.06,
                       process_noise=0.02, repeats=5)
        for change in changepoints.find(runs, threshold=0.05, alpha=0.2):
            if change.metric == "SPS" and change.order == 6:
                naive.append(change.naive)
                corrected.append(change.shift.estimate)
    assert len(naive) >= 8
    assert abs(np.mean(corrected) + 0.1) < 0.8 * abs(np.mean(naive) + 0.1)


def test_a_significant_shift_below_the_threshold_is_not_a_change_point():
    # 3.5% slower, nearly noiseless runs: real (the scan finds it) but smaller than the 5% that counts.
    runs = history(6, 16, shift_at=8, slower={phase: 1.035 for phase in PHASES}, repeats=20, process_noise=0.005)
    sps = changepoints.point_series(runs)[next(iter(changepoints.point_series(runs)))]["SPS"]
    found = changepoints.scan(sps.levels, np.random.default_rng(0))
    assert 8 in found.stretch and found.p_value < 0.005
    assert changepoints.find(runs, threshold=0.05, alpha=0.05) == []
    assert [c.order for c in changepoints.find(runs, threshold=0.02, alpha=0.05) if c.metric == "SPS"] == [8]


def test_contended_repeats_are_left_out():
    runs = history(7, 16)
    # The newest run slowed by a neighbour, and every repeat of it marked contended: nothing to judge there.
    rng = np.random.default_rng(7)
    runs.append(synthetic_run(16, rng, slower={phase: 3.0 for phase in PHASES}, contended=True,
                              process_noise=0.06))
    alone = [(c.metric, c.order) for c in changepoints.find(runs[:16], threshold=0.05, alpha=0.05)]
    assert [(c.metric, c.order) for c in changepoints.find(runs, threshold=0.05, alpha=0.05)] == alone
    runs[-1].samples["summary"] = [dataclasses.replace(s, interference={"contended": False})
                                  for s in runs[-1].samples["summary"]]
    # once counted, one slow run at the end is a night, not a level: runs are the unit
    assert ("SPS", 16) not in [(c.metric, c.order) for c in changepoints.find(runs, threshold=0.05, alpha=0.05)]


# ---- real trainer runs ---------------------------------------------------------------------------------------

REPEATS = 1
RUNS_BEFORE, RUNS_AFTER = 8, 8  # runs are the unit: 8 against 8 reach a permutation p near 1e-4
TINY = """
    repeats = {repeats}
    timeout_s = 120
    sample_hz = 0
    [fixed]
    device = "cpu"
    env = "synthetic"
    num_envs = 16
    horizon = 8
    hidden_size = 16
    minibatch_size = 64
    update_epochs = 1
    total_steps = 768
    warmup_epochs = 1
    threads = 1
"""
# a learn step of 16 sequences waits 20 ms more: several times slower than a step of this size takes here
SLOWDOWN = '__import__("time").sleep(0.02)  # each learn step waits'


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A history made in a copy of this project: RUNS_BEFORE runs of a tiny suite, then a commit that slows the
    learn step, then RUNS_AFTER runs. The copy counts every repeat as quiet (a busy test machine would leave
    them all out: that rule is tested on its own, test_contended_repeats_are_left_out)."""
    root = tmp_path_factory.mktemp("planted")
    repo = project_repo(root)
    (root / "tiny.toml").write_text(textwrap.dedent(TINY.format(repeats=REPEATS)))
    for _ in range(RUNS_BEFORE):
        done = rlperf(repo, "bench", "--suite", "../tiny.toml", "--out", "../out", timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    plant_in_learn_step(repo, SLOWDOWN)
    commit(repo, "Slow the learn step")
    for _ in range(RUNS_AFTER):
        done = rlperf(repo, "bench", "--suite", "../tiny.toml", "--out", "../out", timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
    store_path = root / "out" / "results.sqlite"
    with Store.open(store_path, readonly=True) as store:
        runs = [load_run(store, run_id) for run_id in store.runs()["run_id"]]
    assert len(runs) == RUNS_BEFORE + RUNS_AFTER
    return repo, store_path, runs


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_planted_slowdown_is_a_change_point_at_its_run_naming_learn_and_confirmed(planted, tmp_path):
    repo, store_path, runs = planted
    done = rlperf(repo, "report", "--history", str(store_path), "--out", str(tmp_path / "before"), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    first_slowed = runs[RUNS_BEFORE].run_id
    # The terminal's change-point table: the SPS row at the first slowed run, learn among the phases.
    rows = [line for line in done.stdout.splitlines() if first_slowed in line]
    sps_rows = [line for line in rows if re.search(r"\bSPS\b", line)]
    assert sps_rows and "regressed" in sps_rows[0] and "learn +" in sps_rows[0], done.stdout
    assert "not yet" in sps_rows[0]
    markdown = (tmp_path / "before" / "report.md").read_text()
    table = [line for line in markdown.splitlines() if line.startswith("| default | SPS |")]
    assert len(table) == 1, markdown
    cells = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert cells[2] == "regressed" and cells[4] == first_slowed
    assert cells[8] == f"{RUNS_BEFORE}/{RUNS_AFTER}"
    assert cells[10].startswith("learn +"), cells
    assert float(cells[6].split("%")[0]) < -40
    page = (tmp_path / "before" / "report.html").read_text()
    assert page.count("<svg") == 2  # SPS and phase time over runs, each with its change-point marker

    # measured again in one job, in pairs: the two commits either side of it
    confirmed = rlperf(repo, "confirm", str(store_path), "--out", "../confirm-logs", "--max-repeats", "12",
                       timeout=600)
    assert confirmed.returncode == 0, confirmed.stdout + confirmed.stderr
    assert f"default at {first_slowed}: confirmed: -" in confirmed.stdout
    again = rlperf(repo, "report", "--history", str(store_path), "--out", str(tmp_path / "after"), timeout=300)
    sps_rows = [line for line in again.stdout.splitlines() if first_slowed in line and re.search(r"\bSPS\b", line)]
    assert sps_rows and "confirmed: -" in sps_rows[0], again.stdout
    # the confirmation's runs are measurements of two commits out of order: not part of the trend
    assert f"{RUNS_BEFORE + RUNS_AFTER} finished runs" in (tmp_path / "after" / "report.md").read_text()
    nothing_left = rlperf(repo, "confirm", str(store_path), timeout=120)
    assert nothing_left.returncode == 0 and "no change point left to confirm" in nothing_left.stdout


@pytest.mark.slow
def test_real_runs_before_the_slowdown_have_no_change_point(planted):
    _, _, runs = planted
    assert changepoints.find(runs[:RUNS_BEFORE], threshold=0.05, alpha=0.05) == []
