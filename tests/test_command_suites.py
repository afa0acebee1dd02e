"""Suites of commands (benches/suite.py): a point is a user's command with the axes substituted in, run under
`rlperf attach` (or marking its own phases), stored, reported and gated like the reference trainer's points;
a command that is not found, fails, writes no summary, hangs or never marks a phase is a stored point with its
reason, and the other points are kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from projectrepo import GIT_ENV, commit, git, note, project_repo

from benches import suite as suites
from rlperf.errors import BadInput
from rlperf.store import PointRecord, Store, utc_now

# A user's training loop: pure Python, its phases marked through rlperf.phases, its step times slept.
TRAIN = textwrap.dedent("""
    import argparse, sys, time
    from rlperf import phases

    LEARN_S = 0.040

    parser = argparse.ArgumentParser()
    parser.add_argument("--n-envs", type=int, default=4)
    parser.add_argument("--mode", default="ok")
    args = parser.parse_args()
    if args.mode == "crash":
        sys.exit("RuntimeError: the simulator lost its licence (pretend)")
    if args.mode == "hang":
        time.sleep(600)
    phases.configure(n_envs=args.n_envs)
    for epoch in range(4):
        for step in range(4):
            if args.mode != "nophase":
                with phases.phase("eval_forward"):
                    time.sleep(0.0005)
                with phases.phase("env"):
                    time.sleep(0.0001 * args.n_envs)
            phases.steps(args.n_envs)
        if args.mode != "nophase":
            with phases.phase("learn"):
                time.sleep(LEARN_S)
        phases.end_epoch()
""")


def suite_text(axes: str, **options) -> str:
    head = "\n".join(f"{key} = {json.dumps(value)}" for key, value in options.items())
    return textwrap.dedent(f"""
        command = ["{sys.executable}", "train.py", "--n-envs", "{{num_envs}}", "--mode", "{{mode}}"]
        attach = false
        repeats = 1
        sample_hz = 0
        {head}
        [fixed]
        mode = "ok"
        [axes]
    """) + textwrap.dedent(axes)


def user_repo(tmp_path: Path, suite: str) -> Path:
    repo = tmp_path / "user"
    repo.mkdir()
    (repo / "train.py").write_text(TRAIN)
    (repo / "suite.toml").write_text(suite)
    git(repo, "init", "-q", "-b", "main")
    commit(repo, "A training loop and its suite")
    return repo


def test_a_command_suite_substitutes_its_axes_into_each_points_command(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(suite_text("num_envs = [2, 8]"))
    loaded = suites.load(str(path))
    assert loaded.is_command_suite and [p.key for p in loaded.points] == ['{"num_envs":2}', '{"num_envs":8}']
    config = loaded.points[1].config
    assert config["command"] == [sys.executable, "train.py", "--n-envs", "8", "--mode", "ok"]
    assert config["device"] == "cpu" and config["attach"] is False and config["world_size"] == 1


@pytest.mark.parametrize("text, line", [
    ('command = ["python", "{seeds}"]\n[axes]\nnum_envs = [1]', "command[1]: {seeds} names no setting of the suite"),
    ('command = ["python"]\n[fixed]\ndevice = "tpu"', "fixed.device: must be a device: cpu, cuda or cuda:N"),
    ('attach = false\n[axes]\nnum_envs = [1]', "attach: belongs to a suite of commands: set `command` too"),
    ('command = "python train.py"', "command: must be a trainer's command as a list of strings"),
    ('command = ["python", "{s}"]\n[fixed]\ns = "a.py"\n[against]\nseed = 2', "against.seed: names no setting of "
                                                                            "the suite (allowed: s)"),
    ('command = ["python"]\n[fixed]\ndevice = "cpu"\n[against]\ndevice = "cuda"',
     "against.device: both sides of a pair compute on one device"),
])
def test_a_bad_command_suite_is_one_line_naming_its_key(tmp_path, text, line):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(BadInput) as refused:
        suites.load(str(path))
    assert line in str(refused.value) and "\n" not in str(refused.value)


def run_rlperf(repo: Path, *args: str, timeout: float, rlperf_copy: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m rlperf` run in the user's repository; with `rlperf_copy` (tests/projectrepo.py's copy, whose
    interference monitor counts every repeat as quiet) that copy is the rlperf imported, by it and its commands."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("RLPERF_") and key != "PYTHONPATH"}
    if rlperf_copy is not None:
        env["PYTHONPATH"] = str(rlperf_copy)
    return subprocess.run([sys.executable, "-m", "rlperf", *args], cwd=repo, capture_output=True, text=True,
                          timeout=timeout, env={**env, **GIT_ENV, "RLPERF_LOCK": str(repo.parent / "bench.lock")})


SWEEP = textwrap.dedent("""
    command = ["{python}", "train.py", "--n-envs", "{num_envs}", "--mode", "{mode}"]
    attach = false
    repeats = 1
    sample_hz = 0
    timeout_s = 4
    profile = true
    [[sweep]]
    python = ["%s"]
    num_envs = [8]
    mode = ["ok"]
    [[sweep]]
    python = ["%s"]
    num_envs = [2]
    mode = ["crash", "nophase", "hang"]
    [[sweep]]
    python = ["no-such-python"]
    num_envs = [2]
    mode = ["ok"]
