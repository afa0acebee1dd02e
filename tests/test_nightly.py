"""The nightly workflow's steps (benches/nightly.py) on a real small store: a CPU sweep of a suite named
`nightly`, plus runs written beside it that failed, skipped, missed points, were interrupted, or came from
another suite or machine. What the job must never do: report an older run as tonight's, pass a run that did not
measure everything, lose the gate's status, promote something that is no commit, or pass when a step failed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import torch

from benches import nightly
from benches.gate import write_summary
from rlperf.store import PointRecord, Store, canonical_json, utc_now

SUITE = """
    description = "a CPU stand-in for the nightly matrix"
    repeats = 1
    sample_hz = 0
    [fixed]
    device = "cpu"
    env = "synthetic"
    horizon = 8
    hidden_size = 16
    minibatch_size = 64
    update_epochs = 1
    total_steps = 384
    threads = 1
    [axes]
    num_envs = [8, 16]
"""


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """DATA with one real nightly run; returns (data dir, suite file, the mark before it, its run id)."""
    root = tmp_path_factory.mktemp("nightly")
    suite = root / "nightly.toml"
    suite.write_text(textwrap.dedent(SUITE))
    data = root / "data"
    mark = utc_now()
    done = subprocess.run([sys.executable, "-m", "rlperf", "bench", "--suite", str(suite), "--out", str(data)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    with Store.open(data / "results.sqlite", readonly=True) as store:
        run_id = store.latest_run()
    return data, suite, mark, run_id


def step(*argv: str) -> int:
    try:
        return nightly.main(list(argv))
    except SystemExit as exc:  # argparse refusing an argument
        return int(exc.code)


def copy_data(night, tmp_path):
    data, suite, mark, run_id = night
    copy = tmp_path / "data"
    shutil.copytree(data, copy)
    return copy, suite, mark, run_id


def add_run(data, like: str, points: list[tuple[dict, str]], status="complete", suite="nightly", key=None) -> str:
    """A run written beside the real one, with its fingerprint, suite hash and point configs."""
    with Store.open(data / "results.sqlite") as store:
        runs = store.runs().set_index("run_id")
        real = runs.loc[like]
        configs = {row.point_key: row.config for row in store.points(like).itertuples()}
        run_id = store.create_run(suite, real["suite_hash"], real["fingerprint"], key or real["machine_key"], None)
        for values, point_status in points:
            point_key = canonical_json(values)
            config = {**next(iter(configs.values())), **values}
            store.record_point(run_id, PointRecord(point_key, config, point_status, utc_now(), 1.0,
                                                   reason="pretend" if point_status != "ok" else None))
        store.finish_run(run_id, status)
    return run_id


def test_tonight_is_the_run_made_since_the_mark_never_an_older_one(night):
    data, _, mark, run_id = night
    store = str(data / "results.sqlite")
    found = rlperf("runs", store, "--latest", "nightly", "--since", mark)
    assert found.returncode == 0 and found.stdout.strip() == run_id
    # compared as times, not as text: the mark's own moment written one hour east of UTC
    east = datetime.fromisoformat(mark).astimezone(timezone(timedelta(hours=1))).isoformat()
    assert rlperf("runs", store, "--latest", "nightly", "--since", east).stdout.strip() == run_id
    bad = rlperf("runs", store, "--latest", "nightly", "--since", "yesterday")
    assert bad.returncode == 2 and "argument --since: must be an ISO 8601 time" in bad.stderr
    time.sleep(1.1)  # the store's clock has one-second resolution
    none = rlperf("runs", store, "--latest", "nightly", "--since", utc_now())
    assert none.returncode == 2 and none.stdout == "" and run_id not in none.stderr
    assert none.stderr.startswith("rlperf runs: error: latest: no run of suite 'nightly' started at or after")
    assert len(none.stderr.splitlines()) == 1
    missing = rlperf("runs", str(data / "missing.sqlite"), "--latest", "nightly")
    assert missing.returncode == 2 and "no store at" in missing.stderr
    listed = rlperf("runs", store)
    assert listed.returncode == 0 and run_id in listed.stdout and "nightly" in listed.stdout


def rlperf(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlperf", *args], capture_output=True, text=True)


def test_check_run_passes_a_whole_run_and_names_what_a_partial_one_lacks(night, tmp_path, capsys):
    data, suite, _, run_id = copy_data(night, tmp_path)
    store = str(data / "results.sqlite")
    assert step("check-run", "--store", store, "--run", run_id, "--suite", str(suite)) == 0
    capsys.readouterr()
    partial = add_run(data, run_id, [({"num_envs": 8}, "failed")], status="interrupted")
    assert step("check-run", "--store", store, "--run", partial, "--suite", str(suite)) == 1
    out = capsys.readouterr().out
    assert f"run {partial} is interrupted" in out and '{"num_envs":8}: failed' in out
    assert '{"num_envs":16}: missing' in out
    # a point skipped because this machine lacks what it needs is not a measurement (no CUDA seen, say)
    skipped = add_run(data, run_id, [({"num_envs": 8}, "ok"), ({"num_envs": 16}, "skipped")])
    assert step("check-run", "--store", store, "--run", skipped, "--suite", str(suite)) == 1
    assert '{"num_envs":16}: skipped (pretend)' in capsys.readouterr().out
    # ... but one asking for more GPUs than the machine has is expected to be skipped
    wide = add_run(data, run_id, [({"num_envs": 8}, "ok"), ({"num_envs": 16}, "ok"),
                                  ({"num_envs": 16, "world_size": 8}, "skipped")])
    assert step("check-run", "--store", store, "--run", wide, "--suite", str(suite)) == 0
    assert step("check-run", "--store", store, "--run", "") == 2  # an empty run id is refused


def gate_summary(data, run_id, tmp_path, exit_code=0):
    """What `rlperf gate --summary` leaves, around the fixture's real run and its rendered report."""
    report = tmp_path / "gate-report"
    assert rlperf("report", f"{data / 'results.sqlite'}::{run_id}", "--out", str(report)).returncode == 0
    summary = tmp_path / "gate.json"
    write_summary(summary, {"store": str(data / "results.sqlite"), "runs": {"screen_ref": run_id, "screen_new": run_id},
                            "baseline": "HEAD", "report": str(report), "exit_code": exit_code,
                            "conclusion": "gate: no point got slower (2 points, 0 skipped, 0 suspects not confirmed)",
                            "points": []})
    return summary


