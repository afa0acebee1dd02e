"""The run summary every trainer writes (rlperf/summary.py): schema 2 written, schema 1 and the stores shipped
under results/ still read, and a summary a trainer has just written refused in one line naming its field."""

from __future__ import annotations

import json
import sqlite3

import pytest

from rlperf.errors import BadInput
from rlperf.machine import REPO_ROOT
from rlperf.store import Store
from rlperf.summary import REQUIRED, SCHEMA, RunSummary

SHIPPED_STORES = sorted(REPO_ROOT.glob("results/**/*.sqlite"))
SHIPPED_SUMMARIES = sorted(path for path in REPO_ROOT.glob("results/**/*.json")
                           if "points" in path.parts or path.parent.name.startswith("part"))


def minimal(**changes) -> dict:
    """What an outside trainer must write, and nothing else."""
    epoch = {"steps": 64, "seconds": 0.5, "warmup": False, "phases": {"env": 0.2, "other": 0.3}}
    return {"schema": 2, "sps": 128.0, "steps": 128, "steady_steps": 64, "steady_seconds": 0.5, "wall_seconds": 2.0,
            "phases": {"env": 0.2, "other": 0.3}, "epochs": [{**epoch, "warmup": True}, epoch], **changes}


def test_every_summary_shipped_in_the_stores_under_results_reads_with_its_figures():
    assert SHIPPED_STORES, "results/ ships stores"
    read = 0
    for path in SHIPPED_STORES:
        with Store.open(path, readonly=True) as store:
            for run_id in store.runs()["run_id"]:
                samples = store.samples(run_id)
                for row in samples.itertuples():
                    summary = row.summary
                    assert isinstance(summary, RunSummary) and summary.schema == 1 and summary.writer == "reference"
                    assert summary.sps == row.sps and summary.phases == row.phases and summary.steady_steps > 0
                    read += 1
    raw = sum(sqlite3.connect(f"file:{p}?mode=ro", uri=True).execute("SELECT COUNT(*) FROM samples").fetchone()[0]
              for p in SHIPPED_STORES)
    assert read == raw > 0


def test_a_schema_1_summary_read_and_written_again_keeps_every_key_it_had():
    for path in SHIPPED_SUMMARIES:
        data = json.loads(path.read_text())
        if "schema" not in data:
            continue  # a profile's or a study's own JSON, not a run summary
        again = RunSummary.read(data).to_dict()
        assert {key: again[key] for key in data} == data, path


def test_the_reference_trainer_writes_schema_2_with_its_own_fields(tmp_path):
    from reference_trainer.config import TrainConfig, validate
    from reference_trainer.train import train

    written = train(validate(TrainConfig(env="synthetic", num_envs=8, horizon=8, minibatch_size=64, hidden_size=8,
                                         update_epochs=1, total_steps=8 * 8 * 3, threads=1)))
    summary = RunSummary.check(json.loads(json.dumps(written)))
    assert summary.schema == SCHEMA == 2 and summary.writer == "reference"
    assert summary.work and summary.parameters > 0 and summary.h2d_bytes_per_step > 0 and summary.config["num_envs"] == 8


def test_an_outside_trainer_needs_only_the_required_fields_and_the_rest_reads_as_not_known():
    summary = RunSummary.check(minimal())
    assert summary.work is None and summary.env_overlap is None and summary.parameters is None
    assert summary.config == {} and summary.world_size == 1 and summary.named_seconds == pytest.approx(0.2)
    assert "work" in summary.to_dict() and "attached" not in summary.to_dict()


@pytest.mark.parametrize("field", REQUIRED)
def test_a_summary_lacking_a_required_field_is_refused_in_one_line_naming_it(field):
    data = minimal()
    del data[field]
    with pytest.raises(BadInput, match=f"summary: {field} is missing") as refused:
        RunSummary.check(data)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("changes, named", [
    ({"schema": 3}, "schema 3"), ({"sps": "fast"}, "sps must be a number"), ({"steps": -1}, "steps must be"),
    ({"phases": {"env": "long"}}, "phases must map"), ({"epochs": []}, "epochs must be"),
    ({"epochs": [{"steps": 1}]}, r"epochs\[0\] lacks seconds"), ({"writer": "mine"}, "writer 'mine'"),
])
def test_a_summary_with_a_field_of_the_wrong_kind_is_refused_naming_it(changes, named):
    with pytest.raises(BadInput, match=named):
        RunSummary.check(minimal(**changes))