""") % (sys.executable, sys.executable)


def key(python: str = sys.executable, **axes) -> str:
    return json.dumps({"python": python, **axes}, sort_keys=True, separators=(",", ":"))


def test_a_sweep_of_commands_is_stored_reported_and_keeps_its_failures_with_their_reasons(tmp_path):
    repo = user_repo(tmp_path, SWEEP)
    done = run_rlperf(repo, "bench", "--suite", "suite.toml", "--out", "../out", timeout=180)
    with Store.open(tmp_path / "out" / "results.sqlite", readonly=True) as store:
        run_id = store.latest_run()
        points = {row.point_key: row for row in store.points(run_id).itertuples()}
        samples = store.samples(run_id)
        fingerprint = store.fingerprint(run_id)
        traces = store.traces(run_id)
    assert fingerprint["git"]["commit"] == git(repo, "rev-parse", "HEAD")  # the user's repository, not rlperf's
    ok = [point_key for point_key, row in points.items() if row.status == "ok"]
    assert ok == [key(mode="ok", num_envs=8)], done.stdout + done.stderr
    crash, nophase, hang = (points[key(mode=mode, num_envs=2)] for mode in ("crash", "nophase", "hang"))
    missing = points[key("no-such-python", mode="ok", num_envs=2)]
    assert crash.status == "failed" and "exit code 1" in crash.reason and "lost its licence" in crash.reason
    assert nophase.status == "failed" and "no phase was marked in 4 epochs" in nophase.reason
    assert hang.status == "timeout" and hang.reason.startswith("repeat 1 of 1: killed after 4 s")
    assert missing.status == "failed" and "command: 'no-such-python' not found" in missing.reason
    summary = samples[samples["point_key"] == key(mode="ok", num_envs=8)]["summary"].iloc[0]
    assert summary.writer == "phases" and summary.steady_steps == 3 * 4 * 8 and summary.config == {"n_envs": 8}
    # profile = true: each point measured gets a traced run of its first steady epoch, its phases ranges in it
    assert list(traces["point_key"]) == ok
    traced = traces.iloc[0]
    ranges = traced.summary["trace_summary"]["phases_host_us"]
    assert ranges["learn"] >= 1e6 * 0.040 and ranges["env"] > 0 and traced.summary["trace_summary"]["env_steps"] == 32
    report = (tmp_path / "out" / run_id / "report" / "report.md").read_text()
    assert "Phase breakdown" in report and "Which side waits" in report and "No roofline for " in report
    assert "## Traces" in report and traced.path in report


PAIRED = textwrap.dedent("""
    command = ["{python}", "{script}", "--n-envs", "4"]
    attach = false
    repeats = 4
    sample_hz = 0
    timeout_s = 60
    [fixed]
    python = "%s"
    [axes]
    script = ["train_same.py", "train_slow.py"]
    [against]               # every point against the user's train.py
    script = "train.py"