def test_publish_writes_the_gates_status_first_then_the_summary_and_history(night, tmp_path, monkeypatch):
    data, _, _, run_id = copy_data(night, tmp_path)
    output, job_summary = tmp_path / "output", tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(job_summary))
    summary = gate_summary(data, run_id, tmp_path, exit_code=3)
    assert step("publish", "--data", str(data), "--summary", str(summary), "--out", str(tmp_path / "report")) == 0
    assert output.read_text() == f"status=3\nrun_id={run_id}\n"
    assert job_summary.read_text().startswith("gate: no point got slower")
    assert (tmp_path / "report" / "report.md").is_file()
    assert (tmp_path / "report" / "history" / "report.html").is_file()
    # a job summary that cannot be written must not lose the gate's status
    output.unlink()
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path))
    with pytest.raises(IsADirectoryError):
        step("publish", "--data", str(data), "--summary", str(summary), "--out", str(tmp_path / "again"))
    assert output.read_text() == f"status=3\nrun_id={run_id}\n"
    # a gate that left nothing readable (killed, say) is a failed step, not a pass
    assert step("publish", "--data", str(data), "--summary", str(tmp_path / "missing.json")) == 1


def test_promote_takes_only_a_commit_and_the_first_night_once(night, tmp_path, capsys, monkeypatch):
    data, _, _, run_id = copy_data(night, tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    parent = subprocess.run(["git", "rev-parse", "HEAD~1"], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert step("promote", "--data", str(data), "--commit", "no-such-ref-x") == 1
    assert "commit: 'no-such-ref-x' is not a commit" in capsys.readouterr().out
    assert not (data / "baseline").exists()
    assert step("promote", "--data", str(data), "--commit", "HEAD~1", "--first-night") == 0
    assert (data / "baseline").read_text() == parent + "\n"
    assert f"Baseline of this machine: none -> {parent}" in capsys.readouterr().out
    assert step("promote", "--data", str(data), "--commit", "HEAD", "--first-night") == 0
    assert (data / "baseline").read_text() == parent + "\n"  # the first night happens once
    assert step("promote", "--data", str(data), "--commit", "HEAD") == 0
    assert (data / "baseline").read_text() == head + "\n"
    # a night that did not pass is never a baseline, whatever the step's condition in the workflow says
    capsys.readouterr()
    for code in (1, 3):
        summary = tmp_path / f"exit-{code}.json"
        write_summary(summary, {"runs": {"screen_new": run_id}, "exit_code": code, "conclusion": "gate: undecided"})
        assert step("promote", "--data", str(data), "--commit", "HEAD~1", "--summary", str(summary)) == 1
        assert f"not promoted: the night did not pass (exit {code}): gate: undecided" in capsys.readouterr().out
        assert (data / "baseline").read_text() == head + "\n"
    passed = tmp_path / "passed.json"
    write_summary(passed, {"runs": {"screen_new": run_id}, "exit_code": 0, "conclusion": "gate: no point got slower"})
    assert step("promote", "--data", str(data), "--commit", "HEAD~1", "--summary", str(passed)) == 0
    assert (data / "baseline").read_text() == parent + "\n"


def test_locate_names_the_baseline_commit_and_keep_logs_only_the_gates_runs(night, tmp_path, capsys, monkeypatch):
    data, _, _, run_id = copy_data(night, tmp_path)
    assert step("locate", "--data", str(data)) == 0
    assert capsys.readouterr().out.splitlines() == [f"DATA={data}"]
    # a baseline written when baselines were runs names the commit of that run
    (data / "baseline").write_text(run_id + "\n")
    monkeypatch.setenv("RLPERF_DATA", str(data))
    with Store.open(data / "results.sqlite", readonly=True) as store:
        commit = store.runs().set_index("run_id").loc[run_id, "git_commit"]
    assert step("locate") == 0
    assert capsys.readouterr().out.splitlines() == [f"DATA={data}", f"BASELINE={commit}"]

    summary = gate_summary(data, run_id, tmp_path)
    assert step("keep-logs", "--data", str(data), "--summary", str(summary), "--into", str(tmp_path / "logs")) == 0
    kept = {path.name for path in (tmp_path / "logs").rglob("repeat-*.log")}
    assert kept == {"repeat-0.log"} and not (tmp_path / "logs" / "results.sqlite").exists()
    for bad in ("", "..", "/", "x/../..", "*"):
        forged = tmp_path / "forged.json"
        forged.write_text(summary.read_text().replace(f'"screen_ref": "{run_id}"', f'"screen_ref": "{bad}"'))
        assert step("keep-logs", "--data", str(data), "--summary", str(forged), "--into", str(tmp_path / "bad")) == 1
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("status, steps, errors", [
    ("0", ["torch=success", "publish=success", "check=success", "gpu_tests=success"], []),
    ("1", ["publish=success"], ["a point regressed"]),
    ("3", ["publish=success"], ["could not measure or decide every point"]),
    ("2", ["publish=success"], ["the gate did not finish (status 2)"]),
    ("", ["publish=failure"], ["the gate did not finish (status not written)", "left no outcome to publish"]),
    ("0", ["check=failure", "gpu_tests=success"], ["did not measure every point"]),
    ("0", ["torch=failure"], ["torch does not see CUDA"]),
    ("0", ["gpu_tests=failure"], ["a GPU correctness test failed"]),
])
def test_gate_fails_on_every_failed_step_regression_or_unmeasured_point(status, steps, errors, capsys):
    argv = ["gate", "--status", status, "--baseline", "abc1234"]
    for item in steps:
        argv += ["--step", item]
    assert step(*argv) == (1 if errors else 0)
    out = capsys.readouterr().out
    for error in errors:
        assert error in out
    assert out.count("::error::") == len(errors)


def test_check_torch_prints_where_torch_is_and_fails_without_cuda(capsys):
    code = step("check-torch")
    out = capsys.readouterr().out
    assert f"from {torch.__file__}" in out and f"torch.version.cuda {torch.version.cuda}" in out
    if torch.cuda.is_available():
        assert code == 0
    else:
        assert code == 1 and "::error::this environment's torch does not see CUDA" in out


def test_the_workflows_build_step_runs_the_noxfile_without_running_a_session():
    """`nox -s bench tests --install-only` (the workflow's build step) installs and runs nothing: the bench
    session's choice of suite, made by running python, must not be read when nox ran nothing. Here nox installs
    nothing either (--no-venv --no-install), so only the sessions' own logic runs."""
    pytest.importorskip("nox")  # in the test extra; a bare interpreter running pytest may lack it
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "nox", "-f", str(root / "noxfile.py"), "-s", "bench", "tests",
                           "--install-only", "--no-venv", "--no-install"],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "bench: success" in done.stderr and "tests: success" in done.stderr


WORKFLOW = Path(__file__).resolve().parents[1] / ".github" / "workflows" / "nightly-bench.yml"


def test_the_nightly_workflow_has_no_finding_of_zizmor_at_medium_severity_or_above():
    """A self-hosted runner keeps what a job leaves on it: actions pinned to commits, no credentials persisted in
    .git/config, step outputs reaching shell only through the environment. Absent zizmor is a skip on a
    developer's machine and a failure on CI, where the test extra installs it."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    zizmor = shutil.which("zizmor", path=search)
    if zizmor is None:
        if os.environ.get("CI") == "true":
            pytest.fail("zizmor is not installed; the test extra (pip install -e '.[test]') installs it")
        pytest.skip("zizmor is not installed (pip install -e '.[test]' installs it)")
    done = subprocess.run([zizmor, "--offline", "--no-exit-codes", "--min-severity", "medium", "--format", "json",
                           str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    findings = [f"{finding['ident']} ({finding['determinations']['severity']}): {finding['desc']}"
                for finding in json.loads(done.stdout)]
    assert not findings, findings
