"""Time to solve: the trainer's record of it, the seeds a learning point's repeats train with, and the survival
statistics that judge it (decisions/learning.py)."""

from __future__ import annotations

import json
import math
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from benches.runner import PointRunner, UtilizationProbe, repeat_config
from benches.suite import Point
from reference_trainer.config import ConfigError, TrainConfig, from_dict, validate
from reference_trainer.solving import smoothed_returns, time_to_solve
from rlperf.summary import RunSummary
from reference_trainer.train import train
from decisions.learning import (FASTER_LEARNS_WORSE, Durations, compare_solve, judge_learning, km_median, reading,
                              share_solved)

MEMORY = dict(env="memory", num_envs=16, horizon=8, minibatch_size=64, hidden_size=32, total_steps=16 * 8 * 10,
              threads=1, device="cpu")


def epoch(episodes: int, mean: float | None, end: float = 1.0) -> dict:
    return {"steps": 100, "episodes": episodes, "mean_episode_return": mean, "end_seconds": end}


def test_the_smoothed_return_averages_the_latest_epochs_that_hold_a_window_of_episodes():
    epochs = [epoch(4, 0.0), epoch(0, None), epoch(4, 1.0), epoch(2, 0.5), epoch(8, 1.0)]
    # window 6: nothing until 6 episodes; then the fewest latest epochs holding 6 or more
    assert smoothed_returns(epochs, 6) == [None, None, pytest.approx(0.5), pytest.approx(5 / 6), pytest.approx(1.0)]
    assert smoothed_returns(epochs, 10) == [None, None, None, pytest.approx(5 / 10), pytest.approx(9 / 10)]


def test_time_to_solve_is_the_first_epoch_at_the_target_or_the_censored_end():
    epochs = [epoch(10, 0.2, 1.5), epoch(10, 0.6, 2.0), epoch(10, 0.95, 2.5), epoch(10, 0.99, 3.0)]
    solved = time_to_solve(TrainConfig(target_return=0.9, target_window=10), epochs, sps=100.0)
    assert solved == {"target_return": 0.9, "window": 10, "solved": True, "epoch": 2, "steps": 300, "seconds": 2.5,
                      "steady_seconds": 3.0, "smoothed_return": 0.95}
    # a window of 20 averages two epochs: 0.775 at epoch 2, 0.97 at epoch 3
    assert time_to_solve(TrainConfig(target_return=0.9, target_window=20), epochs, 100.0)["epoch"] == 3
    never = time_to_solve(TrainConfig(target_return=1.5, target_window=10), epochs, 100.0)
    assert never["solved"] is False and never["epoch"] is None
    assert (never["steps"], never["seconds"]) == (400, 3.0)
    assert time_to_solve(TrainConfig(), epochs, 100.0) is None


def test_the_trainer_records_its_time_to_solve():
    # memory's blind guess scores 0.25: a target of 0.1 is met by the first window, 1.5 never
    easy = train(validate(TrainConfig(**MEMORY, target_return=0.1, target_window=20)))["time_to_solve"]
    assert easy["solved"] and easy["steps"] <= 3 * 16 * 8 and 0 < easy["steady_seconds"] and 0 < easy["seconds"]
    summary = train(validate(TrainConfig(**MEMORY, target_return=1.5)))
    never = summary["time_to_solve"]
    assert not never["solved"] and never["steps"] == summary["steps"]
    assert never["seconds"] == pytest.approx(summary["epochs"][-1]["end_seconds"])
    assert never["seconds"] <= summary["wall_seconds"]
    assert train(validate(TrainConfig(**MEMORY)))["time_to_solve"] is None


@pytest.mark.parametrize("values, field", [({"target_return": float("nan")}, "target_return"),
                                           ({"target_window": 50}, "target_window"),
                                           ({"target_return": 1.0, "target_window": 0}, "target_window"),
                                           ({"target_return": "high"}, "target_return")])
def test_bad_targets_name_their_field(values, field):
    with pytest.raises(ConfigError) as err:
        from_dict(values)
    assert err.value.field_name == field


def test_a_target_round_trips_through_the_flags():
    import argparse

    from reference_trainer.flags import add_train_flags, config_from_args

    config = TrainConfig(env="catch", target_return=-0.5, target_window=50)
    assert config.to_args() == ["--env", "catch", "--target-return", "-0.5", "--target-window", "50"]
    parser = argparse.ArgumentParser()
    add_train_flags(parser)
    assert config_from_args(parser.parse_args(config.to_args())) == config
    assert config_from_args(parser.parse_args([])).target_return is None


ECHO = textwrap.dedent("""
    import json, sys
    config, path = json.loads(sys.argv[1]), sys.argv[2]
    epoch = {"steps": 100, "seconds": 0.1, "warmup": False, "phases": {}}
    open(path, "w").write(json.dumps({"schema": 2, "sps": 1000.0, "steps": 100, "steady_steps": 100, "steady_seconds": 0.1,
                                      "wall_seconds": 0.2, "phases": {}, "epochs": [epoch], "config": config}))
""")


