"""Verdict rules on samples shaped like `Store.samples()`: thresholds, the significance test, direction,
phase attribution and the status of every kind of point."""

import json

import numpy as np
import pandas as pd
import pytest

from reports.verdicts import choose_unit, compare_values, judge, match_key, point_label, smallest_p

PHASE_SHARES = {"env": 0.05, "eval_forward": 0.40, "train_forward": 0.20, "learn": 0.30, "log": 0.05}
STEPS_PER_EPOCH = 256


def summary_for(rng, step_seconds: float, epochs: int, noise: float, slower: dict[str, float]) -> dict:
    """A trainer summary whose steady epochs take `step_seconds` per agent step, split by PHASE_SHARES, with
    some phases slowed by an extra fraction of the step."""
    rows = []
    for epoch in range(epochs + 1):
        phases = {phase: share * step_seconds * STEPS_PER_EPOCH * (1 + rng.normal(0, noise))
                  for phase, share in PHASE_SHARES.items()}
        for phase, extra in slower.items():
            phases[phase] += extra * step_seconds * STEPS_PER_EPOCH
        rows.append({"epoch": epoch, "steps": STEPS_PER_EPOCH, "seconds": sum(phases.values()), "warmup": epoch == 0,
                     "phases": phases, "mean_episode_return": None})
    steady = rows[1:]
    seconds = sum(row["seconds"] for row in steady)
    phases = {phase: sum(row["phases"][phase] for row in steady) for phase in PHASE_SHARES}
    return {"sps": STEPS_PER_EPOCH * epochs / seconds, "steady_steps": STEPS_PER_EPOCH * epochs,
            "steady_seconds": seconds, "phases": phases, "epochs": rows}


def run_frames(points: dict[str, dict], repeats: int = 3, epochs: int = 10, noise: float = 0.02, seed: int = 0):
    """(points, samples) frames for a run; `points` maps a swept num_envs value to {step_seconds, slower,
    status, inject_delay}."""
    rng = np.random.default_rng(seed)
    point_rows, sample_rows = [], []
    for num_envs, spec in points.items():
        point_key = json.dumps({"num_envs": num_envs}, sort_keys=True)
        config = {"env": "synthetic", "num_envs": num_envs, "inject_delay": spec.get("inject_delay", {})}
        status = spec.get("status", "ok")
        point_rows.append({"run_id": "r", "point_key": point_key, "config": config, "status": status,
                           "reason": spec.get("reason")})
        if status != "ok":
            continue
        for repeat in range(repeats):
            summary = summary_for(rng, spec["step_seconds"], epochs, noise, spec.get("slower", {}))
            sample_rows.append({"run_id": "r", "point_key": point_key, "repeat": repeat, "sps": summary["sps"],
                                "phases": summary["phases"], "summary": summary})
    return pd.DataFrame(point_rows), pd.DataFrame(sample_rows)


def verdicts_by_point(candidate, baseline, **criteria):
    return {v.point: v for v in judge(*candidate, *baseline, **criteria)}


def test_three_repeats_cannot_reach_alpha_so_epochs_are_pooled():
    assert smallest_p(3, 3) == pytest.approx(0.1)
    assert smallest_p(5, 5) < 0.01
    three = run_frames({16: {"step_seconds": 1e-3}}, repeats=3)[1]
    six = run_frames({16: {"step_seconds": 1e-3}}, repeats=6)[1]
    assert choose_unit(three, three, alpha=0.01) == "epoch"
    assert choose_unit(six, six, alpha=0.01) == "repeat"


def test_change_must_be_both_large_and_significant():
    rng = np.random.default_rng(1)
    base = rng.normal(1000, 5, 30)
    small_but_certain = compare_values(base, base * 0.98, True, threshold=0.05, alpha=0.01)
    assert small_but_certain.p_value < 0.01 and not small_but_certain.counts
    large_and_certain = compare_values(base, base * 0.90, True, threshold=0.05, alpha=0.01)
    assert large_and_certain.counts and large_and_certain.worse
    large_but_noisy = compare_values(np.array([1000.0, 700.0]), np.array([900.0, 650.0]), True, 0.05, 0.01)
    assert abs(large_but_noisy.relative) > 0.05 and not large_but_noisy.counts


