"""Peak memory beside time (rlperf/memory.py): written in every summary, kept per sample in the store (old stores and
summaries still read), shown in the report's points table, against num_envs, by phase, in `rlperf compare` and
against a baseline as information that never fails a run. The device's per-phase peaks are checked on a GPU in
tests/test_gpu_memory.py; their attribution to phases is checked here with the allocator's figures scripted."""

from __future__ import annotations

import copy
import json
import math
import sqlite3

import pytest

from command.cli import main
from decisions.rundata import load, point_table
from reference_trainer.config import TrainConfig, validate
from reports.memory import changes, fmt_bytes
from reports.render import render
from rlperf import phases
from rlperf.errors import BadInput
from rlperf.machine import Machine, collect, machine_key
from rlperf.store import APPLICATION_ID, SCHEMA, PointRecord, Store, utc_now
from rlperf.summary import RunSummary

CPU_MACHINE = Machine(torch="2.13.0+cpu", cuda=None, cudnn=None, nccl=None, gpus=[])
MIB = 2 ** 20


@pytest.fixture(scope="module")
def summary() -> dict:
    from reference_trainer.train import train

    return train(validate(TrainConfig(env="synthetic", num_envs=8, horizon=8, minibatch_size=64, hidden_size=8,
                                      update_epochs=1, total_steps=8 * 8 * 3, threads=1)))


