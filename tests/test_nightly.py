"""The nightly workflow's steps (benches/nightly.py) on a real small store: a CPU sweep of a suite named
`nightly`, plus runs written beside it that failed, skipped, missed points, were interrupted, or came from
another suite or machine. What the job must never do: report an older run as tonight's, promote a run
that did not measure everything, lose the comparison's status, or pass when something failed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from benches import nightly
from rlperf.store import PointRecord, Store, canonical_json, utc_now

SUITE = """
    description = "a CPU stand-in for the nightly matrix"
    repeats = 1
    sample_hz = 0
    [fixed]
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


def test_compare_writes_its_status_first_and_reports_against_the_baseline(night, tmp_path, monkeypatch):
    data, _, _, run_id = copy_data(night, tmp_path)
    output, summary = tmp_path / "output", tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert step("compare", "--data", str(data), "--run", run_id, "--out", str(tmp_path / "report")) == 0
    assert output.read_text() == "status=0\n"
    assert "No baseline on this machine yet" in summary.read_text() and run_id in summary.read_text()
    assert (tmp_path / "report" / "history" / "report.html").is_file()

    earlier = add_run(data, run_id, [({"num_envs": 8}, "ok"), ({"num_envs": 16}, "ok")])
    (data / "baseline").write_text(earlier + "\n")
    output.unlink()
    # a job summary that cannot be written must not lose the comparison's status
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path))
    with pytest.raises(IsADirectoryError):
        step("compare", "--data", str(data), "--run", run_id, "--out", str(tmp_path / "again"))
    assert output.read_text() == "status=0\n"
    assert f"Baseline: run {earlier}" in (tmp_path / "again" / "report.md").read_text()
    # a comparison the report refuses (here: the run against itself) is a status too, not a lost one
    (data / "baseline").write_text(run_id + "\n")
    output.unlink()
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert step("compare", "--data", str(data), "--run", run_id, "--out", str(tmp_path / "self")) == 0
    assert output.read_text() == "status=2\n"


def test_promote_takes_only_a_whole_nightly_run_of_this_machine(night, tmp_path, capsys, monkeypatch):
    data, suite, _, run_id = copy_data(night, tmp_path)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    promote = ["promote", "--data", str(data), "--suite", str(suite), "--run"]
    other_suite = add_run(data, run_id, [({"num_envs": 8}, "ok"), ({"num_envs": 16}, "ok")], suite="smoke")
    other_machine = add_run(data, run_id, [({"num_envs": 8}, "ok"), ({"num_envs": 16}, "ok")], key="0" * 16)
    failed = add_run(data, run_id, [({"num_envs": 8}, "ok"), ({"num_envs": 16}, "timeout")])
    for refused, why in ((other_suite, "is of suite 'smoke'"), (other_machine, "on another machine"),
                         (failed, '{"num_envs":16}: timeout')):
        assert step(*promote, refused, "--first-night") == 1
        assert why in capsys.readouterr().out
        assert not (data / "baseline").exists()
    assert step(*promote, "20990101T000000-nightly-000000") == 1  # not in the store
    assert not (data / "baseline").exists()

    assert step(*promote, run_id, "--first-night") == 0
    assert (data / "baseline").read_text() == run_id + "\n"
    assert f"Baseline of this machine: none -> {run_id}" in capsys.readouterr().out
    # the first night happens once: a later --first-night keeps the baseline
    later = add_run(data, run_id, [({"num_envs": 8}, "ok"), ({"num_envs": 16}, "ok")])
    assert step(*promote, later, "--first-night") == 0
    assert (data / "baseline").read_text() == run_id + "\n"
    # promoting by hand replaces it, under the same checks
    assert step(*promote, later) == 0
    assert (data / "baseline").read_text() == later + "\n"
    assert step(*promote, failed) == 1 and (data / "baseline").read_text() == later + "\n"


def test_locate_and_keep_logs_never_name_the_whole_store(night, tmp_path, capsys, monkeypatch):
    data, _, _, run_id = copy_data(night, tmp_path)
    assert step("locate", "--data", str(data)) == 0
    assert capsys.readouterr().out.splitlines() == [f"DATA={data}"]
    (data / "baseline").write_text(run_id + "\n")
    monkeypatch.setenv("RLPERF_DATA", str(data))
    assert step("locate") == 0
    assert capsys.readouterr().out.splitlines() == [f"DATA={data}", f"BASELINE={data / 'results.sqlite'}::{run_id}"]

    assert step("keep-logs", "--data", str(data), "--run", run_id, "--into", str(tmp_path / "logs")) == 0
    kept = {path.name for path in (tmp_path / "logs" / "points").rglob("repeat-*.log")}
    assert kept == {"repeat-0.log"} and not (tmp_path / "logs" / "results.sqlite").exists()
    for bad in ("", "..", "/", "x/../..", "*"):
        assert step("keep-logs", "--data", str(data), "--run", bad, "--into", str(tmp_path / "bad")) == 2
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("status, steps, errors", [
    ("0", ["torch=success", "bench=success", "check=success", "gpu_tests=success"], []),
    ("1", ["bench=success"], ["a point regressed"]),
    ("2", ["bench=success"], ["could not compare"]),
    ("", ["bench=success"], ["could not compare the runs (status not written)"]),
    ("0", ["bench=failure", "check=skipped", "gpu_tests=success"], ["the sweep itself failed",
                                                                    "did not measure every point"]),
    ("0", ["torch=failure"], ["torch does not see CUDA"]),
    ("0", ["gpu_tests=failure"], ["a GPU correctness test failed"]),
])
def test_gate_fails_on_every_failed_step_regression_or_refusal(status, steps, errors, capsys):
    argv = ["gate", "--status", status, "--baseline", "store::run"]
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
