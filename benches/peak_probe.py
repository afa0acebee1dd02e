"""This machine's peaks, measured here rather than looked up (`rlperf probe`, and a sweep for its run's roofline).

Each quantity is timed several times after a warm-up and the fastest rate kept: other work only ever slows a timing,
and a peak is a ceiling (docs/machines.md#how-far-from-the-machines-limits). Run as `python -m benches.peak_probe`,
it reads the needs as JSON on stdin and writes the measured rows as JSON on stdout.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from rlperf import peaks
from rlperf.errors import BadInput, MachineFault

TIMINGS = 7
TIMING_S = 0.01
WARMUP_S = 0.02
MIN_WARMUP_CALLS = 3
MEMORY_BYTES = {"cpu": 256 * 2**20, "cuda": 2**30}
KERNEL_GROUP_BYTES = 2**30
COPY_BYTES = 64 * 2**20
PROBE_TIMEOUT_S = 600.0
PROBE_PROCESSES = 3


class ProbeFailed(MachineFault):
    """A measurement failed (a CUDA error, a library that refused): the message names it and the error's first
    line; `rows` holds the measurements made besides, which are as good as any, and `failed` the needs that failed
    (empty where the probe died without naming one). Every warm-up call is waited for, so an asynchronous CUDA
    error surfaces in the measurement whose kernels raised it."""

    def __init__(self, message: str, rows: list[dict[str, Any]], failed: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.rows = rows
        self.failed = failed or []


def need_name(need: dict[str, Any]) -> str:
    """`linear float32 1024x32x128`: a need's op, dtype and shape."""
    shape = "x".join(str(size) for size in need["shape"])
    return " ".join(part for part in (need["op"], need["dtype"], shape) if part)


def failed_measuring(need: dict[str, Any], exc: BaseException, rows: list[dict[str, Any]]) -> ProbeFailed:
    first = (str(exc).strip().splitlines() or [""])[0]
    return ProbeFailed(f"peaks: measuring {need_name(need)} on {need['device']} failed: {type(exc).__name__}: {first}",
                       rows, [need])


def run_needs(store, run_ids) -> list[dict[str, Any]]:
    """The kernels and roofs these runs' readings need (rlperf.peaks.needs_for_work)."""
    needs = []
    for run_id in run_ids:
        for summary in store.samples(run_id)["summary"]:
            if summary.work:
                needs += peaks.needs_for_work(summary.config["device"], summary.device_name,
                                              summary.work["threads"], summary.work)
    return peaks.unique(needs)


def measure_run_peaks(store, key: str, run_id: str, say: Callable[[str], None], again: bool = False) -> None:
    """Measures, in a fresh interpreter, what run `run_id`'s reading needs and the store lacks a quiet
    measurement of for machine `key` (with `again`, all it needs); a measurement that fails costs the report its
    peak, never the run. A phase that then reads above 100% of its ceiling has all its run's peaks measured
    once more: a shared host can slow a whole probe with no busy process in sight, and readers keep the fastest
    measurement, so only a wrong count still reads above after that."""
    needs = run_needs(store, [run_id])
    missing = needs if again else peaks.Peaks(store.peaks(key)).missing(needs)
    how_again = f"`rlperf probe --store {store.path}` measures them again"
    if not missing:
        say(f"peaks: every peak this run needs is stored for this machine ({how_again})")
    else:
        # said before it starts: on a GPU the probe's fresh process and its CUDA start-up take a while
        say(f"peaks: measuring {len(missing)} that this run's roofline needs, in a fresh process")
        started = time.monotonic()
        try:
            rows, account = watched(lambda: measure_in_subprocess(missing))
        except ProbeFailed as failure:
            if failure.rows:
                store.add_peaks(key, failure.rows, run_id)
            say(f"{failure}; {len(failure.rows)} of {len(missing)} measured and stored, and the report's roofline "
                f"goes without the rest ({how_again})")
            return
        except BadInput as exc:
            say(f"{exc}; the report goes without its roofline ({how_again})")
            return
        store.add_peaks(key, rows, run_id)
        from reports.formatting import fmt_peak

        longest = max(rows, key=lambda row: row["method"]["seconds"])
        what = " ".join(part for part in (fmt_peak(longest), longest["dtype"]) if part)
        say(f"peaks: measured {len(rows)} in {time.monotonic() - started:.1f} s, the longest {what} "
            f"({longest['method']['seconds']:.1f} s)" + busy_note(account, store.path))
    over = [] if again or not needs else over_ceiling(store, run_id)
    if over:
        (what, ratio), more = over[0], f" (and {len(over) - 1} more)" if len(over) > 1 else ""
        say(f"peaks: {what} reads {ratio:.0%}{more}, above what the peaks allow; measuring this run's peaks once "
            "more (a slow moment of a shared host reads them low; the fastest is kept)")
        measure_run_peaks(store, key, run_id, say, again=True)


