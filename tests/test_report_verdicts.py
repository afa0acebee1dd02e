"""Verdict rules on samples shaped like `Store.samples()`: the interval of a change, the four outcomes and their
boundaries, claims weighed across points, contended repeats, phase attribution and every kind of point."""

import json
import math

import numpy as np
import pandas as pd
import pytest

from decisions import intervals
from decisions.verdicts import compare_values, exit_code, judge, judge_point, match_key
from rlperf.store import point_label
from rlperf.summary import RunSummary

PHASE_SHARES = {"env": 0.05, "eval_forward": 0.40, "train_forward": 0.20, "learn": 0.30, "log": 0.05}
STEPS_PER_EPOCH = 256


def summary_for(rng, step_seconds: float, epochs: int, noise: float, slower: dict[str, float],
                contended: bool = False) -> dict:
    """A trainer summary whose steady epochs take `step_seconds` per agent step (times a per-process factor
    of spread `noise`), split by PHASE_SHARES, with some phases slowed by an extra fraction of the step."""
    process = math.exp(rng.normal(0, noise))
    rows = []
    for epoch in range(epochs + 1):
        phases = {phase: share * step_seconds * process * STEPS_PER_EPOCH for phase, share in PHASE_SHARES.items()}
        for phase, extra in slower.items():
            phases[phase] += extra * step_seconds * STEPS_PER_EPOCH
        rows.append({"epoch": epoch, "steps": STEPS_PER_EPOCH, "seconds": sum(phases.values()), "warmup": epoch == 0,
                     "phases": phases, "mean_episode_return": None})
    steady = rows[1:]
    seconds = sum(row["seconds"] for row in steady)
    phases = {phase: sum(row["phases"][phase] for row in steady) for phase in PHASE_SHARES}
    return {"sps": STEPS_PER_EPOCH * epochs / seconds, "steady_steps": STEPS_PER_EPOCH * epochs,
            "steady_seconds": seconds, "phases": phases, "epochs": rows,
            "interference": {"contended": contended, "why": "other processes used 1.00 cores" if contended else ""}}


def run_frames(points: dict[str, dict], repeats: int = 6, epochs: int = 5, noise: float = 0.01, seed: int = 0):
    """(points, samples) frames for a run; `points` maps a swept num_envs value to {step_seconds, slower,
    status, inject_delay, contended: repeats to mark contended (10x slower)}."""
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
        for repeat in range(spec.get("repeats", repeats)):
            contended = repeat < spec.get("contended", 0)
            step = spec["step_seconds"] * (10 if contended else 1)
            summary = summary_for(rng, step, epochs, spec.get("noise", noise), spec.get("slower", {}),
                                  contended and spec.get("mark", True))
            sample_rows.append({"run_id": "r", "point_key": point_key, "repeat": repeat, "sps": summary["sps"],
                                "phases": summary["phases"], "summary": RunSummary.read(summary)})
    return pd.DataFrame(point_rows), pd.DataFrame(sample_rows)


def verdicts_by_point(candidate, baseline, **criteria):
    return {v.point: v for v in judge(*candidate, *baseline, **criteria)}


def one_point(baseline_spec: dict, candidate_spec: dict, **criteria):
    baseline = run_frames({16: baseline_spec}, seed=1)
    candidate = run_frames({16: candidate_spec}, seed=2)
    return verdicts_by_point(candidate, baseline, **criteria)["num_envs=16"]


def test_the_interval_is_exact_and_needs_four_repeats_a_side_at_95_percent():
    separated = intervals.shift(np.array([100.0, 101, 102]), np.array([50.0, 51, 52]), 0.05)
    # 3 against 3: the most extreme ordering has p = 0.05 two-sided, so no shift can be excluded at 95%
    assert separated.low == -1.0 and math.isinf(separated.high)
    assert separated.estimate == pytest.approx(50 / 101 - 1, abs=0.01)
    four = intervals.shift(np.array([100.0, 101, 102, 103]), np.array([50.0, 51, 52, 53]), 0.05)
    assert -0.52 < four.low < four.estimate < four.high < -0.47
    assert intervals.fewest_repeats(0.05) == 4 and intervals.fewest_repeats(0.01) == 5


