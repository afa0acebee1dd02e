"""Change points in the history: synthetic series drawn from fixed seeds test the detection itself (a step is
found at its run, noise yields none, the p-values hold their level); a store of real trainer runs made by
`rlperf bench`, with a delay planted in `learn` from one run on, must show that change point, at that run, with
`learn` among the phases that moved, on the page and on the terminal."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from profilers import interference
from reference_trainer.config import PHASES
from reports import changepoints
from reports.rundata import RunData, load_run
from rlperf.cli import main
from rlperf.store import Store

PROCESS_NOISE = 0.12  # log SD of one process's SPS on this machine
STEADY_STEPS = 1000
SHARES = {"env": 0.05, "eval_copy": 0.04, "eval_forward": 0.25, "eval_misc": 0.03, "train_misc": 0.06,
          "train_forward": 0.2, "learn": 0.35, "log": 0.02}


def synthetic_run(order: int, rng: np.random.Generator, repeats: int = 3, slower: dict[str, float] | None = None,
                  points: int = 1, contended: bool = False) -> RunData:
    """A run whose repeats have each phase's time drawn around a 1,000 SPS step (a process-wide factor with
    PROCESS_NOISE, plus a little per phase); `slower` multiplies phases' times; SPS follows from their sum."""
    point_rows, sample_rows = [], []
    for point in range(points):
        key = json.dumps({"num_envs": 16 * (point + 1)})
        point_rows.append({"point_key": key, "config": {"num_envs": 16 * (point + 1)}, "status": "ok", "reason": ""})
        for _ in range(repeats):
            process = np.exp(rng.normal(0, PROCESS_NOISE))
            phases = {phase: share * STEADY_STEPS / 1000 * process * np.exp(rng.normal(0, 0.03))
                      * (slower or {}).get(phase, 1.0) for phase, share in SHARES.items()}
            summary = {"steady_steps": STEADY_STEPS, "interference": {"contended": contended}}
            sample_rows.append({"point_key": key, "sps": STEADY_STEPS / sum(phases.values()), "phases": phases,
                                "summary": summary})
    info = {"suite": "synthetic", "status": "complete", "git_commit": f"{order:04d}abcdef{order:06d}",
            "git_dirty": False, "started_at": f"2026-01-{order + 1:02d}T00:00:00+00:00"}
    empty = pd.DataFrame()
    return RunData("synthetic.sqlite", f"run-{order}", info, {}, pd.DataFrame(point_rows), pd.DataFrame(sample_rows),
                   empty, empty, empty)


def history(seed: int, runs: int, shift_at: int | None = None, slower: dict[str, float] | None = None,
            **options) -> list[RunData]:
    rng = np.random.default_rng(seed)
    return [synthetic_run(order, rng, slower=slower if shift_at is not None and order >= shift_at else None,
                          **options) for order in range(runs)]


def test_a_slower_learn_phase_is_found_at_its_run_with_its_size_and_phase():
    runs = history(1, 10, shift_at=6, slower={"learn": 2.0})
    found = changepoints.find(runs, threshold=0.05, alpha=0.05)
    assert [(c.metric, c.order, c.run_id) for c in found] == [("SPS", 6, "run-6")]
    change = found[0]
    # learn is 35% of the step: twice as long makes the step 1.35 times as long.
    assert change.shift.low < 1 / 1.35 - 1 < change.shift.high
    assert change.shift.high < 0 and change.worse
    assert change.p_value < 0.01
    assert (change.runs_before, change.runs_after) == (6, 4)
    assert [phase for phase, _ in change.phases_moved] == ["learn"]
    assert change.phases_moved[0][1].low > 0.5  # learn at least 50% slower, from its own interval
    assert change.sentence().startswith("SPS fell 2") and "(learn +" in change.sentence()
    assert "at 0006abc" in change.sentence()