def over_ceiling(store, run_id: str) -> list[tuple[str, float]]:
    """Every ratio of run `run_id`'s points above 100% (reports.roofline), named with its point."""
    from decisions.rundata import load_run
    from reports import roofline

    found, _ = roofline.analyze(load_run(store, run_id))
    return [(f"{point.label}: {what}", ratio) for point in found.values() for what, ratio in point.over_ceiling()]


def roofline_problem(store, run_id: str) -> str | None:
    """What keeps run `run_id`'s report from a roofline of every measured point: no point measured, a peak it
    needs that no measurement of its machine holds (the probe failed on it, or never ran), or a point the
    roofline cannot place; None when every measured point has one."""
    from decisions.rundata import load_run
    from reports import roofline

    run = load_run(store, run_id)
    known = peaks.Peaks(store.peaks(run.info["machine_key"]))
    absent = [need for need in run_needs(store, [run_id]) if peaks.quantity_key(need) not in known.by_key]
    if absent:
        return f"{len(absent)} of the peaks its roofline needs were not measured, {need_name(absent[0])} the first"
    measured = list(run.points.loc[run.points["status"] == "ok", "point_key"])
    if not measured:
        return "no point was measured"
    found, notes = roofline.analyze(run)
    placed = sum(key in found for key in measured)
    if placed < len(measured):
        return f"the roofline places {placed} of {len(measured)} measured points" + (f": {notes[0]}" if notes else "")
    return None


