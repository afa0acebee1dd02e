"""`rlperf bisect GOOD BAD`: the search over a fake oracle (skips included), the input it refuses before
measuring anything, and a real search over a small git history, made here, in which one known commit slows the
learn step and another cannot run at all."""

import itertools
import json
import math
import re
import subprocess

import numpy as np
import pytest
from projectrepo import commit, git, note, plant_in_learn_step, project_repo, rlperf

from benches.bisect import BAD, GOOD, SKIP, Search, midpoint_threshold, outcome_of, step_design
from decisions.sequential import decide
from decisions.verdicts import Change, PointVerdict
from rlperf.store import Store

# ---- the search over a fake oracle ----------------------------------------------------------------------------


def search_with(count: int, first_bad: int | None, skipped: set[int] = frozenset()) -> tuple[list[int], Search]:
    """Runs a search against an oracle in which commits from `first_bad` on are bad (None: none is) and the
    `skipped` ones cannot be measured. Returns the probes in order and the finished search."""
    search, probes = Search(count), []
    while (index := search.next_probe()) is not None:
        assert index not in probes, "a commit is never probed twice"
        probes.append(index)
        if index in skipped:
            search.mark(index, SKIP)
        else:
            search.mark(index, BAD if first_bad is not None and index >= first_bad else GOOD)
    return probes, search


@pytest.mark.parametrize("count", range(1, 12))
def test_without_skips_the_search_names_the_first_bad_commit_in_logarithmic_steps(count):
    for first_bad in range(count):
        probes, search = search_with(count, first_bad)
        assert probes[0] == count - 1  # BAD is measured first
        assert search.suspects() == [first_bad]
        # BAD, then a binary search over what lies before it
        assert len(probes) <= 1 + math.ceil(math.log2(count)), (first_bad, probes)


def test_a_bad_end_that_is_not_bad_ends_the_search_at_once():
    for outcome in (GOOD, SKIP):
        search = Search(6)
        search.mark(search.next_probe(), outcome)
        assert search.next_probe() is None and search.suspects() == []


def test_skips_are_searched_around_and_never_hide_the_answer():
    count = 7
    for first_bad in range(count):
        for size in range(count):
            for skipped in itertools.combinations(range(count - 1), size):  # BAD itself is measured
                probes, search = search_with(count, first_bad, set(skipped))
                # the search ends between the nearest commits around the answer that could be measured: the
                # newest good one before it and the oldest bad one from it on; what lies between was skipped
                newest_good = max((i for i in range(first_bad) if i not in skipped), default=-1)
                oldest_bad = min(i for i in range(first_bad, count) if i not in skipped)
                assert search.suspects() == list(range(newest_good + 1, oldest_bad + 1)), (first_bad, skipped)


def test_a_skip_next_to_the_first_bad_commit_leaves_both_as_suspects():
    probes, search = search_with(8, first_bad=5, skipped={4})
    assert search.suspects() == [4, 5]
    probes, search = search_with(8, first_bad=5, skipped={3})  # not next to it: the search goes around it
    assert search.suspects() == [5] and 3 in probes


def verdict(status: str, low: float, estimate: float, high: float) -> PointVerdict:
    change = Change(1000.0, 1000.0 * (1 + estimate), estimate, low, high, 0.95, 0.5, "undecided", estimate < 0, 4, 4,
                    0.1)
    return PointVerdict("", "point", status, sps=change)


def test_a_commit_is_good_once_shown_not_slower_by_the_threshold():
    assert outcome_of(verdict("regressed", -0.9, -0.8, -0.7)) == BAD
    assert outcome_of(verdict("unchanged", -0.1, 0.0, 0.1)) == GOOD
    # wide on the side of speed-ups, but shown not slower by the threshold: all a search asks
    assert outcome_of(verdict("not slower", -0.3, 0.1, 0.9)) == GOOD
    # could be slower by the threshold: undecided, skipped once the pairs run out
    assert outcome_of(verdict("inconclusive", -0.6, -0.1, 0.3)) == SKIP
    assert outcome_of(PointVerdict("", "point", "failed", "exit code 1")) == SKIP
    # halfway from GOOD to BAD as a ratio: BAD four times slower puts it at half GOOD's speed
    assert midpoint_threshold(-0.75) == pytest.approx(0.5)
    assert midpoint_threshold(-0.06) == pytest.approx(0.05)  # never below the default threshold