""") % sys.executable


def test_two_commands_compare_in_pairs_and_only_the_slower_one_is_found_regressed(tmp_path, rlperf_copy):
    repo = user_repo(tmp_path, PAIRED)
    (repo / "train_same.py").write_text(TRAIN)
    (repo / "train_slow.py").write_text(TRAIN.replace("LEARN_S = 0.040", "LEARN_S = 0.060"))
    commit(repo, "Two variants of the loop")
    # alpha 0.3: 4 pairs a point can claim a change (0.5^4 under 0.3 / 2 points / 2 sides)
    done = run_rlperf(repo, "bench", "--suite", "suite.toml", "--out", "../out", "--alpha", "0.3", timeout=300,
                      rlperf_copy=rlperf_copy)
    assert done.returncode == 1, done.stdout + done.stderr  # a regression found
    with Store.open(tmp_path / "out" / "results.sqlite", readonly=True) as store:
        runs = store.runs()
        ref_run, new_run = runs["run_id"]
        assert [f["against"]["side"] for f in runs["fingerprint"]] == ["ref", "suite"]
        assert runs["fingerprint"].iloc[0]["against"]["settings"] == {"script": "train.py"}
        # each side stored with the config it ran: the reference's is train.py for every point
        ran = {run_id: {row.point_key: row.config["command"][1] for row in store.points(run_id).itertuples()}
               for run_id in (ref_run, new_run)}
        assert ran[ref_run] == {'{"script":"train_same.py"}': "train.py", '{"script":"train_slow.py"}': "train.py"}
        assert ran[new_run] == {'{"script":"train_same.py"}': "train_same.py",
                                '{"script":"train_slow.py"}': "train_slow.py"}
    verdicts = {}  # the report's first table: the verdicts
    for line in (tmp_path / "out" / new_run / "report" / "report.md").read_text().splitlines():
        if line.startswith("| script="):
            verdicts.setdefault(line.split("|")[1].strip(), line.split("|")[2].strip())
    assert verdicts["script=train_slow.py"] == "regressed", verdicts
    assert verdicts["script=train_same.py"] in ("unchanged", "inconclusive"), verdicts


def test_a_suite_with_against_is_refused_by_the_gate_in_one_line(tmp_path, monkeypatch, capsys):
    from command.cli import main
    from rlperf.machine import REPOSITORY_VARIABLE

    repo = user_repo(tmp_path, PAIRED)
    monkeypatch.chdir(repo)
    monkeypatch.setenv(REPOSITORY_VARIABLE, "")  # loading the suite names its repository: for this test alone
    assert main(["gate", "--suite", "suite.toml", "--baseline", "HEAD", "--out", "../out"]) == 2
    assert capsys.readouterr().err == (
        "rlperf gate: error: suite.toml: against: the suite measures each point in pairs against its [against] "
        "settings, which `rlperf bench --suite suite.toml` does, not the gate, which compares commits (allowed: a "
        "suite without [against])\n")


# ---- a user's repository with a history: the gate, bisect, confirm and compare on it ------------------------------

LEARN_SLOWED = "LEARN_S = 0.044"  # a tenth slower


@pytest.fixture(scope="module")
def rlperf_copy(tmp_path_factory) -> Path:
    """tests/projectrepo.py's copy of rlperf, whose interference monitor counts every repeat as quiet: a shared test
    machine is busy, and in these tests the speeds must decide."""
    return project_repo(tmp_path_factory.mktemp("rlperf"))


@pytest.fixture(scope="module")
def slowed_repo(tmp_path_factory) -> Path:
    """A user's repository of three commits, checked out at the last: the loop and its suite, a note, then the
    learn step slowed by a tenth."""
    repo = user_repo(tmp_path_factory.mktemp("slowed"), suite_text("num_envs = [4]", timeout_s=60))
    note(repo, "the learn step is next")
    commit(repo, "Note what comes next")
    train = repo / "train.py"
    train.write_text(train.read_text().replace("LEARN_S = 0.040", LEARN_SLOWED))
    commit(repo, "Slow the learn step by a tenth")
    return repo


@pytest.mark.timeout(400)
def test_the_gate_fails_a_commit_that_slows_a_users_learn_step_by_ten_percent_and_names_it(slowed_repo,
                                                                                           rlperf_copy):
    repo = slowed_repo
    gate = ("gate", "--suite", "suite.toml", "--max-repeats", "8", "--screen-pairs", "4", "--refine-points", "0")
    clean = run_rlperf(repo, *gate, "--baseline", "HEAD", "--out", "../clean", timeout=380, rlperf_copy=rlperf_copy)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stdout.strip().splitlines()[-1].startswith("gate: no point got slower")
    slowed = run_rlperf(repo, *gate, "--baseline", "HEAD~2", "--out", "../slowed", timeout=380,
                        rlperf_copy=rlperf_copy)
    assert slowed.returncode == 1, slowed.stdout + slowed.stderr
    *_, last, which = slowed.stdout.strip().splitlines()
    assert which.startswith("which operator: rlperf profile --device cpu ") and " --against HEAD~2 " in which
    # the phase named: learn's time per step grew, and no other phase's
    assert last.startswith("gate: regressed: num_envs=4 -") and last.endswith(" (learn grew)"), last
    with Store.open(repo.parent / "slowed" / "results.sqlite", readonly=True) as store:
        runs = store.runs()
        screen_new = next(row.run_id for row in runs.itertuples()
                          if row.fingerprint["gate"]["stage"] == "screen" and row.fingerprint["gate"]["side"] == "new")
        # the user's repository's commits, not rlperf's
        assert {row.fingerprint["git"]["commit"] for row in runs.itertuples()} == \
            {git(repo, "rev-parse", "HEAD"), git(repo, "rev-parse", "HEAD~2")}
    assert last in (repo.parent / "slowed" / screen_new / "report" / "report.md").read_text()


@pytest.fixture(scope="module")
def bisected(slowed_repo, rlperf_copy) -> tuple[subprocess.CompletedProcess, Path]:
    """`rlperf bisect` of the slowed repository's three commits: its output and its store."""
    done = run_rlperf(slowed_repo, "bisect", "HEAD~2", "HEAD", "--suite", "suite.toml", "--out", "../bisect",
                      "--max-repeats", "6", "--alpha", "0.2", timeout=300, rlperf_copy=rlperf_copy)
    return done, slowed_repo.parent / "bisect" / "results.sqlite"