def watched(measuring: Callable[[], list[dict[str, Any]]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows `measuring` returns, each with the account of other processes' load meanwhile (as a trainer
    repeat's): the reader prefers rows measured on a quiet machine."""
    from profilers.interference import InterferenceMonitor

    monitor = InterferenceMonitor()
    monitor.start()
    failure = None
    try:
        rows = measuring()
    except ProbeFailed as exc:
        rows, failure = exc.rows, exc
    finally:
        account = monitor.stop()
    for row in rows:
        row["method"]["interference"] = {name: account[name] for name in ("contended", "why", "others_cores")}
    if failure is not None:
        raise failure
    return rows, account


def busy_note(account: dict[str, Any], store: Path | None) -> str:
    if not account["contended"]:
        return ""
    again = f"`rlperf probe --store {store}`" if store else "`rlperf probe`"
    return (f"; other processes were busy meanwhile ({account['why']}), so these peaks may read low: "
            f"{again} on a quiet machine measures them again")


# ---- measuring (in the process that owns the device) --------------------------------------------------------

def measure(needs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Measures every need (rlperf.peaks.need) and returns the rows the store keeps, in the same order.

    Kernels are timed in rounds, one timing of each per round, so that a burst of other work spoils one
    timing of many kernels (the fastest timing of each is kept) rather than every timing of one; as many at a
    time as fit in KERNEL_GROUP_BYTES. Roofs, memory, copies and the tiny op are timed one after another. A
    measurement that fails raises ProbeFailed naming it, with the rows measured before it."""
    rows: list[dict[str, Any] | None] = [None] * len(needs)
    kernels = [index for index, need in enumerate(needs) if need["op"] in peaks.KERNELS]
    index = 0  # the need being measured, named if it fails
    try:
        for index, need in enumerate(needs):
            if index not in kernels:
                started = time.perf_counter()
                value, samples, method = measure_one(need["op"], need["dtype"], need["shape"], ready(need))
                rows[index] = row(need, value, samples, {**method, "seconds": time.perf_counter() - started})
        while kernels:
            timers, held, spent = {}, 0, {}
            while kernels and (not timers or held + kernel_bytes(needs[kernels[0]]) <= KERNEL_GROUP_BYTES):
                index = kernels.pop(0)
                started = time.perf_counter()
                need, device = needs[index], ready(needs[index])
                held += kernel_bytes(need)
                timers[index] = Timer(kernel_call(need["op"], need["dtype"], need["shape"], device),
                                      peaks.kernel_flops(need["op"], need["shape"]), device,
                                      graphed=device.type == "cuda")
                spent[index] = time.perf_counter() - started
            samples: dict[int, list[float]] = {index: [] for index in timers}
            for _ in range(TIMINGS):
                for index, timer in timers.items():
                    started = time.perf_counter()
                    ready(needs[index])
                    samples[index].append(timer.rate())
                    spent[index] += time.perf_counter() - started
            for index, timer in timers.items():
                value, timed_samples, method = timer.result(samples[index])
                rows[index] = row(needs[index], value, timed_samples, {**method, "seconds": spent[index]})
    except (BadInput, MachineFault):
        raise
    except Exception as exc:  # a CUDA error or a library's refusal: what was measured before it still counts
        raise failed_measuring(needs[index], exc, [done for done in rows if done is not None]) from exc
    return rows


def ready(need: dict[str, Any]):
    """The need's device, with the thread count it is measured at (CPU) or made current (CUDA)."""
    import torch

    if need["device"] == "cpu":
        torch.set_num_threads(need["threads"])
        return torch.device("cpu")
    device = torch.device(device_index(need["device"]))
    torch.cuda.set_device(device)
    if torch.cuda.get_device_name(device) != need["device_name"]:
        raise BadInput(f"device: {need['device']} is a {torch.cuda.get_device_name(device)}, but the run measured "
                       f"on it was a {need['device_name']}")
    return device


def row(need: dict[str, Any], value: float, samples: list[float], method: dict[str, Any]) -> dict[str, Any]:
    return {**{name: need[name] for name in ("device_name", "threads", "op", "dtype", "shape")}, "value": value,
            "unit": peaks.UNITS[need["op"]], "samples": samples, "method": method}


def kernel_bytes(need: dict[str, Any]) -> int:
    """About what a kernel's operands and result take: its inputs twice (float32 counted, an upper bound)."""
    shape = need["shape"]
    if need["op"] in peaks.PRODUCTS:
        m, k, n = shape
        return 2 * 4 * (m * k + k * n + m * n)
    batch, channels, height, width, out_channels, kernel, _ = shape[:7]
    return 2 * 4 * (batch * channels * height * width * 2 + out_channels * channels * kernel * kernel)


def device_index(device: str) -> str:
    """A point's `cuda` is rank 0's GPU, `cuda:0`."""
    return device if ":" in device else f"{device}:0"


def measure_one(op: str, dtype: str, shape: list[int], device) -> tuple[float, list[float], dict[str, Any]]:
    import torch

    if op == peaks.ROOF:
        return roof(dtype, device)
    if op == peaks.DISPATCH:
        a, b, c = (torch.zeros(1, device=device) for _ in range(3))
        return timed(lambda: torch.add(a, b, out=c), 1, device)
    size = MEMORY_BYTES[device.type] if op == peaks.MEMORY else COPY_BYTES
    if device.type == "cuda" and op == peaks.MEMORY:
        size = min(size, torch.cuda.mem_get_info(device)[0] // 8)
    call, moved = copy_call(op, size // 4, device)
    value, samples, method = timed(call, moved, device)
    return value, samples, {**method, "bytes": size // 4 * 4}


def roof(dtype, device) -> tuple[float, list[float], dict[str, Any]]:
    """The fastest of the square products of ROOF_SIDES, larger ones tried while one call promises to take at
    most ROOF_CALL_S (a side twice as long is eight times the work)."""
    best = None
    sides = {}
    for side in peaks.ROOF_SIDES["cpu" if device.type == "cpu" else "cuda"]:
        shape = [side] * 3
        value, samples, method = timed(kernel_call("mm", dtype, shape, device), peaks.kernel_flops("mm", shape), device)
        sides[side] = value
        if best is None or value > best[0]:
            best = value, samples, {**method, "shape": shape}
        if 8 * peaks.kernel_flops("mm", shape) / value > peaks.ROOF_CALL_S:
            break
    return best[0], best[1], {**best[2], "sides": sides}


def kernel_call(op: str, dtype: str, shape: list[int], device) -> Callable[[], Any]:
    import torch
    import torch.nn.functional as F

    def tensor(*sizes: int):
        return torch.randn(*sizes, device=device).to(getattr(torch, dtype))

    if op in peaks.PRODUCTS:
        m, k, n = shape
        if op == "linear":
            x, weight, bias = tensor(m, k), tensor(n, k), tensor(n)
            return lambda: F.linear(x, weight, bias)
        a = tensor(m, k) if op == "mm" else tensor(k, m).t()
        b = tensor(k, n)
        return lambda: torch.mm(a, b)
    batch, channels, height, width, out_channels, kernel, stride = shape[:7]
    images, weight, bias = tensor(batch, channels, height, width), tensor(out_channels, channels, kernel, kernel), \
        tensor(out_channels)
    if op == "conv":
        return lambda: F.conv2d(images, weight, bias, stride=stride)
    grad = tensor(batch, out_channels, *peaks.conv_output(height, width, kernel, stride))
    mask = [bool(shape[7]), True, True]
    return lambda: torch.ops.aten.convolution_backward(grad, images, weight, [out_channels], [stride, stride], [0, 0],
                                                       [1, 1], False, [0, 0], 1, mask)


def copy_call(op: str, elements: int, device) -> tuple[Callable[[], Any], int]:
    """A copy and the bytes it moves: reads and writes for memory, the bytes copied for host<->device."""
    import torch

    if op == peaks.MEMORY:
        source, target = torch.ones(elements, device=device), torch.zeros(elements, device=device)
        return (lambda: target.copy_(source)), 2 * elements * 4
    host = torch.ones(elements, pin_memory=op.endswith("pinned"))
    on_device = torch.zeros(elements, device=device)
    pinned = op.endswith("pinned")
    if op.startswith("h2d"):
        return (lambda: on_device.copy_(host, non_blocking=pinned)), elements * 4
    return (lambda: host.copy_(on_device, non_blocking=pinned)), elements * 4


class Timer:
    """One quantity made ready to time (module docstring): warmed up, its calls per timing sized, on a GPU
    captured as a CUDA graph of those calls.

    A graph keeps the addresses its calls read, not the tensors behind them: the timer holds `call` (and the
    inputs it closes over) and the last captured output for as long as the graph can be replayed. Let go, they
    would go back to the caching allocator, and the next timer's capture, which empties its cache, would hand
    their memory back to the driver: a replay would then read an unmapped address."""

    def __init__(self, call: Callable[[], Any], work: float, device, graphed: bool = False):
        import torch

        self.work, self.device, self.graphed, self.call = work, device, graphed, call
        # A graph is captured on a side stream, and warmed up on it first: libraries set up per-stream state
        # (cuBLAS workspaces) on their first call there, which must not happen during capture.
        stream = capture_stream(device) if graphed else None
        if graphed:  # the inputs `call` reads were made on the current stream
            stream.wait_stream(torch.cuda.current_stream(device))
        self.warmup_calls, start = 0, time.perf_counter()
        with torch.cuda.stream(stream) if graphed else contextlib.nullcontext():
            while self.warmup_calls < MIN_WARMUP_CALLS or time.perf_counter() - start < WARMUP_S:
                call()
                # A GPU call returns once launched: unwaited, WARMUP_S of launches queued about 1,000 float32
                # products of 8192³, 20 s of an H100, and the calibration after them half as many again.
                self.sync()
                self.warmup_calls += 1
        # The first calls set up caches and kernels: the calls per timing come from the warm-up's second half.
        calibration = max(1, self.warmup_calls // 2)
        self.sync()
        started = time.perf_counter()
        for _ in range(calibration):
            call()
        self.sync()
        self.batch = batch = max(1, math.ceil(TIMING_S * calibration / (time.perf_counter() - started)))
        if graphed:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(batch):
                    self.captured_output = call()
            self.run_batch = graph.replay
        else:
            def run_batch() -> None:
                for _ in range(batch):
                    call()
            self.run_batch = run_batch

    def sync(self) -> None:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def rate(self) -> float:
        """One timing: work per second over `batch` calls."""
        self.sync()
        started = time.perf_counter()
        self.run_batch()
        self.sync()
        return self.work * self.batch / (time.perf_counter() - started)

    def result(self, samples: list[float]) -> tuple[float, list[float], dict[str, Any]]:
        return max(samples), samples, {"kept": "fastest", "timings": len(samples), "calls_per_timing": self.batch,
                                       "warmup_calls": self.warmup_calls, "graphed": self.graphed}


CAPTURE_STREAMS: dict[str, Any] = {}


def capture_stream(device) -> Any:
    """The one side stream every timer on `device` warms up and captures on: torch's pool has 32 streams per
    priority and a probe builds more timers than that, so a stream each would have some share one anyway."""
    import torch

    key = str(device)
    if key not in CAPTURE_STREAMS:
        CAPTURE_STREAMS[key] = torch.cuda.Stream(device)
    return CAPTURE_STREAMS[key]


def timed(call: Callable[[], Any], work: float, device) -> tuple[float, list[float], dict[str, Any]]:
    """The fastest rate (work per second) of TIMINGS timings in a row."""
    timer = Timer(call, work, device)
    return timer.result([timer.rate() for _ in range(TIMINGS)])


def measure_in_subprocess(needs: list[dict[str, Any]], python: str = sys.executable) -> list[dict[str, Any]]:
    """`measure` in a fresh interpreter, so that the harness never holds a CUDA context of its own. A measurement
    that fails costs its own peak, not the ones after it: they are measured in another fresh process (a CUDA
    error can leave a process's context unusable), up to PROBE_PROCESSES processes in all. Then ProbeFailed names
    the first failure and holds every row measured."""
    rows, failures, left = [], [], list(needs)
    while left:
        try:
            rows += probe_process(left, python)
            break
        except ProbeFailed as failure:
            rows += failure.rows
            failures.append(failure)
            if not failure.failed or len(failures) == PROBE_PROCESSES:
                break
            done = {peaks.quantity_key(measured) for measured in failure.failed + failure.rows}
            left = [need for need in left if peaks.quantity_key(need) not in done]
    if failures:
        failed = [need for failure in failures for need in failure.failed]
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise ProbeFailed(f"{failures[0]}{more}", rows, failed)
    return rows


def probe_process(needs: list[dict[str, Any]], python: str) -> list[dict[str, Any]]:
    """One fresh interpreter measuring `needs`: its rows, or ProbeFailed with the rows it measured and the need
    that failed."""
    try:
        done = subprocess.run([python, "-m", "benches.peak_probe"], input=json.dumps(needs), capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BadInput(f"peaks: the probe did not finish within {PROBE_TIMEOUT_S:.0f} s") from None
    if done.returncode < 0:
        raise ProbeFailed(f"peaks: the probe was killed by {signal.Signals(-done.returncode).name}", [])
    try:
        answer = json.loads(done.stdout) if done.stdout.strip() else {}
    except json.JSONDecodeError:
        answer = {}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ProbeFailed(last if last.startswith("peaks: ") else f"peaks: the probe failed: {last}",
                          answer.get("rows", []), answer.get("failed", []))
    return answer["rows"]


if __name__ == "__main__":
    try:
        json.dump({"rows": measure(json.loads(sys.stdin.read())), "failed": []}, sys.stdout)
    except ProbeFailed as failure:
        json.dump({"rows": failure.rows, "failed": failure.failed}, sys.stdout)
        sys.exit(str(failure))
    except BadInput as exc:
        sys.exit(str(exc))
    sys.stdout.write("\n")