def test_a_step_asks_one_sided_and_its_first_look_can_decide():
    for max_repeats, alpha in ((6, 0.05), (40, 0.01), (12, 0.01)):
        design = step_design(max_repeats, alpha, threshold=0.2)
        assert design.sides == 1 and design.side_alpha == alpha
        first = design.looks[0]
        pairs = -np.linspace(0.5, 0.6, first)  # every pair far slower: complete separation
        assert decide(design, pairs, estimate=False).status == "regressed"
        assert decide(design, -np.abs(pairs), estimate=False).look == first
        # the same pairs the other way round are good at once: not slower, however much faster
        assert decide(design, -pairs, estimate=False).status == "not slower"


# ---- a small git repository holding the project -----------------------------------------------------------------

# 16 epochs of 128 agent steps: a process spends about 3 s starting and well under one training
TINY_POINT = """
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
total_steps = 2048
threads = 1
"""
TWO_POINTS = TINY_POINT.replace("hidden_size = 32\n", "") + """
[axes]
hidden_size = [32, 48]
"""
# A learn step of 16 sequences of 8 steps takes a few milliseconds here; 30 ms per call, four calls an epoch,
# is several epochs' length: the slowed commit runs several times slower, decisive at the fewest pairs.
SLOWDOWN = '__import__("time").sleep(0.03)  # each learn step waits'
def one_line_error(done: subprocess.CompletedProcess, field: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"rlperf bisect: error: {field}: "), done.stderr
    return done.stderr


@pytest.fixture(scope="module")
def small_repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("bisect-input")
    repo = project_repo(root)
    for subject in ("Note one", "Note two"):
        note(repo, subject)
        commit(repo, subject)
    (root / "tiny.toml").write_text(TINY_POINT)
    (root / "two.toml").write_text(TWO_POINTS)
    return repo


def test_bad_input_is_one_line_and_exit_2_before_anything_is_measured(small_repo):
    root = small_repo.parent
    tiny, two = str(root / "tiny.toml"), str(root / "two.toml")
    out = root / "out"
    cases = [
        (("no-such-ref", "HEAD", "--suite", tiny), "good", "'no-such-ref' is not a commit"),
        (("HEAD~2", "no-such-ref", "--suite", tiny), "bad", "'no-such-ref' is not a commit"),
        (("HEAD", "HEAD~2", "--suite", tiny), "good", "is not an ancestor of bad"),
        (("HEAD", "HEAD", "--suite", tiny), "bad", "is the same commit as good"),
        (("HEAD~2", "HEAD", "--suite", two), "point", "has 2 points; name one with --point"),
        (("HEAD~2", "HEAD", "--suite", two, "--point", '{"hidden_size": 64}'), "point", "is not a point"),
    ]
    for args, field, text in cases:
        line = one_line_error(rlperf(small_repo, "bisect", *args, "--out", str(out), timeout=120), field)
        assert text in line, line
    # a tracked file changed: refused too (a stored key, in another spacing, picks one of two points)
    note(small_repo, "uncommitted")
    try:
        done = rlperf(small_repo, "bisect", "HEAD~2", "HEAD", "--suite", two, "--point", '{"hidden_size": 48}',
                      "--out", str(out), timeout=120)
        assert "uncommitted changes" in one_line_error(done, "working tree")
    finally:
        git(small_repo, "checkout", "--", "NOTES.md")
    assert not out.exists()  # nothing was measured or stored


def test_every_flag_has_help_with_its_default():
    from command.bisect import configure
    from command.cli import OneLineParser

    parser = OneLineParser(prog="rlperf bisect")
    configure(parser)
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert "default" in (action.help or "") or action.required, action.option_strings