def with_memory(summary: dict, num_envs: int, rss_mib: int, device_mib: int | None = None) -> dict:
    out = copy.deepcopy(summary)
    out["config"] = {**out["config"], "num_envs": num_envs}
    device = None if device_mib is None else device_mib * MIB
    out["memory"] = {"host_peak_rss_bytes": rss_mib * MIB, "device_peak_allocated_bytes": device and device // 2,
                     "device_peak_reserved_bytes": device,
                     "phases": None if device is None else {
                         phase: {"device_peak_allocated_bytes": device // share, "device_peak_reserved_bytes": device}
                         for phase, share in (("eval_forward", 4), ("learn", 2))}}
    return out


def add_run(path, summary: dict, memory_of: dict[int, tuple], label: str = "") -> str:
    """A run of one point per num_envs, two repeats each, with the memory `memory_of[num_envs]` gives (RSS MiB,
    device MiB or None); the second repeat 1 MiB above the first."""
    fingerprint = collect(CPU_MACHINE, "h")
    with Store.open(path) as store:
        run_id = store.create_run("smoke", "h", fingerprint, machine_key(fingerprint), label)
        for num_envs, (rss, device) in memory_of.items():
            samples = [(r, with_memory(summary, num_envs, rss + r, device and device + r)) for r in range(2)]
            store.record_point(run_id, PointRecord(json.dumps({"num_envs": num_envs}), samples[0][1]["config"], "ok",
                                                   utc_now(), 1.0, samples=samples))
        store.finish_run(run_id, "complete")
    return run_id


def test_every_writer_records_the_host_peak_and_no_device_figures_on_a_cpu(summary):
    memory = RunSummary.check(json.loads(json.dumps(summary))).memory
    assert memory["host_peak_rss_bytes"] > 50 * MIB  # torch alone holds more than this
    assert memory["device_peak_allocated_bytes"] is None and memory["phases"] is None
    clock = phases.PhaseClock(warmup_epochs=0)
    clock.enter("env")
    clock.exit("env")
    clock.steps(4)
    clock.end_epoch()
    written = clock.summary()
    assert written.memory["host_peak_rss_bytes"] > 0 and written.memory["device_peak_reserved_bytes"] is None


def test_a_summary_without_memory_reads_as_not_measured_and_a_malformed_one_is_refused_naming_it(summary):
    old = {key: value for key, value in summary.items() if key != "memory"}
    assert RunSummary.check(old).memory is None and "memory" not in RunSummary.read(old).to_dict()
    for bad, named in ((5, "must be an object"), ({"host_peak_rss_bytes": -1}, "host_peak_rss_bytes"),
                       ({"host_peak_rss_bytes": 1, "device_peak_reserved_bytes": 1.5}, "device_peak_reserved_bytes"),
                       ({"host_peak_rss_bytes": 1, "phases": {"learn": {"device_peak_allocated_bytes": 1}}},
                        "phases.learn")):
        with pytest.raises(BadInput, match=f"summary: memory: .*{named}"):
            RunSummary.check({**summary, "memory": bad})


def test_each_sample_keeps_its_memory_in_its_own_column(summary, tmp_path):
    path = tmp_path / "results.sqlite"
    run_id = add_run(path, summary, {16: (300, None)})
    raw = sqlite3.connect(path).execute("SELECT memory FROM samples ORDER BY repeat").fetchall()
    assert [json.loads(text)["host_peak_rss_bytes"] for text, in raw] == [300 * MIB, 301 * MIB]
    with Store.open(path, readonly=True) as store:
        assert [m["host_peak_rss_bytes"] for m in store.samples(run_id)["memory"]] == [300 * MIB, 301 * MIB]
        assert list(store.flat_table(run_id)["memory.host_peak_rss_bytes"]) == [300 * MIB, 301 * MIB]


def test_a_store_written_before_the_column_opens_read_only_and_gains_it_when_written(summary, tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript("BEGIN;" + SCHEMA.replace("    memory TEXT,\n", "") +
                     f"PRAGMA application_id = {APPLICATION_ID}; PRAGMA user_version = 1; COMMIT;")
    old = {key: value for key, value in summary.items() if key != "memory"}
    db.execute("INSERT INTO runs VALUES ('r', 'smoke', 'h', ?, NULL, 'complete', '{}', 'k', NULL, NULL, NULL)",
               (utc_now(),))
    db.execute("INSERT INTO points VALUES ('r', '{}', '{}', 'ok', NULL, ?, 1.0)", (utc_now(),))
    db.execute("INSERT INTO samples VALUES ('r', '{}', 0, 1.0, 1.0, 1.0, 1.0, '{}', NULL, ?)", (json.dumps(old),))
    db.commit()
    db.close()
    with Store.open(path, readonly=True) as store:
        assert list(store.samples("r")["memory"]) == [None]
        assert math.isnan(point_table(load(str(path))).loc[0, "host_peak_rss_bytes"])
    run_id = add_run(path, summary, {16: (300, None)})  # opened for writing: gains the column
    with Store.open(path, readonly=True) as store:
        assert list(store.samples("r")["memory"]) == [None]
        assert store.samples(run_id)["memory"][0]["host_peak_rss_bytes"] == 300 * MIB


def test_the_report_shows_each_points_peak_memory_and_a_chart_against_num_envs(summary, tmp_path):
    path = tmp_path / "results.sqlite"
    run_id = add_run(path, summary, {16: (300, None), 64: (420, None)})
    render(load(f"{path}::{run_id}"), str(tmp_path / "report"))
    markdown = (tmp_path / "report" / "report.md").read_text()
    header = next(line for line in markdown.splitlines() if line.startswith("| point | status |"))
    assert "peak RSS" in header and "peak device" not in header  # the largest over repeats:
    assert "| 301 MiB |" in next(line for line in markdown.splitlines() if line.startswith("| num_envs=16 |"))
    assert "| 421 MiB |" in next(line for line in markdown.splitlines() if line.startswith("| num_envs=64 |"))
    html = (tmp_path / "report" / "report.html").read_text()
    assert "Peak host RSS against num_envs" in html


def test_on_cuda_the_report_shows_device_peaks_and_each_phases(summary, tmp_path):
    path = tmp_path / "results.sqlite"
    run_id = add_run(path, summary, {16: (300, 2048), 64: (320, 4096)})
    render(load(f"{path}::{run_id}"), str(tmp_path / "report"))
    markdown = (tmp_path / "report" / "report.md").read_text()
    row = next(line for line in markdown.splitlines() if line.startswith("| num_envs=64 |"))
    assert "| 2.00 GiB / 4.00 GiB |" in row and "| 321 MiB |" in row
    assert "| num_envs=16 | learn | 1.00 GiB | 2.00 GiB |" in markdown
    assert "Peak device memory (reserved) against num_envs" in (tmp_path / "report" / "report.html").read_text()


def test_compare_shows_both_sides_peak_memory_and_the_change(summary, tmp_path, capsys):
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    add_run(a, summary, {16: (300, None)})
    add_run(b, summary, {16: (450, None)})
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    markdown = (tmp_path / "cmp" / "report.md").read_text()
    assert "## Peak memory" in markdown and "| num_envs=16 | 301 MiB | 451 MiB | +49.8% |" in markdown
    printed = capsys.readouterr().out
    assert "peak mem A" in printed and "451 MiB" in printed and "+49.8%" in printed


def test_memory_growth_against_a_baseline_is_shown_and_never_fails_the_run(summary, tmp_path):
    path = tmp_path / "results.sqlite"
    baseline = add_run(path, summary, {16: (300, None)}, label="base")
    candidate = add_run(path, summary, {16: (600, None)}, label="new")
    rows = changes(point_table(load(f"{path}::{baseline}")), point_table(load(f"{path}::{candidate}")))
    assert rows == [{"point": "num_envs=16", "measure": "host_peak_rss_bytes", "baseline_bytes": 301 * MIB,
                     "candidate_bytes": 601 * MIB, "growth": pytest.approx(300 / 301)}]
    code, _, (markdown_path, _) = render(load(f"{path}::{candidate}"), str(tmp_path / "report"),
                                         load(f"{path}::{baseline}"))
    markdown = open(markdown_path).read()
    assert code == 0 and "## Peak memory against the baseline" in markdown
    row = f"| num_envs=16 | host_peak_rss_bytes | {fmt_bytes(301 * MIB)} | {fmt_bytes(601 * MIB)} | +99.7% |"
    assert row in markdown


def test_each_phase_gets_the_allocators_peak_while_it_ran_the_largest_over_its_visits(monkeypatch):
    """The timer's CUDA path with the allocator scripted: each boundary reads the peaks since the last reset and
    charges them to the phase it closes; re-entering the same phase is no boundary."""
    import torch

    from reference_trainer import timing

    scripted = iter([(10, 20), (50, 60), (30, 90), (5, 5)])
    reads, resets = [], []
    monkeypatch.setattr(timing, "device_peaks", lambda device: reads.append(1) or next(scripted))
    monkeypatch.setattr(timing, "reset_device_peaks", lambda device: resets.append(1))
    timer = timing.PhaseTimer(torch.device("cpu"), True, {})
    timer.cuda = timer.reading_peaks = True
    monkeypatch.setattr(timer, "_mark", lambda: 0.0)
    for phase in ("env", "env", "learn", "env", "log"):
        timer.enter(phase)
    timer.close_phase_peaks()  # as end_epoch does
    assert timer.phase_peaks == {"env": [30, 90], "learn": [50, 60], "log": [5, 5]}
    assert len(reads) == len(resets) == 4


def test_only_the_last_warm_up_epoch_reads_the_allocators_peaks(monkeypatch):
    """A read takes tens of microseconds and a step-by-step epoch has hundreds of boundaries: the steady epochs,
    whose time is the figure, read none."""
    import torch

    from reference_trainer import timing

    reads = []
    monkeypatch.setattr(timing, "device_peaks", lambda device: reads.append(timer.epochs_started) or (1, 1))
    monkeypatch.setattr(timing, "reset_device_peaks", lambda device: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    timer = timing.PhaseTimer(torch.device("cpu"), True, {}, warmup_epochs=2)
    timer.cuda = True
    monkeypatch.setattr(timer, "_mark", lambda: 0.0)
    for epoch in range(4):
        timer.start_epoch()
        for phase in ("env", "learn", "log"):
            timer.enter(phase)
        if timer.reading_peaks:  # as end_epoch does
            timer.close_phase_peaks()
    assert set(reads) == {2}  # epochs_started counts the epoch in progress: the second, the last warm-up one
