"""`rlperf bench --against REF`: alternating processes at REF (a worktree) and the working tree, both stored as
runs that name each other, and the looks of --until-decided spending no more than alpha in all."""

import os
import subprocess
import sys

import pytest

from benches.against import FIRST_LOOK, look_alphas, looks, resolve_commit
from rlperf.machine import REPO_ROOT
from rlperf.store import Store
from rlperf.errors import BadInput

TINY_SUITE = """
description = "one tiny point"
repeats = 3
timeout_s = 300
sample_hz = 0

[fixed]
env = "synthetic"
num_envs = 16
horizon = 8
minibatch_size = 64
hidden_size = 32
total_steps = 1024
threads = 1
"""


def test_looks_grow_geometrically_and_spend_at_most_alpha():
    assert looks(30) == [FIRST_LOOK, 12, 17, 24, 30]
    assert looks(4) == [4]
    for max_repeats in (4, 6, 7, 30, 100):
        spent = look_alphas(max_repeats, 0.05)
        assert list(spent) == looks(max_repeats)
        assert sum(spent.values()) == pytest.approx(0.05 * looks(max_repeats)[-1] / max_repeats)
        assert sum(spent.values()) <= 0.05 + 1e-12


def test_a_ref_that_is_no_commit_is_bad_input():
    with pytest.raises(BadInput, match="against: 'no-such-ref-x' is not a commit"):
        resolve_commit("no-such-ref-x")


def git_worktrees() -> list[str]:
    out = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=REPO_ROOT, capture_output=True, text=True,
                         check=True).stdout
    return [line for line in out.splitlines() if line.startswith("worktree ")]


@pytest.mark.slow
def test_against_head_alternates_processes_and_stores_two_paired_runs(tmp_path):
    suite = tmp_path / "tiny.toml"
    suite.write_text(TINY_SUITE)
    before = git_worktrees()
    proc = subprocess.run([sys.executable, "-m", "rlperf", "bench", "--suite", str(suite), "--against", "HEAD",
                           "--until-decided", "--max-repeats", "6", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "RLPERF_LOCK": str(tmp_path / "lock")})
    # the same code on both sides: never a claim, whatever the machine is doing
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert git_worktrees() == before  # the temporary checkout is gone
    lines = [line for line in proc.stdout.splitlines() if " pair " in line]
    assert len(lines) == 6 and "pair 6:" in lines[-1] and "look at 99.00%: " in lines[-1]  # one look at 6 pairs spends all of alpha
    with Store.open(tmp_path / "out" / "results.sqlite", readonly=True) as store:
        runs = store.runs()
        assert len(runs) == 2 and set(runs["status"]) == {"complete"}
        ref, new = runs["run_id"]
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
        assert runs["git_commit"].iloc[0] == head.strip()
        assert runs["fingerprint"].iloc[0]["against"] == {"side": "ref", "ref": "HEAD"}
        assert runs["fingerprint"].iloc[1]["against"] == {"side": "working tree", "ref": "HEAD", "ref_run": ref}
        for run_id in (ref, new):
            samples = store.samples(run_id)
            assert list(samples["repeat"]) == list(range(6))
            assert all("interference" in summary for summary in samples["summary"])
    assert (tmp_path / "out" / new / "report" / "report.md").is_file()
    report = (tmp_path / "out" / new / "report" / "report.md").read_text()
    assert "Verdict against the baseline" in report


def test_until_decided_needs_against_and_against_refuses_resume(tmp_path):
    for args, field in ((["--until-decided"], "until-decided"), (["--against", "HEAD", "--resume"], "resume")):
        proc = subprocess.run([sys.executable, "-m", "rlperf", "bench", *args, "--out", str(tmp_path)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.startswith(f"rlperf bench: error: {field}: ")
        assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "results.sqlite").exists()
