"""Verdicts on real trainer runs: two runs of the same code report no regression, and a run with a delay
injected into one phase is flagged with that phase named.

The three runs' repeats are interleaved (baseline, same, delayed, baseline, ...) so that whatever else the
machine is doing lands on all three alike, as a nightly job's drift would not."""

import json
import platform
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from rlperf.forkserver import ForkServer
from rlperf.machine import cpu_model, machine_key
from benches.runner import trainer_command
from rlperf.store import PointRecord, Store, utc_now
from reference_trainer.config import TrainConfig

pytestmark = pytest.mark.slow

REPEATS = 7  # a side: at 99%, 5 against 5 decide only when completely apart; 7 leave room for a busy machine
POINT = {"env": "synthetic", "num_envs": 16, "horizon": 16, "minibatch_size": 128, "update_epochs": 1,
         "hidden_size": 32, "total_steps": 16 * 16 * 12, "warmup_epochs": 1, "threads": 1, "device": "cpu"}
DELAYED_PHASE = "learn"


def train(server: ForkServer, config: dict, summary_path: Path) -> dict:
    """One trainer process, forked from a warm interpreter as the harness starts its repeats: the 21 processes
    spend their time training, not importing torch."""
    log = summary_path.with_suffix(".log")
    returncode = server.start(trainer_command(config, summary_path), log).wait(timeout=120)
    assert returncode == 0, log.read_text()
    return json.loads(summary_path.read_text())


def fingerprint(summary: dict) -> dict:
    return {"git": {"commit": "test", "dirty": False}, "python": platform.python_version(),
            "torch": summary["versions"]["torch"], "cuda": None, "gpus": [], "cuda_devices": [],
            "cpu": {"model": cpu_model(), "cores_logical": psutil.cpu_count(),
                    "cores_physical": psutil.cpu_count(logical=False)},
            "hostname": platform.node(), "thread_env": {}, "suite_hash": "regression-test"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store with three runs of one point: `baseline`, `same` (identical) and `delayed`."""
    directory = tmp_path_factory.mktemp("regression")
    config = {**TrainConfig().to_dict(), **POINT}
    summaries = {"baseline": [], "same": [], "delayed": []}
    delay_ms = None
    server = ForkServer(None)
    try:
        assert server.refused is None, server.refused
        for repeat in range(REPEATS):
            for name in summaries:
                point_config = config
                if name == "delayed":
                    # Two epochs' length (taken from the first baseline repeat) makes the point about three times
                    # slower: decisive even beside a CPU hog, where a third of an epoch drowned in the noise.
                    if delay_ms is None:
                        epochs = [e["seconds"] for e in summaries["baseline"][0]["epochs"] if not e["warmup"]]
                        delay_ms = round(1000 * 2 * sorted(epochs)[len(epochs) // 2], 1)
                    point_config = {**config, "inject_delay": {DELAYED_PHASE: delay_ms}}
                summaries[name].append(train(server, point_config, directory / f"{name}-{repeat}.json"))
    finally:
        server.close()
    path = directory / "results.sqlite"
    run_ids = {}
    with Store.open(path) as db:
        print_ = fingerprint(summaries["baseline"][0])
        for name, samples in summaries.items():
            run_id = db.create_run("regression", "regression-test", print_, machine_key(print_), label=name)
            db.record_point(run_id, PointRecord(
                point_key=json.dumps({"num_envs": 16}), config=samples[0]["config"], status="ok",
                started_at=utc_now(), seconds=sum(s["wall_seconds"] for s in samples),
                samples=list(enumerate(samples))))
            db.finish_run(run_id, "complete")
            run_ids[name] = run_id
    return path, run_ids


def report(store_path, candidate: str, baseline: str, out) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlperf", "report", f"{store_path}::{candidate}",
                           "--baseline", f"{store_path}::{baseline}", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)


def verdict_row(markdown: str) -> str:
    return next(line for line in markdown.splitlines() if line.startswith("| num_envs=16 |"))


def test_two_runs_of_the_same_code_do_not_regress(store, tmp_path):
    """Unchanged when the machine was quiet enough to show it; inconclusive, never a claim, when it was not."""
    path, runs = store
    result = report(path, runs["same"], runs["baseline"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    row = verdict_row((tmp_path / "report.md").read_text())
    assert "| unchanged |" in row or "| inconclusive |" in row, row


def test_injected_delay_is_flagged_and_its_phase_named(store, tmp_path):
    path, runs = store
    result = report(path, runs["delayed"], runs["baseline"], tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    row = verdict_row((tmp_path / "report.md").read_text())
    assert "| regressed |" in row
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    phases_that_grew = cells[8]
    assert phases_that_grew.startswith(DELAYED_PHASE + " +"), row
    assert DELAYED_PHASE in result.stdout