@pytest.mark.timeout(400)
def test_bisect_names_the_commit_of_a_users_repository_that_slowed_its_learn_step(bisected, slowed_repo):
    done, store_path = bisected
    assert done.returncode == 0, done.stdout + done.stderr
    slowed = git(slowed_repo, "rev-parse", "--short=7", "HEAD")
    *_, last, which = done.stdout.strip().splitlines()
    assert f" --against {slowed}~1 --at {slowed} " in which
    assert last.startswith(f'first bad commit: {slowed} "Slow the learn step by a tenth" -'), last
    with Store.open(store_path, readonly=True) as store:
        commits = {row.fingerprint["git"]["commit"] for row in store.runs().itertuples()}
    assert commits == {git(slowed_repo, "rev-parse", ref) for ref in ("HEAD", "HEAD~1", "HEAD~2")}


def history_of(bisect_store: Path, path: Path) -> None:
    """A store whose history has a change point, made of the bisection's first step: runs at GOOD's commit, then as
    many at BAD's, with the fingerprints the bench gives such runs (what `rlperf bench` would store night after night,
    without measuring it all again). The two sides' processes ran in pairs, at one time, and each run holds every
    process of its side: its level is the side's median, so no process a busy machine slowed moves one run from the
    others of its side, and the history's one change is the commit's, however busy the machine was."""
    with Store.open(bisect_store, readonly=True) as store:
        runs = store.runs()
        sides = {"good": [], "probe": []}
        for row in runs.itertuples():
            step = row.fingerprint["bisect"]
            if step["step"] == 1:
                point = store.points(row.run_id).iloc[0]
                sides[step["side"]] += [(row, point, summary) for summary in store.samples(row.run_id)["summary"]]
    with Store.open(path) as history:
        for side in sides.values():
            for row, point, _ in side:
                fingerprint = {name: value for name, value in row.fingerprint.items()
                               if name not in ("bisect", "pairing")}
                run_id = history.create_run(row.suite, row.suite_hash, fingerprint, row.machine_key, "a night")
                summaries = [summary for _, _, summary in side]
                for summary in summaries:
                    summary.pair = None
                history.record_point(run_id, PointRecord(point.point_key, point.config, "ok", utc_now(), 1.0,
                                                         samples=list(enumerate(summaries))))
                history.finish_run(run_id, "complete")