def test_the_interval_covers_the_true_shift_at_its_confidence():
    rng = np.random.default_rng(7)
    truth = 0.9
    covered = 0
    for _ in range(600):
        base = np.exp(rng.standard_t(3, 8) * 0.05)  # heavy tails, as a shared machine gives
        cand = np.exp(rng.standard_t(3, 8) * 0.05) * truth
        found = intervals.shift(base, cand, 0.05)
        covered += found.low <= truth - 1 <= found.high
    assert covered / 600 >= 0.93


def test_four_outcomes():
    assert one_point({"step_seconds": 1e-3}, {"step_seconds": 1.25e-3}).status == "regressed"
    assert one_point({"step_seconds": 1e-3}, {"step_seconds": 0.8e-3}).status == "improved"
    same = one_point({"step_seconds": 1e-3}, {"step_seconds": 1e-3})
    assert same.status == "unchanged" and -0.05 < same.sps.low < same.sps.high < 0.05
    noisy = one_point({"step_seconds": 1e-3, "noise": 0.15}, {"step_seconds": 1.06e-3, "noise": 0.15})
    assert noisy.status == "inconclusive"
    assert noisy.reason.startswith("noise:") and noisy.repeats_needed > 6


def test_every_verdict_carries_its_interval_and_what_it_can_detect():
    verdict = one_point({"step_seconds": 1e-3, "noise": 0.05}, {"step_seconds": 1.3e-3, "noise": 0.05})
    sps = verdict.sps
    assert sps.low <= sps.relative <= sps.high and sps.confidence == 0.99
    assert sps.high < 0 and sps.relative < -0.05 and verdict.status == "regressed"
    assert 0.05 < verdict.detectable < 0.5


def test_a_real_change_counts_only_beyond_the_threshold():
    base = np.full(8, 1000.0) * np.linspace(1, 1.001, 8)
    inside = compare_values(base, base * 0.951, True, threshold=0.05, alpha=0.01)
    assert inside.high < 0 and inside.decision == "same"  # real, and shown to be within 5%
    beyond = compare_values(base, base * 0.949, True, threshold=0.05, alpha=0.01)
    assert beyond.decision == "down" and beyond.worse


def test_a_large_change_that_may_be_noise_is_not_a_claim():
    rng = np.random.default_rng(5)
    base = np.exp(rng.normal(0, 0.3, 5)) * 1000
    noisy = compare_values(base, np.exp(rng.normal(0, 0.3, 5)) * 800, True, threshold=0.05, alpha=0.01)
    assert noisy.low < 0 < noisy.high and noisy.decision == "undecided"


def test_p_exactly_alpha_counts_and_just_above_does_not():
    base, cand = np.array([100.0, 101, 102, 103]), np.array([50.0, 51, 52, 53])
    smallest = 2 / math.comb(8, 4)  # completely separated 4 against 4, beyond the band
    assert compare_values(base, cand, True, 0.05, smallest).decision == "down"
    assert compare_values(base, cand, True, 0.05, smallest * 0.999).decision == "undecided"


def test_too_few_repeats_are_inconclusive_and_say_how_many_would_do():
    verdict = one_point({"step_seconds": 1e-3, "repeats": 4}, {"step_seconds": 2e-3, "repeats": 4})
    assert verdict.status == "inconclusive" and verdict.reason.startswith("too few repeats: 4 against 4")
    assert verdict.repeats_needed == 5 and math.isinf(verdict.detectable)  # at the default alpha of 1%


