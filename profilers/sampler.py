"""Background sampling of GPU (NVML) and host (psutil) utilization while a run executes.

The sampler lives in the process that launches the trainer, so it never competes with the trainer for the
GIL. Every reading is one row `(t_unix_ns, source, metric, value)`: `source` is `gpu:<uuid>` or `cpu`.
Without NVML or without a GPU the CPU series are still sampled and `unavailable` says why the GPU ones are
missing; a metric a device does not support is left out and listed in `unsupported`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psutil
import pynvml

from rlperf.errors import BadInput

Row = tuple[int, str, str, float]


def _clock_event_reasons(handle) -> int:
    try:
        return pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    except pynvml.NVMLError_FunctionNotFound:
        # drivers before the rename only know the older name of the same bitmask
        return pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)


# Units are kept as NVML reports them (PCIe in KB/s over its 20 ms window), except energy, which NVML
# gives in mJ since the driver loaded and is stored in J so summaries read naturally.
GPU_METRICS: dict[str, Callable[[object], float]] = {
    "gpu_util_percent": lambda h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
    "mem_util_percent": lambda h: pynvml.nvmlDeviceGetUtilizationRates(h).memory,
    "mem_used_bytes": lambda h: pynvml.nvmlDeviceGetMemoryInfo(h).used,
    "power_w": lambda h: pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
    "energy_j": lambda h: pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0,
    "sm_clock_mhz": lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
    "mem_clock_mhz": lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
    "temperature_c": lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
    "pcie_rx_kb_per_s": lambda h: pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES),
    "pcie_tx_kb_per_s": lambda h: pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES),
    "clock_event_reasons": _clock_event_reasons,
}
CPU_METRICS = ("cpu_util_percent", "ram_used_bytes")
# The bits of `clock_event_reasons` (NVML's nvmlClocksEventReason*): why the SM clock was below its maximum.
CLOCK_EVENT_REASONS = {
    0x1: "idle", 0x2: "application clocks", 0x4: "power cap", 0x8: "hardware slowdown", 0x10: "sync boost",
    0x20: "software thermal", 0x40: "hardware thermal", 0x80: "power brake", 0x100: "display clocks",
}


class UtilizationSampler:
    """Samples every `interval_s` seconds on a daemon thread between `start()` and `stop()`.

    `gpu_uuids` names the devices the run uses (an empty list: a CPU-only run), each looked up in NVML by
    its UUID: NVML numbers devices by PCI bus and ignores CUDA_VISIBLE_DEVICES, and CUDA numbers them
    fastest first by default, so no index maps one onto the other. `None` samples every GPU NVML sees, for
    callers that do not know the run's. Ticks keep to a fixed schedule; a tick that overruns (NVML's PCIe
    reading blocks for 20 ms per direction and device) makes the next ones skip rather than drift.
    """

    def __init__(self, interval_s: float, gpu_uuids: list[str] | None = None):
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not interval_s > 0:
            raise BadInput(f"sample interval: must be a positive number of seconds (got {interval_s!r})")
        self.interval_s = float(interval_s)
        self.gpu_uuids = None if gpu_uuids is None else list(gpu_uuids)
        self.unavailable: str | None = None
        self.unsupported: dict[str, str] = {}
        self.ticks = 0
        self._devices: list[tuple[str, object]] = []
        self._metrics: dict[str, dict[str, Callable[[object], float]]] = {}
        self._rows: list[Row] = []
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml_open = False

    def __enter__(self) -> UtilizationSampler:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        self._open_gpus()
        psutil.cpu_percent(interval=None)  # the first call only sets the reference point
        self._thread = threading.Thread(target=self._loop, name="utilization-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> list[Row]:
        """Stops sampling (after one last tick) and returns every row taken, oldest first; calling it
        again returns the same rows."""
        if self._thread is None:
            return list(self._rows)
        self._stopping.set()
        self._thread.join()
        self._thread = None
        if self._nvml_open:
            pynvml.nvmlShutdown()
            self._nvml_open = False
        return list(self._rows)

    def _open_gpus(self) -> None:
        if self.gpu_uuids == []:
            self.unavailable = "gpu: the run uses no GPU"
            return
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            self.unavailable = f"gpu: NVML unavailable ({exc})"
            return
        self._nvml_open = True
        try:
            if self.gpu_uuids is None:
                handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
                self._devices = [(f"gpu:{pynvml.nvmlDeviceGetUUID(handle)}", handle) for handle in handles]
        except pynvml.NVMLError as exc:
            self.unavailable = f"gpu: NVML could not list devices ({exc})"
            return
        missing = []
        for uuid in self.gpu_uuids or ():
            try:
                self._devices.append((f"gpu:{uuid}", pynvml.nvmlDeviceGetHandleByUUID(uuid)))
            except pynvml.NVMLError:
                missing.append(uuid)
        if missing:
            self.unavailable = f"gpu: NVML does not see {', '.join(missing)}"
        if not self._devices and self.unavailable is None:
            self.unavailable = "gpu: no GPU visible to NVML"
        for source, handle in self._devices:
            self._metrics[source] = self._supported_metrics(source, handle)

    def _supported_metrics(self, source: str, handle) -> dict[str, Callable[[object], float]]:
        supported = {}
        for metric, read in GPU_METRICS.items():
            try:
                read(handle)
            except pynvml.NVMLError as exc:
                self.unsupported[f"{source} {metric}"] = str(exc)
            else:
                supported[metric] = read
        return supported

    def _loop(self) -> None:
        next_tick = time.monotonic()
        while True:
            self._sample_once()
            if self._stopping.is_set():
                return
            next_tick += self.interval_s
            now = time.monotonic()
            if now > next_tick:
                next_tick += (now - next_tick) // self.interval_s * self.interval_s + self.interval_s
            self._stopping.wait(next_tick - now)

    def _sample_once(self) -> None:
        self.ticks += 1
        rows = self._rows
        for source, handle in self._devices:
            t_ns = time.time_ns()
            for metric, read in self._metrics[source].items():
                try:
                    rows.append((t_ns, source, metric, float(read(handle))))
                except pynvml.NVMLError as exc:
                    self.unsupported.setdefault(f"{source} {metric}", f"failed mid-run ({exc})")
        t_ns = time.time_ns()
        rows.append((t_ns, "cpu", "cpu_util_percent", psutil.cpu_percent(interval=None)))
        rows.append((t_ns, "cpu", "ram_used_bytes", float(psutil.virtual_memory().used)))