def test_direction_higher_sps_is_better_and_lower_phase_time_is_better():
    base = np.linspace(1.0, 1.1, 30)
    assert not compare_values(base, base * 1.2, higher_is_better=True, threshold=0.05, alpha=0.01).worse
    assert compare_values(base, base * 1.2, higher_is_better=False, threshold=0.05, alpha=0.01).worse


def test_same_samples_twice_are_unchanged():
    baseline = run_frames({16: {"step_seconds": 1e-3}, 32: {"step_seconds": 6e-4}}, seed=1)
    candidate = run_frames({16: {"step_seconds": 1e-3}, 32: {"step_seconds": 6e-4}}, seed=2)
    verdicts = verdicts_by_point(candidate, baseline)
    assert {v.status for v in verdicts.values()} == {"unchanged"}


def test_slower_phase_is_a_regression_naming_that_phase_only():
    baseline = run_frames({16: {"step_seconds": 1e-3}}, seed=1)
    candidate = run_frames({16: {"step_seconds": 1e-3, "slower": {"learn": 0.25}}}, seed=2)
    verdict = verdicts_by_point(candidate, baseline)["num_envs=16"]
    assert verdict.status == "regressed"
    assert verdict.sps.relative < -0.15
    assert [phase for phase, _ in verdict.phases_grew] == ["learn"]


def test_faster_point_is_improved():
    baseline = run_frames({16: {"step_seconds": 1e-3}}, seed=1)
    candidate = run_frames({16: {"step_seconds": 8e-4}}, seed=2)
    assert verdicts_by_point(candidate, baseline)["num_envs=16"].status == "improved"


def test_every_point_gets_one_status():
    baseline = run_frames({16: {"step_seconds": 1e-3}, 32: {"step_seconds": 1e-3}, 64: {"step_seconds": 1e-3},
                           128: {"step_seconds": 1e-3}}, seed=1)
    candidate = run_frames({16: {"step_seconds": 1e-3}, 32: {"status": "failed", "reason": "exit code 1"},
                            64: {"status": "skipped", "reason": "needs CUDA"}, 256: {"step_seconds": 1e-3}}, seed=2)
    statuses = {point: v.status for point, v in verdicts_by_point(candidate, baseline).items()}
    assert statuses == {"num_envs=16": "unchanged", "num_envs=32": "failed", "num_envs=64": "missing",
                        "num_envs=256": "new", "num_envs=128": "missing"}


def test_points_match_by_configuration_ignoring_injected_delays():
    key = json.dumps({"num_envs": 16})
    with_delay = {"env": "synthetic", "num_envs": 16, "inject_delay": {"learn": 20.0}}
    assert match_key(key, with_delay) == match_key(key, {**with_delay, "inject_delay": {}})
    assert match_key(key, with_delay) != match_key(key, {**with_delay, "hidden_size": 32})
    assert match_key(key, with_delay) != match_key(json.dumps({"world_size": 1}), with_delay)


def test_point_label_reads_the_swept_values():
    assert point_label(json.dumps({"dtype": "bf16", "num_envs": 64})) == "dtype=bf16, num_envs=64"
    assert point_label("{}") == "default"


def test_pooled_epochs_need_every_repeat_to_agree():
    """One slow process makes all its epochs slow: pooled, they are significant, but one candidate repeat is
    as fast as the baseline's slowest, so the repeats do not all agree."""
    rng = np.random.default_rng(3)
    base_repeats = np.array([1000.0, 1010.0, 990.0])
    cand_repeats = np.array([975.0, 995.0, 700.0])

    def epochs(repeats):
        return np.concatenate([rng.normal(r, 5, 10) for r in repeats])

    overlapping = compare_values(base_repeats, cand_repeats, True, 0.01, 0.01, (epochs(base_repeats), epochs(cand_repeats)))
    assert overlapping.p_value < 0.01 and overlapping.relative < -0.01 and not overlapping.counts
    slower = np.array([900.0, 905.0, 880.0])
    assert compare_values(base_repeats, slower, True, 0.05, 0.01, (epochs(base_repeats), epochs(slower))).counts