# ---- a real search ------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bisect_names_the_commit_that_slowed_the_learn_step(tmp_path):
    repo = project_repo(tmp_path)
    good = git(repo, "rev-parse", "HEAD")
    train = repo / "reference_trainer" / "train.py"
    history = {}
    for subject in ("Note the plan", "Describe the point"):
        note(repo, subject)
        history[subject] = commit(repo, subject)
    # a commit whose trainer cannot even be imported: skipped, and searched around
    source = train.read_text()
    train.write_text(source + "\nimport a_module_this_commit_forgot  # noqa: E402\n")
    history["Import a module that is not there"] = commit(repo, "Import a module that is not there")
    train.write_text(source)
    history["Drop the stray import"] = commit(repo, "Drop the stray import")
    plant_in_learn_step(repo, SLOWDOWN)
    culprit = commit(repo, "Slow the learn step")
    for subject in ("Tidy the notes", "Note the result"):
        note(repo, subject)
        history[subject] = commit(repo, subject)
    bad = history["Note the result"]
    (tmp_path / "tiny.toml").write_text(TINY_POINT)

    # Paths relative to the repository: each checkout's trainer runs in its own directory and must still find
    # them. At 95%, one-sided, the first look, at 5 pairs, decides when no pair was contended; the second, at 6,
    # leaves room for a pair that other processes on the machine disturbed, which verdicts leave out.
    done = rlperf(repo, "bisect", good[:10], "main", "--suite", str(tmp_path / "tiny.toml"), "--max-repeats", "6",
                  "--alpha", "0.05", "--out", "../out", "--json", "../search.json", timeout=580)
    assert done.returncode == 0, done.stdout + done.stderr
    *_, last, which = done.stdout.strip().splitlines()
    assert which.startswith("which operator: rlperf profile ")
    assert f"--against {culprit[:7]}~1 --at {culprit[:7]}" in which
    assert re.fullmatch(rf'first bad commit: {culprit[:7]} "Slow the learn step" -\d+\.\d% '
                        r'\[-\d+\.\d%, -\d+\.\d%\]', last), done.stdout

    search = json.loads((tmp_path / "search.json").read_text())
    assert search["status"] == "found" and search["first_bad"]["commit"] == culprit
    assert search["order"] == "first-parent" and len(search["commits"]) == 7
    steps = search["steps"]
    assert steps[0]["commit"] == bad and steps[0]["role"] == "bad end" and steps[0]["outcome"] == "bad"
    broken = history["Import a module that is not there"]
    by_commit = {step["commit"]: step for step in steps}
    # the first probe is the middle of the six commits before BAD: the broken one, skipped
    assert steps[1]["commit"] == broken and by_commit[broken]["verdict"] == "failed"
    assert by_commit[broken]["outcome"] == "skip"
    assert by_commit[broken]["reason"].startswith(f"{broken[:7]}: failed: exit code")
    assert by_commit[culprit]["outcome"] == "bad" and by_commit[culprit]["estimate"] < -0.5
    for step in steps:
        assert step["seconds"] > 0 and step["good_run"] and step["run"]
        if step["outcome"] in ("good", "bad"):
            assert step["pairs"] in (5, 6) and step["interval"][0] <= step["estimate"] <= step["interval"][1]

    # every measured commit is a run that names its commit and the GOOD run it was measured against
    with Store.open(tmp_path / "out" / "results.sqlite", readonly=True) as store:
        runs = store.runs().set_index("run_id")
        assert len(runs) == 2 * len(steps) and set(runs["status"]) == {"complete"}
        for step in steps:
            probe, against = runs.loc[step["run"]], runs.loc[step["good_run"]]
            assert probe["git_commit"] == step["commit"] and against["git_commit"] == good
            assert probe["fingerprint"]["bisect"] == {"good": good, "bad": bad, "step": step["step"],
                                                      "side": "probe", "good_run": step["good_run"]}
            points = store.points(step["run"])
            assert list(points["status"]) == ["failed" if step["verdict"] == "failed" else "ok"]
    # the temporary checkouts are gone
    assert len(git(repo, "worktree", "list").splitlines()) == 1
