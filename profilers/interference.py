"""Was the machine quiet while one repeat ran? The trainer's own CPU time against everything else's.

On a 2-core machine a neighbour that takes one core slows the trainer many times with nothing in its own figures
saying why, so every repeat is bracketed by the kernel's accounts and NVML's; a repeat whose neighbours, steal or
another GPU program crossed the limits is `contended` and left out of verdicts (docs/sweeps-and-reports.md).
"""

from __future__ import annotations

import os
import resource
import threading
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
# Another program's kernels slow the run whenever they run; a poll a second catches any that computes for a
# second or more, and costs the harness one NVML call a second.
GPU_POLL_S = 1.0


class GpuQueryUnavailable(Exception):
    """NVML cannot say which processes use a GPU (no library, no driver, a device it does not see)."""


def busy_seconds(times) -> float:
    return times.user + times.nice + times.system + getattr(times, "irq", 0.0) + getattr(times, "softirq", 0.0)


def cpu_seconds(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


class InterferenceMonitor:
    """Brackets one child process: `start()` before it is spawned, `stop()` after it has been waited for.

    `in_process`: the trainer runs in this process instead (`rlperf selfcheck`), so its CPU time is this
    process's own and there is no harness apart from it."""

    def __init__(self, gpu_uuids: list[str] | None = None, in_process: bool = False):
        self.gpu_uuids = gpu_uuids or []
        self.in_process = in_process
        self.gpu_watch = GpuProcessWatch(self.gpu_uuids, in_process)

    def start(self) -> None:
        self.gpu_watch.start()
        self._wall = time.monotonic()
        self._machine = psutil.cpu_times()
        self._children = cpu_seconds(resource.getrusage(resource.RUSAGE_CHILDREN))
        self._self = cpu_seconds(resource.getrusage(resource.RUSAGE_SELF))

    def stop(self, utilization_rows: list[tuple] = (), forked_cpu_s: float = 0.0) -> dict[str, Any]:
        """The repeat's account; `utilization_rows` are the sampler's (t_ns, source, metric, value) rows,
        `forked_cpu_s` the CPU seconds of a trainer another process forked and waited for (rlperf/forkserver.py)."""
        wall = max(time.monotonic() - self._wall, 1e-9)
        machine = psutil.cpu_times()
        children = cpu_seconds(resource.getrusage(resource.RUSAGE_CHILDREN)) - self._children + forked_cpu_s
        own = cpu_seconds(resource.getrusage(resource.RUSAGE_SELF)) - self._self
        trainer, harness = (own + children, 0.0) if self.in_process else (children, own)
        busy = busy_seconds(machine) - busy_seconds(self._machine)
        steal = getattr(machine, "steal", 0.0) - getattr(self._machine, "steal", 0.0)
        cores = usable_cores()
        others = max(busy - trainer - harness, 0.0)
        gpu_others, gpu_unavailable = self.gpu_watch.stop()
        throttled = sorted({f"{source}: 0x{int(value):x}" for _, source, metric, value in utilization_rows
                            if metric == "clock_event_reasons" and int(value) & ~BENIGN_CLOCK_REASONS})
        account = {
            "wall_s": wall, "cores": cores, "trainer_cpu_s": trainer, "trainer_cores": trainer / wall,
            "harness_cpu_s": harness, "others_cpu_s": others, "others_cores": others / wall,
            "steal_share": steal / (wall * cores), "load_1m": os.getloadavg()[0],
            "gpu_other_processes": gpu_others, "gpu_watch_unavailable": gpu_unavailable,
            "gpu_clock_events": throttled,
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


class GpuProcessWatch:
    """Which other programs' processes use the run's GPUs, asked of NVML when started, every GPU_POLL_S on a
    daemon thread, and when stopped.

    This process and its descendants are the run; any other process NVML lists is another program's. NVML
    gives PIDs as the host numbers them, so inside a container with a PID namespace of its own a PID may not
    be found here. Such a PID listed before the run starts is another program's when the run is a child yet
    to be spawned; the others count only beyond as many as the run has processes, which could be its own.
    `in_process`: the run is this process itself, already on the GPU before it starts (`rlperf selfcheck`)."""

    def __init__(self, gpu_uuids: list[str], in_process: bool = False):
        self.gpu_uuids = list(gpu_uuids)
        self.in_process = in_process
        self.poll_s = GPU_POLL_S
        self.others: dict[int, str] = {}
        self.unavailable: str | None = None
        self._others_unseen: set[int] = set()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.gpu_uuids:
            return
        self.poll(before_the_run=True)
        if self.unavailable is None:
            self._thread = threading.Thread(target=self._watch, name="gpu-process-watch", daemon=True)
            self._thread.start()

    def stop(self) -> tuple[list[str], str | None]:
        """(`pid name` of every other program's process seen, why the GPU could not be watched or None)."""
        if self._thread is not None:
            self._stopping.set()
            self._thread.join()
            self._thread = None
        if self.gpu_uuids and self.unavailable is None:
            self.poll()
        return [f"{pid} {name}" for pid, name in sorted(self.others.items())], self.unavailable

    def _watch(self) -> None:
        while not self._stopping.wait(self.poll_s) and self.unavailable is None:
            self.poll()

    def poll(self, before_the_run: bool = False) -> None:
        try:
            listed = {pid for uuid in self.gpu_uuids for pid in nvml_gpu_pids(uuid)}
        except GpuQueryUnavailable as exc:
            self.unavailable = f"other programs on the GPU are not watched: {exc}"
            return
        me = psutil.Process()
        ours = {me.pid} | {child.pid for child in _descendants(me)}
        unseen = set()
        for pid in sorted(listed - ours):
            try:
                self.others[pid] = psutil.Process(pid).name()
            except psutil.NoSuchProcess:
                unseen.add(pid)
            except psutil.Error:
                self.others[pid] = "?"
        if before_the_run and not self.in_process:
            self._others_unseen = set(unseen)
        unseen -= self._others_unseen
        for pid in sorted(self._others_unseen) + sorted(unseen)[len(ours):]:
            self.others[pid] = "(outside this PID namespace)"


def _descendants(process: psutil.Process) -> list[psutil.Process]:
    try:
        return process.children(recursive=True)
    except psutil.Error:
        return []


def nvml_gpu_pids(uuid: str) -> list[int]:
    """PIDs of the processes NVML lists as computing or drawing on the GPU with this UUID (found by UUID, as
    the sampler finds it: NVML ignores CUDA_VISIBLE_DEVICES). Raises GpuQueryUnavailable when NVML cannot say."""
    try:
        import pynvml
    except ImportError:
        raise GpuQueryUnavailable("nvidia-ml-py is not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise GpuQueryUnavailable(f"NVML unavailable ({exc})") from None
    try:
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
        except pynvml.NVMLError as exc:
            raise GpuQueryUnavailable(f"NVML does not see {uuid} ({exc})") from None
        pids = []
        supported = 0
        for query in (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                pids += [process.pid for process in query(handle)]
                supported += 1
            except pynvml.NVMLError_NotSupported:
                continue
            except pynvml.NVMLError as exc:
                raise GpuQueryUnavailable(f"NVML could not list the processes on {uuid} ({exc})") from None
        if not supported:
            raise GpuQueryUnavailable(f"this GPU ({uuid}) does not report its processes to NVML")
        return pids
    finally:
        pynvml.nvmlShutdown()
