"""The results store: written per point in one transaction, read back as DataFrames, exported for pandas."""

from __future__ import annotations

import json
import sqlite3

import pandas as pd
import pytest

from rlperf.machine import Machine, collect, machine_key
from rlperf.store import PointRecord, Store, open_results
from rlperf.errors import BadInput

CPU_MACHINE = Machine(torch="2.13.0+cpu", cuda=None, cudnn=None, nccl=None, gpus=[])


def summary(sps: float, repeat: int) -> dict:
    return {"schema": 1, "sps": sps, "sps_end_to_end": sps * 0.8, "warmup_seconds": 1.5, "wall_seconds": 4.0 + repeat,
            "steady_seconds": 2.0, "phases": {"env": 0.5, "learn": 1.0}, "mean_episode_return": None,
            "config": {"num_envs": 8}}


def record(key: str, status: str = "ok", sps=(100.0, 110.0)) -> PointRecord:
    return PointRecord(point_key=key, config={"num_envs": 8, "inject_delay": {}}, status=status,
                       started_at="2026-01-01T00:00:00+00:00", seconds=3.0,
                       reason=None if status == "ok" else "exit code 1\nboom",
                       samples=[(r, summary(s, r)) for r, s in enumerate(sps)] if status == "ok" else [],
                       utilization=[(0, 1_700_000_000_000_000_000, "cpu", "cpu_util_percent", 50.0)])


@pytest.fixture
def store_with_run(tmp_path):
    fingerprint = collect(CPU_MACHINE, "abc")
    store = Store.open(tmp_path / "results.sqlite")
    run_id = store.create_run("smoke", "abc", fingerprint, machine_key(fingerprint), label="baseline")
    store.record_point(run_id, record('{"num_envs":8}'))
    store.record_point(run_id, record('{"num_envs":16}', status="failed"))
    yield store, run_id
    store.close()


def test_points_samples_and_utilization_read_back_as_frames(store_with_run):
    store, run_id = store_with_run
    runs = store.runs()
    assert list(runs["run_id"]) == [run_id] and runs.loc[0, "status"] == "running" and runs.loc[0, "label"] == "baseline"
    points = store.points(run_id)
    assert list(points["status"]) == ["ok", "failed"]
    assert points.loc[0, "config"] == {"num_envs": 8, "inject_delay": {}}
    samples = store.samples(run_id)
    assert list(samples["sps"]) == [100.0, 110.0] and list(samples["repeat"]) == [0, 1]
    assert samples.loc[0, "phases"] == {"env": 0.5, "learn": 1.0} and samples.loc[1, "summary"].wall_seconds == 5.0
    assert len(store.utilization(run_id)) == 2
    assert store.finished_point_keys(run_id) == {'{"num_envs":8}', '{"num_envs":16}'}
    store.finish_run(run_id, "complete")
    assert store.runs().loc[0, "finished_at"] is not None


def test_fingerprint_records_code_machine_and_thread_settings(store_with_run):
    store, run_id = store_with_run
    fingerprint = store.fingerprint(run_id)
    assert len(fingerprint["git"]["commit"]) == 40 and isinstance(fingerprint["git"]["dirty"], bool)
    assert fingerprint["torch"] == "2.13.0+cpu" and fingerprint["python"].count(".") == 2
    assert fingerprint["cpu"]["cores_logical"] >= 1 and fingerprint["cpu"]["model"]
    assert "OMP_NUM_THREADS" in fingerprint["thread_env"] and fingerprint["suite_hash"] == "abc"
    # on a machine without NVML this says why; with it, every GPU has its clocks and power limit
    gpus = fingerprint["gpus"]
    assert gpus.startswith("unavailable: ") if isinstance(gpus, str) else all("power_limit_w" in g for g in gpus)
    newer_torch = {**fingerprint, "torch": "2.14.0"}
    assert machine_key(newer_torch) != machine_key(fingerprint) == machine_key(json.loads(json.dumps(fingerprint)))


def test_a_point_is_written_whole_or_not_at_all(store_with_run):
    store, run_id = store_with_run
    broken = record('{"num_envs":32}')
    broken.samples.append(broken.samples[0])  # a repeated sample key fails inside the transaction
    with pytest.raises(sqlite3.IntegrityError):
        store.record_point(run_id, broken)
    assert '{"num_envs":32}' not in store.finished_point_keys(run_id)
    assert store.row_counts()["samples"] == 2


def test_resume_finds_the_newest_unfinished_run_of_the_same_suite_and_machine(store_with_run):
    store, run_id = store_with_run
    assert store.resumable_run("smoke", "abc", store.runs().loc[0, "machine_key"]) == run_id
    assert store.resumable_run("smoke", "other-hash", store.runs().loc[0, "machine_key"]) is None
    assert store.resumable_run("smoke", "abc", "another-machine") is None
    store.finish_run(run_id, "complete")
    assert store.resumable_run("smoke", "abc", store.runs().loc[0, "machine_key"]) is None


@pytest.mark.parametrize("extension", [".csv", ".parquet", ".json"])
def test_export_writes_one_flat_row_per_sample(store_with_run, tmp_path, extension):
    store, run_id = store_with_run
    path = store.export(run_id, tmp_path / f"samples{extension}")
    frame = {".csv": pd.read_csv, ".parquet": pd.read_parquet, ".json": pd.read_json}[extension](path)
    assert len(frame) == 3  # two samples of the ok point, one row for the failed point
    assert list(frame["sps"].iloc[:2]) == [100.0, 110.0] and pd.isna(frame["sps"].iloc[2])
    assert list(frame["phase.learn"].iloc[:2]) == [1.0, 1.0]
    assert list(frame["config.num_envs"]) == [8, 8, 8]
    assert list(frame["status"]) == ["ok", "ok", "failed"]


def test_export_refuses_an_unknown_extension(store_with_run, tmp_path):
    store, run_id = store_with_run
    with pytest.raises(BadInput, match=r"export: .*samples\.xlsx has an unknown extension \(allowed: .csv, .parquet"):
        store.export(run_id, tmp_path / "samples.xlsx")


def test_readers_open_by_path_and_run_id(store_with_run):
    store, run_id = store_with_run
    reader, chosen = open_results(str(store.path))
    assert chosen == run_id == reader.latest_run("smoke")
    with pytest.raises(BadInput, match=r"run: no run 'nope' in .*results\.sqlite \(newest: "):
        open_results(f"{store.path}::nope")
    with pytest.raises(BadInput, match=r"has no runs of suite 'nightly' yet"):
        reader.latest_run("nightly")
    reader.close()


@pytest.mark.parametrize("content, why", [
    (None, "no such file"),
    (b"not a database at all, just some text that is long enough to have a header" * 20, "file is not a database"),
    ("other-sqlite", "a SQLite file that rlperf did not write"),
])
def test_something_else_is_not_mistaken_for_a_store(tmp_path, content, why):
    path = tmp_path / "results.sqlite"
    if content == "other-sqlite":
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE t (x)")
        db.close()
    elif content is not None:
        path.write_bytes(content)
    before = path.read_bytes() if path.exists() else None
    for readonly in (True, False) if path.exists() else (True,):
        with pytest.raises(BadInput, match=rf"store: .*results\.sqlite is not an rlperf results store \({why}\)"):
            Store.open(path, readonly=readonly)
    assert (path.read_bytes() if path.exists() else None) == before