def test_contended_repeats_are_left_out():
    marked = one_point({"step_seconds": 1e-3}, {"step_seconds": 1e-3, "repeats": 8, "contended": 2})
    assert marked.status == "unchanged" and marked.contended == (0, 2)
    assert "left out contended repeats: 0 of the baseline's, 2 of this run's" in marked.reason
    unmarked = one_point({"step_seconds": 1e-3}, {"step_seconds": 1e-3, "repeats": 8, "contended": 2, "mark": False})
    assert unmarked.status != "unchanged"


def test_contention_that_leaves_too_few_repeats_is_inconclusive():
    verdict = one_point({"step_seconds": 1e-3}, {"step_seconds": 1e-3, "repeats": 6, "contended": 3})
    assert verdict.status == "inconclusive" and "contended" in verdict.reason


def test_a_weak_claim_among_many_points_does_not_survive_being_weighed_with_them():
    base_values, cand_values = np.array([100.0, 101, 102, 103, 104]), np.array([50.0, 51, 52, 53, 54])
    alone = compare_values(base_values, cand_values, True, 0.05, 0.01)
    assert alone.decision == "down" and alone.p_value == pytest.approx(2 / 252)
    specs = {n: {"step_seconds": 1e-3, "repeats": 5} for n in range(10)}
    baseline = run_frames(specs, seed=1)
    candidate = run_frames({**specs, 0: {"step_seconds": 2e-3, "repeats": 5}}, seed=2)
    lone = verdicts_by_point(candidate, baseline)["num_envs=0"]
    assert lone.status == "inconclusive" and "Benjamini-Hochberg" in lone.reason
    strong = run_frames({**specs, 0: {"step_seconds": 2e-3, "repeats": 12}}, seed=2)
    base_strong = run_frames({**specs, 0: {"step_seconds": 1e-3, "repeats": 12}}, seed=1)
    assert verdicts_by_point(strong, base_strong)["num_envs=0"].status == "regressed"


def test_direction_higher_sps_is_better_and_lower_phase_time_is_better():
    base = np.linspace(1.0, 1.1, 8)
    assert not compare_values(base, base * 1.2, higher_is_better=True, threshold=0.05, alpha=0.05).worse
    assert compare_values(base, base * 1.2, higher_is_better=False, threshold=0.05, alpha=0.05).worse


def test_slower_phase_is_a_regression_naming_that_phase_only():
    verdict = one_point({"step_seconds": 1e-3}, {"step_seconds": 1e-3, "slower": {"learn": 0.25}})
    assert verdict.status == "regressed"
    assert verdict.sps.relative < -0.15
    assert [phase for phase, _ in verdict.phases_grew] == ["learn"]


def test_every_point_gets_one_status():
    baseline = run_frames({16: {"step_seconds": 1e-3}, 32: {"step_seconds": 1e-3}, 64: {"step_seconds": 1e-3},
                           128: {"step_seconds": 1e-3}}, seed=1)
    candidate = run_frames({16: {"step_seconds": 1e-3}, 32: {"status": "failed", "reason": "exit code 1"},
                            64: {"status": "skipped", "reason": "needs CUDA"}, 256: {"step_seconds": 1e-3}}, seed=2)
    statuses = {point: v.status for point, v in verdicts_by_point(candidate, baseline).items()}
    assert statuses == {"num_envs=16": "unchanged", "num_envs=32": "failed", "num_envs=64": "missing",
                        "num_envs=256": "new", "num_envs=128": "missing"}


def test_exit_code_fails_on_regressions_and_on_request_on_inconclusive():
    regressed = one_point({"step_seconds": 1e-3}, {"step_seconds": 2e-3})
    inconclusive = one_point({"step_seconds": 1e-3, "repeats": 3}, {"step_seconds": 1e-3, "repeats": 3})
    unchanged = one_point({"step_seconds": 1e-3}, {"step_seconds": 1e-3})
    assert exit_code([regressed, unchanged]) == 1
    assert exit_code([inconclusive, unchanged]) == 0
    assert exit_code([inconclusive, unchanged], fail_on_inconclusive=True) == 1


