"""The report shows, per repeat on a GPU, the SM clock, the clock-event reasons and the temperature NVML read
beside the repeat's SPS (profilers/sampler.py samples them; the store keeps them per repeat)."""

from __future__ import annotations

from decisions.rundata import load_run
from reports.render import gpu_clocks_section
from rlperf.store import PointRecord, Store

GPU = "gpu:GPU-72afe7aa-2a11-ec75-c9b6-c4fc6a41ab11"


def readings(repeat: int, clocks: list[float], reasons: list[int], temperatures: list[float]) -> list[tuple]:
    rows = []
    for tick, (clock, reason, temperature) in enumerate(zip(clocks, reasons, temperatures)):
        t_ns = (repeat * 100 + tick) * 10**8
        rows += [(repeat, t_ns, GPU, "sm_clock_mhz", clock), (repeat, t_ns, GPU, "clock_event_reasons", reason),
                 (repeat, t_ns, GPU, "temperature_c", temperature), (repeat, t_ns, GPU, "gpu_util_percent", 5.0),
                 (repeat, t_ns, "cpu", "cpu_util_percent", 50.0)]
    return rows


def test_each_repeat_shows_its_clock_its_clock_events_and_its_temperature(tmp_path):
    with Store.open(tmp_path / "results.sqlite") as store:
        run_id = store.create_run("one", "hash", {}, "m1")
        record = PointRecord('{"num_envs":4096}', {"num_envs": 4096}, "ok", "now", 30.0)
        record.samples = [(0, {"sps": 442_149.0}), (1, {"sps": 383_000.0})]
        record.utilization = readings(0, [1980, 1980, 1410, 1980], [0, 0, 0x1, 0], [34, 35, 35, 35]) + \
            readings(1, [1200, 1100, 345, 1300], [0x4, 0x4 | 0x20, 0x1, 0x4], [70, 82, 83, 84])
        store.record_point(run_id, record)
        store.finish_run(run_id, "complete")
        run = load_run(store, run_id)
    section = gpu_clocks_section(run)
    table = section.tables[0]
    assert list(table["repeat"]) == [0, 1] and list(table["SPS"]) == ["442,149", "383,000"]
    assert list(table["SM clock, MHz (mean, min–max)"]) == ["1,838 (1,410–1,980)", "986 (345–1,300)"]
    assert list(table["clock events (share of samples)"]) == ["idle 25%", "idle 25%, power cap 75%, software thermal 25%"]
    assert list(table["temperature, °C (mean / max)"]) == ["35 / 35", "80 / 84"]
    assert "GPU" not in table.columns  # one GPU: no column naming it


def test_a_run_without_gpu_readings_has_no_clock_section(tmp_path):
    with Store.open(tmp_path / "results.sqlite") as store:
        run_id = store.create_run("one", "hash", {}, "m1")
        record = PointRecord("{}", {}, "ok", "now", 3.0)
        record.samples = [(0, {"sps": 10_000.0})]
        record.utilization = [(0, 1, "cpu", "cpu_util_percent", 90.0)]
        store.record_point(run_id, record)
        run = load_run(store, run_id)
    assert gpu_clocks_section(run) is None
