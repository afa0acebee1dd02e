import time

import pynvml
import pytest
import torch

from profilers.sampler import GPU_METRICS, UtilizationSampler
from rlperf.errors import BadInput
from rlperf.machine import cuda_uuid


def _no_nvml(monkeypatch):
    def fail_init():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", fail_init)


def test_without_nvml_cpu_series_go_on_and_reason_is_recorded(monkeypatch):
    _no_nvml(monkeypatch)
    sampler = UtilizationSampler(0.02)
    started = time.monotonic()
    sampler.start()
    # Wait for the ticks rather than a fixed time: a busy machine may wake the thread late, never early.
    deadline = started + 60
    while sampler.ticks < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    rows = sampler.stop()
    elapsed = time.monotonic() - started
    assert sampler.unavailable == "gpu: NVML unavailable (NVML Shared Library Not Found)"
    assert {source for _, source, _, _ in rows} == {"cpu"}
    assert {metric for _, _, metric, _ in rows} == {"cpu_util_percent", "ram_used_bytes"}
    # one tick at start, one per 20 ms after it (late ones are skipped, never doubled), one at stop
    assert 10 <= sampler.ticks <= elapsed / 0.02 + 2, (sampler.ticks, elapsed)
    times = [t for t, _, metric, _ in rows if metric == "cpu_util_percent"]
    assert times == sorted(times)
    assert abs(time.time_ns() - times[-1]) < 1e9
    assert all(0.0 <= v <= 100.0 for _, _, m, v in rows if m == "cpu_util_percent")
    assert all(v > 0 for _, _, m, v in rows if m == "ram_used_bytes")


def test_cpu_only_run_never_opens_nvml(monkeypatch):
    def must_not_init():
        raise AssertionError("NVML opened for a CPU-only run")

    monkeypatch.setattr(pynvml, "nvmlInit", must_not_init)
    with UtilizationSampler(0.05, gpu_uuids=[]) as sampler:
        time.sleep(0.06)
    assert sampler.unavailable == "gpu: the run uses no GPU"
    assert sampler.ticks >= 2


@pytest.mark.parametrize("interval", [0, -1, "fast", True, float("nan")])
def test_bad_interval_is_bad_input(interval):
    with pytest.raises(BadInput, match="sample interval: must be a positive number of seconds"):
        UtilizationSampler(interval)


def test_stop_without_start_returns_nothing():
    assert UtilizationSampler(0.1).stop() == []


class FakeNvml:
    """Two devices behind NVML's function names, in NVML's (PCI bus) order, so the UUID lookup and the
    unsupported-metric path run on machines without a GPU. The real library is exercised by the GPU test
    below."""

    uuids = ["GPU-aaaa-0000", "GPU-bbbb-1111"]

    def handle_by_uuid(self, uuid):
        if uuid not in self.uuids:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return self.uuids.index(uuid)

    def install(self, monkeypatch):
        class Rates:
            gpu, memory = 87, 31

        class Memory:
            used = 123 << 20

        def not_supported(*_):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

        calls = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlDeviceGetCount": lambda: 2,
            "nvmlDeviceGetHandleByIndex": lambda i: i,
            "nvmlDeviceGetHandleByUUID": self.handle_by_uuid,
            "nvmlDeviceGetUUID": lambda h: self.uuids[h],
            "nvmlDeviceGetUtilizationRates": lambda h: Rates,
            "nvmlDeviceGetMemoryInfo": lambda h: Memory,
            "nvmlDeviceGetPowerUsage": lambda h: 250_000,
            "nvmlDeviceGetTotalEnergyConsumption": lambda h: 5_000_000 + time.monotonic_ns() // 1_000_000,
            "nvmlDeviceGetClockInfo": lambda h, kind: 1980 if kind == pynvml.NVML_CLOCK_SM else 2619,
            "nvmlDeviceGetTemperature": lambda h, kind: 54,
            "nvmlDeviceGetPcieThroughput": not_supported,
            "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 0x4,
        }
        for name, fn in calls.items():
            monkeypatch.setattr(pynvml, name, fn)


@pytest.mark.parametrize("cuda_visible_devices", [None, "0", "MIG-1a2b3c4d-0000-1111-2222-333344445555,1"])
def test_the_runs_gpu_is_found_by_its_uuid_whatever_cuda_numbered_it(monkeypatch, cuda_visible_devices):
    # On a box with two GPU models CUDA numbers the faster one 0 and NVML the one first on the PCI bus: the
    # run's GPU is NVML's second, whatever CUDA_VISIBLE_DEVICES says (a MIG entry included).
    FakeNvml().install(monkeypatch)
    if cuda_visible_devices is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", cuda_visible_devices)
    with UtilizationSampler(0.05, gpu_uuids=["GPU-bbbb-1111"]) as sampler:
        time.sleep(0.05)
    rows = sampler.stop()
    assert sampler.unavailable is None
    sources = {source for _, source, _, _ in rows}
    assert sources == {"gpu:GPU-bbbb-1111", "cpu"}
    by_metric = {metric: value for _, source, metric, value in rows if source != "cpu"}
    assert by_metric["gpu_util_percent"] == 87
    assert by_metric["mem_used_bytes"] == 123 << 20
    assert by_metric["power_w"] == 250.0
    assert by_metric["energy_j"] > 5000
    assert by_metric["sm_clock_mhz"] == 1980 and by_metric["mem_clock_mhz"] == 2619
    assert by_metric["clock_event_reasons"] == 4
    assert "pcie_rx_kb_per_s" not in by_metric
    assert sampler.unsupported == {
        "gpu:GPU-bbbb-1111 pcie_rx_kb_per_s": "Not Supported",
        "gpu:GPU-bbbb-1111 pcie_tx_kb_per_s": "Not Supported",
    }


def test_without_named_gpus_every_gpu_nvml_sees_is_sampled(monkeypatch):
    FakeNvml().install(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # NVML ignores it, and so does a sampler told no GPU
    with UtilizationSampler(0.05) as sampler:
        time.sleep(0.05)
    assert {source for _, source, _, _ in sampler.stop()} == {"gpu:GPU-aaaa-0000", "gpu:GPU-bbbb-1111", "cpu"}


def test_named_uuid_missing_from_nvml_is_reported(monkeypatch):
    FakeNvml().install(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    sampler = UtilizationSampler(0.05, gpu_uuids=["GPU-aaaa-0000", "GPU-zzzz"])
    sampler.start()
    rows = sampler.stop()
    assert sampler.unavailable == "gpu: NVML does not see GPU-zzzz"
    assert {source for _, source, _, _ in rows} == {"gpu:GPU-aaaa-0000", "cpu"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA and NVML")
def test_real_nvml_sees_the_current_device():
    uuid = cuda_uuid(torch.cuda.current_device())
    with UtilizationSampler(0.05, gpu_uuids=[uuid]) as sampler:
        x = torch.randn(4096, 4096, device="cuda")
        for _ in range(50):
            x = x @ x
            x = x / x.norm()
        torch.cuda.synchronize()
    rows = sampler.stop()
    assert sampler.unavailable is None
    metrics = {metric for _, source, metric, _ in rows if source == f"gpu:{uuid}"}
    assert {"gpu_util_percent", "mem_used_bytes", "sm_clock_mhz"} <= metrics
    assert metrics <= set(GPU_METRICS)