def test_detectable_change_shrinks_with_repeats_and_noise():
    assert math.isinf(intervals.detectable_change(0.08, 3, 3, 0.05, 0.05))
    few = intervals.detectable_change(0.08, 5, 5, 0.05, 0.05)
    many = intervals.detectable_change(0.08, 30, 30, 0.05, 0.05)
    quiet = intervals.detectable_change(0.02, 30, 30, 0.05, 0.05)
    assert few > many > quiet > 0.05


def test_a_stated_detectable_change_is_caught_as_often_as_stated():
    """Fresh draws at the stated change, through the verdict rule itself: the rule must catch it about 95% of
    the time (a normal approximation had stated changes caught 67% of the time at 5 repeats)."""
    rng = np.random.default_rng(9)
    stated = intervals.detectable_change(0.12, 5, 5, 0.05, 0.01)
    caught = np.mean([compare_values(np.exp(rng.normal(0, 0.12, 5)),
                                     np.exp(math.log1p(-stated) + rng.normal(0, 0.12, 5)), True, 0.05, 0.01)
                      .decision == "down" for _ in range(300)])
    assert 0.9 <= caught <= 0.99


def test_one_outlier_does_not_make_a_point_look_blind():
    values = np.exp(np.random.default_rng(4).normal(0, 0.1, 6))
    with_outlier = values.copy()
    with_outlier[0] /= 10
    assert intervals.log_spread(with_outlier) < 2 * intervals.log_spread(values)
    assert np.log(with_outlier).std(ddof=1) > 5 * np.log(values).std(ddof=1)  # what a plain SD would have said


def test_a_lone_point_among_many_is_judged_at_the_level_it_must_reach():
    """With 56 points at 5 repeats no lone regression can pass Benjamini-Hochberg (2/C(10,5) > 0.01/56): the
    points must say so rather than promise a change they would catch alone."""
    base = run_frames({n: {"step_seconds": 1e-4} for n in range(56)}, repeats=5, noise=0.05, seed=1)
    cand = run_frames({n: {"step_seconds": 1e-4} for n in range(56)}, repeats=5, noise=0.05, seed=2)
    verdicts = judge(*cand, *base)
    assert all(math.isinf(v.detectable) for v in verdicts)
    alone = judge(*run_frames({0: {"step_seconds": 1e-4}}, repeats=5, noise=0.05, seed=2),
                  *run_frames({0: {"step_seconds": 1e-4}}, repeats=5, noise=0.05, seed=1))
    assert alone[0].detectable < 0.5


def test_judge_point_on_samples_alone():
    _, base = run_frames({16: {"step_seconds": 1e-3}}, seed=1)
    _, cand = run_frames({16: {"step_seconds": 1e-3}}, seed=2)
    assert judge_point(cand, base, 0.05, 0.05).status == "unchanged"


def test_points_match_by_configuration_ignoring_injected_delays():
    key = json.dumps({"num_envs": 16})
    with_delay = {"env": "synthetic", "num_envs": 16, "inject_delay": {"learn": 20.0}}
    assert match_key(key, with_delay) == match_key(key, {**with_delay, "inject_delay": {}})
    assert match_key(key, with_delay) != match_key(key, {**with_delay, "hidden_size": 32})
    assert match_key(key, with_delay) != match_key(json.dumps({"world_size": 1}), with_delay)
    # a run stored before a setting existed matches a newer run that leaves it at its default, not one that sets it
    older = with_delay
    assert match_key(key, older) == match_key(key, {**with_delay, "encoder": "mlp"})
    assert match_key(key, older) != match_key(key, {**with_delay, "encoder": "cnn"})


def test_point_label_reads_the_swept_values():
    assert point_label(json.dumps({"dtype": "bf16", "num_envs": 64})) == "dtype=bf16, num_envs=64"
    assert point_label("{}") == "default"
