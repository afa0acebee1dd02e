"""`rlperf bench --against REF`: alternating processes at REF (a worktree) and the working tree, both stored as
runs that name each other, and the looks of --until-decided spending no more than alpha in all."""

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from benches.pairing import Pairing
from benches.worktrees import resolve_commit
from studies.simulated import Noise, SimulatedMachine
from benches.suite import Point
from decisions.sequential import Design
from rlperf.errors import BadInput
from rlperf.machine import REPO_ROOT
from rlperf.store import PointRecord, Store

TINY_SUITE = """
description = "one tiny point"
repeats = 3
timeout_s = 300
sample_hz = 0

[fixed]
device = "cpu"
env = "synthetic"
num_envs = 16
horizon = 8
minibatch_size = 64
hidden_size = 32
total_steps = 1024
threads = 1
"""


def simulated_pairing(tmp_path, design, slowdown=0.0, noise=0.03, contended_new=()):
    """A Pairing whose processes are drawn (studies/simulated.py); `contended_new` lists the pairs whose new
    process the monitor flags."""
    machine = SimulatedMachine(Noise(process=noise, tail_df=None), np.random.default_rng(0))
    point = Point(json.dumps({"num_envs": 16}), {"num_envs": 16}, {"num_envs": 16})
    machine.slowdowns = {("new", point.key): slowdown}
    sides = {side: machine.runner(side, tmp_path) for side in ("ref", "new")}
    draw = sides["new"].run_repeat

    def new_side(point, repeat, directory, gpu_uuids, record):
        status, reason, summary = draw(point, repeat, directory, gpu_uuids, record)
        summary.interference = {"contended": repeat in contended_new}
        return status, reason, summary

    sides["new"].run_repeat = new_side
    records = {side: PointRecord(point.key, point.config, "ok", "now", 0.0) for side in sides}
    return Pairing(sides, design, lambda text: None, rng=random.Random(3)), point, records


def test_pairs_run_in_an_order_drawn_at_random_and_stored_with_both_samples(tmp_path):
    design = Design.plan(12, 0.01, 2, 0.05)
    pairing, point, records = simulated_pairing(tmp_path, design, noise=0.3)
    pairing.measure(0, point, records, [], time.monotonic() + 60)
    firsts = [summary.pair["first"] for _, summary in records["new"].samples]
    assert set(firsts) == {"ref", "new"}
    assert [summary.pair for _, summary in records["ref"].samples] == \
        [summary.pair for _, summary in records["new"].samples]


def test_a_pair_with_a_contended_process_is_left_out_whole(tmp_path):
    design = Design((6,), 0.05, 2, 0.05, futility_from=6)
    pairing, point, records = simulated_pairing(tmp_path, design, slowdown=0.5, contended_new=(1, 4))
    verdict = pairing.measure(0, point, records, [], time.monotonic() + 60)
    assert len(records["new"].samples) == 6 and verdict.decision.pairs == 4
    assert verdict.contended == (0, 2) and "left out 2 contended pairs" in verdict.reason


def test_a_point_stops_at_the_first_look_that_decides(tmp_path):
    design = Design.plan(40, 0.01, 2, 0.05)
    pairing, point, records = simulated_pairing(tmp_path, design, slowdown=0.5)
    verdict = pairing.measure(0, point, records, [], time.monotonic() + 60)
    assert verdict.status == "regressed" and len(records["new"].samples) == design.looks[0]
    assert -0.56 < verdict.sps.relative < -0.44


def test_the_time_budget_ends_a_point_with_one_last_look_at_its_pairs(tmp_path):
    design = Design.plan(40, 0.01, 2, 0.05)
    pairing, point, records = simulated_pairing(tmp_path, design, noise=0.2)
    verdict = pairing.measure(0, point, records, [], deadline=time.monotonic())
    assert len(records["new"].samples) == 1 and verdict.status == "inconclusive"
    assert verdict.reason.startswith("stopped at the time budget after 1 pairs")


def test_a_ref_that_is_no_commit_is_bad_input():
    with pytest.raises(BadInput, match="against: 'no-such-ref-x' is not a commit"):
        resolve_commit("no-such-ref-x")


def git_worktrees(under: Path) -> list[str]:
    """The checkouts git lists in `under` (this repository's may gain others' while a test runs)."""
    out = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=REPO_ROOT, capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if line.startswith(f"worktree {under}")]


@pytest.mark.slow
def test_against_head_alternates_processes_and_stores_two_paired_runs(tmp_path):
    suite = tmp_path / "tiny.toml"
    suite.write_text(TINY_SUITE)
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.run([sys.executable, "-m", "rlperf", "bench", "--suite", str(suite), "--against", "HEAD",
                           "--until-decided", "--max-repeats", "6", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "RLPERF_LOCK": str(tmp_path / "lock"), "TMPDIR": str(temp)})
    # the same code on both sides: never a claim, whatever the machine is doing
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert git_worktrees(temp) == [] and list(temp.glob("rlperf-worktree-*")) == []  # the checkout is gone
    lines = [line for line in proc.stdout.splitlines() if line.startswith("default pair ")]
    # at alpha 1% no claim is possible from 6 pairs: one look, at the last, that spends all of alpha (on a busy
    # machine contended pairs are left out, and the look then comes after the last pair, at the quiet ones)
    assert len(lines) == 6 and "pair 6:" in lines[-1]
    with Store.open(tmp_path / "out" / "results.sqlite", readonly=True) as store:
        runs = store.runs()
        assert len(runs) == 2 and set(runs["status"]) == {"complete"}
        ref, new = runs["run_id"]
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
        assert runs["git_commit"].iloc[0] == head.strip()
        assert runs["fingerprint"].iloc[0]["against"] == {"side": "ref", "ref": "HEAD"}
        assert runs["fingerprint"].iloc[1]["against"] == {"side": "working tree", "ref": "HEAD", "ref_run": ref}
        pairing = runs["fingerprint"].iloc[1]["pairing"]
        assert pairing["side"] == "new" and pairing["partner"] == ref and pairing["design"]["looks"] == [6]
        orders = []
        for run_id in (ref, new):
            samples = store.samples(run_id)
            assert list(samples["repeat"]) == list(range(6))
            assert all(summary.interference is not None for summary in samples["summary"])
            orders.append([summary.pair for summary in samples["summary"]])
        assert orders[0] == orders[1] and [pair["index"] for pair in orders[0]] == list(range(6))
    assert (tmp_path / "out" / new / "report" / "report.md").is_file()
    report = (tmp_path / "out" / new / "report" / "report.md").read_text()
    assert "Verdict against the baseline" in report


def test_until_decided_needs_against_and_against_refuses_resume(tmp_path):
    for args, field in ((["--until-decided"], "until-decided"), (["--against", "HEAD", "--resume"], "resume")):
        proc = subprocess.run([sys.executable, "-m", "rlperf", "bench", *args, "--out", str(tmp_path)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.startswith(f"rlperf bench: error: {field}: ")
        assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "results.sqlite").exists()