def test_confirm_measures_again_the_commits_either_side_of_a_command_suites_change_point(bisected, slowed_repo,
                                                                                        rlperf_copy, tmp_path):
    _, bisect_store = bisected
    history = tmp_path / "history.sqlite"
    history_of(bisect_store, history)
    done = run_rlperf(slowed_repo, "confirm", str(history), "--out", str(tmp_path / "logs"), "--max-repeats", "6",
                      "--alpha", "0.2", timeout=300, rlperf_copy=rlperf_copy)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    line = next(line for line in reversed(lines) if not line.startswith("which operator: "))
    assert line.startswith("num_envs=4 at ") and ": confirmed: -" in line, done.stdout
    assert all(" --against " in line for line in lines[lines.index(line) + 1:])  # the diffs that say which operator
    with Store.open(history, readonly=True) as store:
        confirmations = [row for row in store.runs().itertuples() if "confirms" in row.fingerprint]
    # the user's repository's two commits, checked out and measured in pairs
    assert sorted(row.fingerprint["git"]["commit"] for row in confirmations) == \
        sorted(git(slowed_repo, "rev-parse", ref) for ref in ("HEAD", "HEAD~2"))


def test_compare_matches_a_command_point_across_devices_by_its_settings(tmp_path):
    from reports.comparison import across_machines

    path = tmp_path / "s.toml"
    path.write_text('command = ["python", "train.py", "--device", "{device}", "--n-envs", "{n}"]\n[axes]\nn = [4, 8]')
    cpu, cuda = (suites.load(str(path), {"device": device}).points for device in ("cpu", "cuda"))
    assert cpu[0].config["command"] != cuda[0].config["command"]
    assert across_machines(cpu[0].key, cpu[0].config) == across_machines(cuda[0].key, cuda[0].config)
    assert across_machines(cpu[0].key, cpu[0].config) != across_machines(cuda[1].key, cuda[1].config)


def test_compare_shows_two_runs_of_a_command_suite_side_by_side(bisected, slowed_repo, rlperf_copy):
    _, store_path = bisected
    with Store.open(store_path, readonly=True) as store:
        runs = store.runs()
    good, slowed = runs["run_id"].iloc[0], runs["run_id"].iloc[1]  # the first step: GOOD, then BAD
    done = run_rlperf(slowed_repo, "compare", f"{store_path}::{good}", f"{store_path}::{slowed}", "--label", "A=good",
                      "--label", "B=slowed", "--out", "../compare", timeout=120, rlperf_copy=rlperf_copy)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "median steady SPS, good vs slowed" in done.stdout and "num_envs=4" in done.stdout
    report = (slowed_repo.parent / "compare" / "report.md").read_text()
    assert "Phase shares" in report or "phase" in report.lower()