def test_a_step_up_and_back_gives_two_change_points():
    rng = np.random.default_rng(2)
    slow = {"eval_forward": 3.0}
    runs = [synthetic_run(order, rng, slower=slow if 4 <= order < 9 else None) for order in range(14)]
    found = changepoints.find(runs, threshold=0.05, alpha=0.05)
    assert [(c.metric, c.order, c.worse) for c in found] == [("SPS", 4, True), ("SPS", 9, False)]
    assert all(c.phases_moved[0][0] == "eval_forward" for c in found)
    # Each shift is measured between its neighbours: 4 runs before the first, 5 between, 5 after the second.
    assert [(c.runs_before, c.runs_after) for c in found] == [(4, 5), (5, 5)]


def test_a_phase_that_moved_without_moving_sps_gets_its_own_change_point():
    # env twice as slow while eval_forward is as much faster: the step, and so SPS, stays the same.
    runs = history(3, 10, shift_at=5, slower={"env": 2.0, "eval_forward": 0.8}, repeats=4)
    found = changepoints.find(runs, threshold=0.05, alpha=0.05)
    assert {(c.metric, c.order) for c in found} == {("env", 5), ("eval_forward", 5)}
    env = next(c for c in found if c.metric == "env")
    assert env.worse and env.sentence().startswith("env got ") and " slower at 0005abc" in env.sentence()