@pytest.mark.parametrize("target, seeds", [(None, [7, 7, 7]), (0.9, [7, 8, 9])])
def test_repeats_of_a_learning_point_train_with_successive_seeds(tmp_path, target, seeds):
    echo = tmp_path / "echo.py"
    echo.write_text(ECHO)
    config = {**TrainConfig(seed=7, target_return=target).to_dict()}
    runner = PointRunner(tmp_path, 3, 60.0, UtilizationProbe(0),
                         lambda config, path: [sys.executable, str(echo), json.dumps(config), str(path)])
    record = runner.run(0, Point("{}", {}, config), [])
    assert record.status == "ok", record.reason
    assert [summary.config["seed"] for _, summary in record.samples] == seeds
    assert record.config["seed"] == 7  # the point keeps its own seed; each sample records the one it ran
    assert repeat_config(config, 2)["seed"] == seeds[2]


def durations(times, solved=None) -> Durations:
    times = np.asarray(times, float)
    return Durations(times, np.ones(len(times), bool) if solved is None else np.asarray(solved, bool))


def test_kaplan_meier_median_and_its_interval():
    whole = km_median(durations([1, 2, 3, 4, 5]), 0.95)
    assert whole.value == 3 and whole.low <= 3 <= whole.high <= 5
    # two of five never solved: the median is where the curve reaches one half, the third solve
    censored = km_median(durations([1, 2, 3, 9, 9], [1, 1, 1, 0, 0]), 0.95)
    assert censored.value == 3 and math.isinf(censored.high)
    assert km_median(durations([1, 9, 9], [1, 0, 0]), 0.95).value == math.inf  # fewer than half solved


def test_share_solved_has_the_exact_binomial_interval():
    share = share_solved(durations([1, 2, 9, 9, 9], [1, 1, 0, 0, 0]), 0.95)
    expected = stats.binomtest(2, 5).proportion_ci(0.95, method="exact")
    assert (share.solved, share.n) == (2, 5) and (share.low, share.high) == pytest.approx((expected.low, expected.high))


def test_a_knob_that_stops_learning_is_regressed_and_the_same_times_are_no_claim():
    rng = np.random.default_rng(1)
    base = durations(np.exp(rng.normal(2.0, 0.2, 6)))
    never = durations(np.full(6, 30.0), np.zeros(6))
    stopped = compare_solve(base, never, 0.25, 0.01)
    assert stopped.decision == "up" and stopped.bound == "at least" and math.isinf(stopped.high)
    assert stopped.relative == pytest.approx(30.0 / stopped.baseline.value - 1)
    same = compare_solve(base, base, 0.25, 0.01)
    assert same.decision in ("same", "undecided") and same.low < 0 < same.high
    assert compare_solve(base, durations(base.times * 3), 0.25, 0.01).decision == "up"
    assert compare_solve(durations(base.times * 3), base, 0.25, 0.01).decision == "down"


def test_the_interval_holds_the_factor_that_makes_the_sides_alike():
    rng = np.random.default_rng(2)
    base = durations(np.exp(rng.normal(2.0, 0.1, 8)))
    slower = durations(base.times[rng.permutation(8)] * 2.0)
    change = compare_solve(base, slower, 0.25, 0.01)
    assert change.low < 1.0 < change.high and change.relative == pytest.approx(1.0)
    assert change.decision == "up"
    # nearly identical seeds, many of them: shown within ±25%
    many = durations(np.exp(rng.normal(2.0, 0.02, 12)))
    assert compare_solve(many, durations(many.times * 1.01), 0.25, 0.01).decision == "same"


def samples_of(times, solved, contended=()) -> pd.DataFrame:
    rows = [{"summary": RunSummary.read({"time_to_solve": {"seconds": t, "steady_seconds": t, "steps": 1000 * t,
                                                           "solved": s},
                                         "interference": {"contended": i in contended}})}
            for i, (t, s) in enumerate(zip(times, solved))]
    return pd.DataFrame(rows)


def test_learning_verdicts_leave_out_contended_repeats_and_need_a_time_to_solve():
    base = samples_of([5, 6, 7, 5.5, 6.5], [1] * 5)
    never = samples_of([20] * 5, [0] * 5)
    assert judge_learning(never, base).status == "regressed"
    assert judge_learning(samples_of([20] * 5, [0] * 5, contended=(0, 1, 2, 3)), base).status == "inconclusive"
    every_one = judge_learning(samples_of([20] * 5, [0] * 5, contended=range(5)), base)
    assert every_one.status == "inconclusive" and every_one.reason == "too few quiet repeats: 5 against 0"
    assert judge_learning(never, never).reason.startswith("neither side solved")
    assert judge_learning(pd.DataFrame([{"summary": RunSummary.read({"sps": 1.0})}]), base) is None


def test_the_reading_names_the_fast_knob_that_learns_worse():
    assert reading("improved", "regressed") == FASTER_LEARNS_WORSE
    assert reading("improved", "unchanged") == "faster, solves as soon"
    assert reading(None, "improved") == "speed undecided, solves sooner"
