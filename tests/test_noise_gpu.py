"""studies/noise.py on a GPU: pairs at an eager and a graphed point, each process stored with the NVML readings
the harness took around it, and each process's SM clock, clock-event reasons and temperature in its JSON."""

from __future__ import annotations

import pytest
import torch

from decisions.rundata import load_run
from reports.render import gpu_clocks_section
from rlperf.store import Store
from studies import noise

GPU = "gpu:GPU-1"


def test_a_process_s_gpu_readings_are_its_own_repeat_s():
    rows = [(0, 1, GPU, "sm_clock_mhz", 1980.0), (0, 1, GPU, "clock_event_reasons", 0.0),
            (0, 1, GPU, "temperature_c", 35.0), (0, 2, GPU, "sm_clock_mhz", 1410.0),
            (0, 2, GPU, "clock_event_reasons", 1.0), (0, 2, GPU, "temperature_c", 37.0),
            (1, 3, GPU, "sm_clock_mhz", 345.0), (1, 3, GPU, "clock_event_reasons", 4.0),
            (0, 2, "cpu", "cpu_util_percent", 99.0)]
    assert noise.gpu_readings(rows, 0) == {"sm_clock_mhz": {"mean": 1695.0, "min": 1410.0, "max": 1980.0},
                                           "clock_events": {"idle": 0.5}, "temperature_c": {"mean": 36.0, "max": 37.0}}
    assert noise.gpu_readings(rows, 1)["clock_events"] == {"power cap": 1.0}
    assert noise.gpu_readings(rows, 2) == {"nvml": "no readings"}


def test_a_study_out_of_seconds_stores_the_rounds_it_finished(tmp_path, monkeypatch, capsys):
    # the GPU study's loop at CPU sizes: with no seconds to spare, the first round is the last
    monkeypatch.setattr(noise, "GPU_POINT", {"env": "synthetic", "hidden_size": 16, "num_envs": 16, "horizon": 8,
                                             "minibatch_size": 64, "total_steps": 16 * 8 * 3, "warmup_epochs": 1})
    monkeypatch.setattr(noise, "GPU_LEVERS", {"one thread": {"threads": 1}, "two threads": {"threads": 2}})
    report = noise.measure_gpu(3, tmp_path, "cpu", seconds=0)
    assert "stopped after 1 round: another would end past --seconds 0" in capsys.readouterr().out
    assert [len(lever["processes"]) for lever in report["levers"].values()] == [2, 2]
    with Store.open(tmp_path / "results.sqlite", readonly=True) as store:
        assert len(load_run(store, report["run"]).samples) == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_pairs_are_stored_with_each_process_s_clock(tmp_path, monkeypatch):
    monkeypatch.setitem(noise.GPU_POINT, "total_steps", 4 * 4096 * 64)  # two warm-up and two steady epochs
    report = noise.measure_gpu(2, tmp_path, "cuda")
    for lever in ("eager", "graphs"):
        processes = report["levers"][lever]["processes"]
        assert len(processes) == 4 and all(p["sps"] > 0 for p in processes)
        assert all(0 < p["sm_clock_mhz"]["min"] <= p["sm_clock_mhz"]["max"] for p in processes)
        assert all(p["temperature_c"]["max"] > 0 for p in processes)
        assert report["levers"][lever]["pair_log_sd"] >= 0
    with Store.open(tmp_path / "results.sqlite", readonly=True) as store:
        table = gpu_clocks_section(load_run(store, report["run"])).tables[0]
    assert len(table) == 8 and table["SM clock, MHz (mean, min–max)"].str.contains("–").all()