def test_noise_alone_yields_no_change_points():
    """Forty histories of pure process noise, 5 to 30 runs of one or three points: Benjamini-Hochberg over
    every series of a history bounds the chance of any change point in it by alpha."""
    with_change = 0
    for seed in range(40):
        runs = history(100 + seed, runs=5 + (seed * 5) % 26, points=1 + seed % 3 // 2 * 2)
        with_change += bool(changepoints.find(runs, threshold=0.05, alpha=0.05))
    assert with_change <= 4, with_change  # about 2 expected at alpha 0.05


def test_the_scan_p_value_holds_its_level_and_finds_the_split():
    rng = np.random.default_rng(4)
    shuffles = np.random.default_rng(changepoints.SEED)
    null = [changepoints.scan([np.exp(rng.normal(0, PROCESS_NOISE, 3)) for _ in range(length)], shuffles)[1]
            for length in (5, 10, 20, 30) for _ in range(40)]
    assert np.mean(np.array(null) < 0.05) <= 0.09  # 8 of 160 expected
    assert np.mean(np.array(null) < 0.5) >= 0.35  # and it is not stuck at 1
    series = [np.exp(rng.normal(np.log(0.7) if run >= 3 else 0, PROCESS_NOISE, 3)) for run in range(5)]
    split, p_value = changepoints.scan(series, shuffles)
    assert split == 3 and p_value < 0.01


def test_a_significant_shift_below_the_threshold_is_not_a_change_point():
    # 3.5% slower with 60 repeats a run is real (the scan finds it) but smaller than the 5% that counts.
    runs = history(6, 8, shift_at=4, slower={phase: 1.035 for phase in PHASES}, repeats=60)
    sps = changepoints.point_series(runs)[next(iter(changepoints.point_series(runs)))]["SPS"]
    split, p_value = changepoints.scan(sps.values, np.random.default_rng(0))
    assert split == 4 and p_value < 0.001
    assert changepoints.find(runs, threshold=0.05, alpha=0.05) == []
    assert [c.order for c in changepoints.find(runs, threshold=0.02, alpha=0.05)] == [4]


def test_contended_repeats_are_left_out():
    rng = np.random.default_rng(7)
    runs = [synthetic_run(order, rng) for order in range(6)]
    # The newest run slowed by a neighbour, and every repeat of it marked contended: nothing to judge there.
    runs.append(synthetic_run(6, rng, slower={phase: 3.0 for phase in PHASES}, contended=True))
    alone = [(c.metric, c.order) for c in changepoints.find(runs[:6], threshold=0.05, alpha=0.05)]
    assert [(c.metric, c.order) for c in changepoints.find(runs, threshold=0.05, alpha=0.05)] == alone
    runs[-1].samples["summary"] = [{**s, "interference": {"contended": False}} for s in runs[-1].samples["summary"]]
    assert ("SPS", 6) in [(c.metric, c.order) for c in changepoints.find(runs, threshold=0.05, alpha=0.05)]


# ---- real trainer runs ---------------------------------------------------------------------------------------

REPEATS = 4  # 12 against 8 repeats: decisive at the report's alpha after Benjamini-Hochberg over 9 series
RUNS_BEFORE, RUNS_AFTER = 3, 2
TINY = """
    repeats = {repeats}
    timeout_s = 120
    sample_hz = 0
    [fixed]
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


def bench(suite, out) -> None:
    # Verdicts and change points leave out repeats run on a busy machine, and a shared test machine is busy:
    # that rule is tested on its own (test_contended_repeats_are_left_out). Here every repeat counts as quiet.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(interference, "contention", lambda account: [])
        assert main(["bench", "--suite", str(suite), "--out", str(out)]) == 0


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A store of RUNS_BEFORE runs of a tiny suite, then RUNS_AFTER runs of the same suite (same name, so the
    same series) with a delay of two steady epochs' length slept in `learn` once per epoch."""
    directory = tmp_path_factory.mktemp("planted")
    plain, delayed, out = directory / "plain" / "tiny.toml", directory / "delayed" / "tiny.toml", directory / "out"
    plain.parent.mkdir()
    delayed.parent.mkdir()
    plain.write_text(textwrap.dedent(TINY.format(repeats=REPEATS)))
    for _ in range(RUNS_BEFORE):
        bench(plain, out)
    store_path = out / "results.sqlite"
    with Store.open(store_path, readonly=True) as store:
        run_ids = list(store.runs()["run_id"])
        first = store.samples(run_ids[0])
    epochs = [e["seconds"] for summary in first["summary"] for e in summary["epochs"] if not e["warmup"]]
    delay_ms = round(1000 * 2 * float(np.median(epochs)), 1)
    delayed.write_text(plain.read_text() + f"inject_delay = {{learn = {delay_ms}}}\n")
    for _ in range(RUNS_AFTER):
        bench(delayed, out)
    with Store.open(store_path, readonly=True) as store:
        run_ids = list(store.runs()["run_id"])
        runs = [load_run(store, run_id) for run_id in run_ids]
    assert len(runs) == RUNS_BEFORE + RUNS_AFTER
    return store_path, runs


@pytest.mark.slow
def test_planted_delay_is_a_change_point_at_its_run_naming_learn(planted, tmp_path):
    store_path, runs = planted
    done = subprocess.run([sys.executable, "-m", "rlperf", "report", "--history", str(store_path), "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    first_delayed = runs[RUNS_BEFORE].run_id
    # The terminal's change-point table: the SPS row at the first delayed run, learn among the phases.
    rows = [line for line in done.stdout.splitlines() if first_delayed in line]
    sps_rows = [line for line in rows if re.search(r"\bSPS\b", line)]
    assert sps_rows, done.stdout
    assert "regressed" in sps_rows[0] and "learn +" in sps_rows[0], done.stdout
    markdown = (tmp_path / "report.md").read_text()
    table = [line for line in markdown.splitlines() if line.startswith("| default | SPS |")]
    assert len(table) == 1, markdown
    cells = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert cells[2] == "regressed" and cells[4] == first_delayed
    assert cells[8] == f"{RUNS_BEFORE}/{RUNS_AFTER}"
    assert cells[9].startswith("learn +"), cells
    change = float(cells[6].split("%")[0])
    assert change < -40  # two epochs' sleep per epoch: about a third of the speed
    assert "default: SPS fell " in markdown and "(learn +" in markdown
    page = (tmp_path / "report.html").read_text()
    assert page.count("<svg") == 2  # SPS and phase time over runs, each with its change-point marker
    assert f"SPS {cells[6].split()[0]}" in page and "learn +" in page


@pytest.mark.slow
def test_real_runs_before_the_delay_have_no_change_point(planted):
    _, runs = planted
    assert changepoints.find(runs[:RUNS_BEFORE], threshold=0.05, alpha=0.05) == []
