"""Was the machine quiet while one repeat ran? The trainer's own CPU time against everything else's.

A figure is only as good as the quiet around it. On a 2-core machine a neighbour that takes one core makes
the trainer's OpenMP threads spin against it, and the trainer runs many times slower with nothing in its
own figures saying why. So every repeat is bracketed by the kernel's accounts:

- the trainer's CPU seconds (the harness's waited-for children, so ranks it started count too), against its
  wall time and the cores it was given;
- the machine's busy CPU seconds, less the trainer's and the harness's own: what other processes used;
- steal time (a hypervisor giving the virtual CPUs to another guest) and the load average;
- on GPUs, compute processes of other programs on the run's devices, and clock-event reasons other than
  idling (power or thermal capping, hardware slowdown) seen by the utilization sampler.

A repeat is `contended` when others used more than OTHERS_CORES_LIMIT cores on average, steal took more than
STEAL_SHARE_LIMIT of the CPUs, or another program computed on the GPU; verdicts leave such repeats out.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any

import psutil

from rlperf.cpus import usable_cores

# Measured on an idle 2-core machine, other processes use a few hundredths of a core (the harness's
# sampler, the system's own daemons); a fifth of a core on average is a real neighbour.
OTHERS_CORES_LIMIT = 0.2
STEAL_SHARE_LIMIT = 0.05
# NVML clock-event reasons that are not interference: the GPU idling, or an application clock setting.
BENIGN_CLOCK_REASONS = 0x1 | 0x2


def busy_seconds(times) -> float:
    return times.user + times.nice + times.system + getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0)


def cpu_seconds(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


class InterferenceMonitor:
    """Brackets one child process: `start()` before it is spawned, `stop()` after it has been waited for."""

    def __init__(self, gpu_uuids: list[str] | None = None):
        self.gpu_uuids = gpu_uuids or []

    def start(self) -> None:
        self._wall = time.monotonic()
        self._machine = psutil.cpu_times()
        self._children = cpu_seconds(resource.getrusage(resource.RUSAGE_CHILDREN))
        self._self = cpu_seconds(resource.getrusage(resource.RUSAGE_SELF))
        self._gpu_others_at_start = gpu_compute_processes(self.gpu_uuids)

    def stop(self, utilization_rows: list[tuple] = ()) -> dict[str, Any]:
        """The repeat's account; `utilization_rows` are the sampler's (t_ns, source, metric, value) rows."""
        wall = max(time.monotonic() - self._wall, 1e-9)
        machine = psutil.cpu_times()
        trainer = cpu_seconds(resource.getrusage(resource.RUSAGE_CHILDREN)) - self._children
        harness = cpu_seconds(resource.getrusage(resource.RUSAGE_SELF)) - self._self
        busy = busy_seconds(machine) - busy_seconds(self._machine)
        steal = getattr(machine, "steal", 0.0) - getattr(self._machine, "steal", 0.0)
        cores = usable_cores()
        others = max(busy - trainer - harness, 0.0)
        gpu_others = sorted(set(self._gpu_others_at_start) | set(gpu_compute_processes(self.gpu_uuids)))
        throttled = sorted({f"{source}: 0x{int(value):x}" for _, source, metric, value in utilization_rows
                            if metric == "clock_event_reasons" and int(value) & ~BENIGN_CLOCK_REASONS})
        account = {
            "wall_s": wall, "cores": cores, "trainer_cpu_s": trainer, "trainer_cores": trainer / wall,
            "harness_cpu_s": harness, "others_cpu_s": others, "others_cores": others / wall,
            "steal_share": steal / (wall * cores), "load_1m": os.getloadavg()[0],
            "gpu_other_processes": gpu_others, "gpu_clock_events": throttled,
        }
        reasons = contention(account)
        account["why"] = "; ".join(detail for _, detail in reasons)
        account["contended"] = bool(reasons)
        return account


def contention(account: dict[str, Any]) -> list[tuple[str, str]]:
    """(kind, detail) of every reason this repeat's machine counts as contended."""
    reasons = []
    if account["others_cores"] > OTHERS_CORES_LIMIT:
        reasons.append(("other processes used the CPU", f"other processes used {account['others_cores']:.2f} cores"))
    if account["steal_share"] > STEAL_SHARE_LIMIT:
        reasons.append(("steal", f"steal took {account['steal_share']:.0%} of the CPUs"))
    if account.get("gpu_other_processes"):
        reasons.append(("other programs on the GPU",
                        f"other programs computed on the GPU ({', '.join(account['gpu_other_processes'])})"))
    return reasons


def gpu_compute_processes(gpu_uuids: list[str]) -> list[str]:
    """`pid name` of every compute process on these GPUs (NVML); empty without NVML or GPUs."""
    if not gpu_uuids:
        return []
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    found = []
    try:
        for uuid in gpu_uuids:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except pynvml.NVMLError:
                continue
            for process in processes:
                try:
                    name = psutil.Process(process.pid).name()
                except psutil.Error:
                    name = "?"
                found.append(f"{process.pid} {name}")
    finally:
        pynvml.nvmlShutdown()
    return found
