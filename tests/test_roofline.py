"""Work counted per phase against torch's own counter, peaks measured and stored, and every phase of a real
run held against them: no ratio may exceed 100%."""

from __future__ import annotations

import contextlib
import gc
import json
import shutil
import sqlite3
import time
import weakref
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from benches import peak_probe as probe
from benches.options import ProcessOptions
from benches.sweep import Sweep
from reference_trainer.config import TrainConfig, validate
from reference_trainer.devices import Rank
from reference_trainer.timing import SetupClock
from reference_trainer.train import Trainer
from reports import roofline
from reports.render import render
from decisions.rundata import load
from rlperf import peaks
from command.cli import main
from rlperf.machine import Machine
from rlperf.store import Store

REPO = Path(__file__).resolve().parents[1]
SMALL = {"env": "synthetic", "num_envs": 8, "horizon": 4, "minibatch_size": 16, "hidden_size": 16, "total_steps": 256}
PIXELS = {"obs_shape": "4,40,40", "obs_dtype": "uint8", "encoder": "cnn", "cnn_channels": 4}
CONFIGS = {
    "lstm": {},
    "mlp core": {"lstm": False},
    "two env groups": {"env_groups": 2},
    "bf16": {"dtype": "bf16"},
    "cnn": PIXELS,
    "cnn, mlp core": {**PIXELS, "lstm": False},
    "2-d observations, 3 update epochs": {"obs_shape": "3,5", "update_epochs": 3},
    "catch (pixels, next-step reset)": {"env": "catch", "encoder": "cnn", "cnn_channels": 4, "obs_size": 32},
}


def trainer(**settings) -> Trainer:
    values = {**SMALL, **settings}
    if values["env"] != "synthetic":
        values.pop("obs_size")
    torch.manual_seed(0)
    return Trainer(validate(TrainConfig(**values)), torch.device("cpu"), Rank(), None, 0, time.perf_counter(),
                   SetupClock(time.perf_counter()))


def flops(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


class KernelLog(TorchDispatchMode):
    """The products and convolutions actually run, named and shaped as rlperf.peaks names them."""

    def __init__(self):
        super().__init__()
        self.kernels: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name == "addmm":
            x, weight_t = args[1], args[2]
            self.add("linear", [x.shape[0], x.shape[1], weight_t.shape[1]])
        elif name == "mm":
            a, b = args
            transposed = a.stride(0) == 1 and a.stride(1) != 1
            self.add("mm_tn" if transposed else "mm", [a.shape[0], a.shape[1], b.shape[1]])
        elif name == "convolution":
            images, weight, stride = args[0], args[1], args[3]
            self.add("conv", [*images.shape, weight.shape[0], weight.shape[2], stride[0]])
        elif name == "convolution_backward":
            images, weight, stride, mask = args[1], args[2], args[4], args[-1]
            self.add("conv_backward", [*images.shape, weight.shape[0], weight.shape[2], stride[0], int(mask[0])])
        return func(*args, **(kwargs or {}))

    def add(self, op: str, shape: list[int]) -> None:
        self.kernels[canonical(op, shape)] += 1


def canonical(op: str, shape: list[int]) -> tuple:
    # A product with one row is laid out alike whether stored transposed or not.
    if op == "mm_tn" and shape[0] == 1:
        op = "mm"
    return op, tuple(int(size) for size in shape)


def logged(fn) -> Counter:
    with KernelLog() as log:
        fn()
    return log.kernels


@pytest.mark.parametrize("settings", CONFIGS.values(), ids=CONFIGS.keys())
def test_counted_flops_and_kernels_match_what_torch_runs(settings):
    """Per call of each phase: FLOPs equal FlopCounterMode's on the trainer's own rollout step, forward+loss
    and backward+optimizer step, and the kernels listed are the ones dispatched, shape for shape."""
    t = trainer(**settings)
    calls = {"eval_forward": t.calls.steps[0], "train_forward": t.minibatch.forward_loss, "learn": t.calls.learn}
    for phase, call in calls.items():
        counted = t.work["phases"][phase]
        per_call = counted["flops"] / counted["calls"]
        if phase == "learn":
            t.minibatch.forward_loss()
        measured = flops(call)
        assert per_call == pytest.approx(measured, rel=1e-9), f"{phase}: counted {per_call:,.0f}, torch {measured:,}"
        listed = Counter()
        for kernel in counted["kernels"]:
            listed[canonical(kernel["op"], kernel["shape"])] += round(kernel["per_step"] / counted["calls"])
        if phase == "learn":
            t.minibatch.forward_loss()
        assert logged(call) == listed, phase


def test_a_whole_rollout_and_update_do_the_counted_work_per_agent_step():
    """The per-agent-step scaling: a whole epoch's rollout (the bootstrap step included) and update, counted
    by FlopCounterMode, over the agent steps of the epoch."""
    t = trainer(update_epochs=2, env_groups=2)
    steps = t.cfg.batch_size
    phases = t.work["phases"]
    t.start_steady()
    t.start_epoch(0)
    assert flops(t.rollout) == pytest.approx(phases["eval_forward"]["flops"] * steps, rel=1e-9)
    assert flops(t.update) == pytest.approx((phases["train_forward"]["flops"] + phases["learn"]["flops"]) * steps,
                                            rel=1e-9)


def test_least_bytes_shrink_as_one_call_serves_more_envs_and_with_byte_pixels():
    def least(phase: str, **settings) -> float:
        return trainer(**settings).work["phases"][phase]["min_bytes"]

    # the weights are read once per call: more envs per call, fewer bytes per agent step
    assert least("eval_forward", num_envs=32) < least("eval_forward", num_envs=8)
    frames = {"obs_shape": "4,40,40", "encoder": "cnn", "cnn_channels": 4}
    saved = 4 * 40 * 40 * 3  # float32 frames against uint8 ones, per observation read
    for phase in ("eval_forward", "train_forward"):
        assert least(phase, **frames) - least(phase, **frames, obs_dtype="uint8") >= saved


def test_the_probe_keeps_the_fastest_of_repeated_timings(monkeypatch):
    monkeypatch.setitem(probe.MEMORY_BYTES, "cpu", 8 * 2**20)
    monkeypatch.setitem(peaks.ROOF_SIDES, "cpu", (64, 128))
    needs = [peaks.need("cpu", "cpu", 1, peaks.ROOF, "float32", []),
             peaks.need("cpu", "cpu", 1, peaks.MEMORY, "", []), peaks.need("cpu", "cpu", 1, peaks.DISPATCH, "", []),
             peaks.need("cpu", "cpu", 1, "linear", "float32", [8, 16, 64]),
             peaks.need("cpu", "cpu", 1, "conv_backward", "float32", [2, 4, 40, 40, 4, 8, 4, 0])]
    started = time.perf_counter()
    rows = probe.measure(needs)
    elapsed = time.perf_counter() - started
    assert [row["op"] for row in rows] == [need["op"] for need in needs]
    for row in rows:
        assert len(row["samples"]) == probe.TIMINGS and row["value"] == max(row["samples"])
        assert row["method"]["kept"] == "fastest"
        assert row["value"] > 0 and row["method"]["warmup_calls"] >= probe.MIN_WARMUP_CALLS
        assert row["method"]["seconds"] >= probe.WARMUP_S  # what measuring it took, its warm-up at least
    assert sum(row["method"]["seconds"] for row in rows) <= elapsed
    roof = rows[0]
    assert set(roof["method"]["sides"]) <= {64, 128} and roof["value"] == max(roof["method"]["sides"].values())
    assert rows[1]["method"]["bytes"] == 8 * 2**20


def test_a_reader_keeps_each_peaks_fastest_measurement_whichever_is_newest():
    """A slow moment, seen or not, only ever lowers a measurement: a later, slower one must not lower a
    ceiling, and one taken beside other work still shows a rate the machine reached. A quantity measured only
    beside other work is measured again by the next sweep."""
    def row(value: float, at: str, busy: bool, op: str = peaks.MEMORY) -> dict:
        return {"device_name": "cpu", "threads": 1, "op": op, "dtype": "", "shape": [], "value": value,
                "measured_at": at, "method": {"interference": {"contended": busy}}}

    known = peaks.Peaks(pd.DataFrame([row(9e9, "2026-01-01", False), row(6e9, "2026-01-02", False),
                                      row(12e9, "2026-01-03", True), row(2e6, "2026-01-01", True, peaks.DISPATCH),
                                      row(3e6, "2026-01-02", True, peaks.DISPATCH),
                                      row(1e6, "2026-01-03", True, peaks.DISPATCH)]))
    assert known.value("cpu", 1, peaks.MEMORY) == 12e9 and known.value("cpu", 1, peaks.DISPATCH) == 3e6
    needs = [peaks.need("cpu", "cpu", 1, op, "", []) for op in (peaks.MEMORY, peaks.DISPATCH)]
    assert [need["op"] for need in known.missing(needs)] == [peaks.DISPATCH]
    assert known.unsettled("cpu", 1) == 1 and known.unsettled("cpu", 2) == 0


class QueuedDevice:
    """A GPU's asynchrony: a call queues `call_s` of device work and returns at once; a sync waits for the queue."""

    def __init__(self, call_s: float):
        self.call_s, self.queued, self.most_queued = call_s, 0.0, 0.0

    def call(self) -> None:
        self.queued += self.call_s
        self.most_queued = max(self.most_queued, self.queued)
        if self.queued > 1.0:  # far past any timing the probe means to make: fail now rather than wait it out
            raise AssertionError(f"{self.queued:.1f} s of device work queued unwaited")

    def sync(self) -> None:
        time.sleep(self.queued)
        self.queued = 0.0


def test_the_probe_never_queues_more_device_work_than_a_warm_up_or_a_timing_takes(monkeypatch):
    device = QueuedDevice(call_s=0.001)
    monkeypatch.setattr(probe.Timer, "sync", lambda timer: device.sync())
    value, samples, method = probe.timed(device.call, 1.0, torch.device("cpu"))
    assert method["warmup_calls"] >= probe.MIN_WARMUP_CALLS and len(samples) == probe.TIMINGS
    # the calibration queues half the warm-up's calls, a timing about TIMING_S of calls: one call more at most
    assert device.most_queued <= max(probe.WARMUP_S, probe.TIMING_S) + device.call_s
    assert 0 < value <= 1 / device.call_s


class StandInCudaGraphs:
    """torch's graph API as the probe uses it, on a CPU: a graph keeps device addresses, never the tensors behind
    them, so the stand-in graph holds nothing its capture read; entering a capture collects garbage, as torch's
    empties the allocator's cache (a freed input's memory goes back to the driver). Counts the streams made."""

    def __init__(self, monkeypatch, collects: bool = True):
        self.streams_made, self.capture_streams = 0, []
        stand_in = self

        class Graph:
            def replay(self) -> None:
                pass

        class Capture:
            def __init__(self, graph, pool=None, stream=None):
                stand_in.capture_streams.append(stream)

            def __enter__(self) -> None:
                if collects:
                    gc.collect()

            def __exit__(self, *exc) -> None:
                pass

        class Stream:
            def wait_stream(self, other) -> None:
                pass

        def stream(device=None):
            self.streams_made += 1
            return Stream()

        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", Capture)
        monkeypatch.setattr(torch.cuda, "Stream", stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
        monkeypatch.setattr(probe, "CAPTURE_STREAMS", {})


def test_a_graphed_timer_keeps_what_its_graph_reads_and_writes_alive(monkeypatch):
    """`measure` builds every timer before timing any, and each next capture empties the allocator's cache: a
    graph whose inputs were let go would replay reads of memory handed back to the driver (an illegal address)."""
    StandInCudaGraphs(monkeypatch)
    monkeypatch.setattr(probe, "WARMUP_S", 0.0)
    call = probe.kernel_call("linear", "float32", [64, 32, 16], torch.device("cpu"))
    inputs = [weakref.ref(cell.cell_contents) for cell in call.__closure__
              if isinstance(cell.cell_contents, torch.Tensor)]
    outputs = []

    def call_seen(call=call) -> torch.Tensor:
        output = call()
        outputs.append(weakref.ref(output))
        return output

    timer = probe.Timer(call_seen, 1.0, torch.device("cpu"), graphed=True)
    del call, call_seen
    gc.collect()
    assert len(inputs) == 3 and all(ref() is not None for ref in inputs)
    assert outputs[-1]() is not None  # the last captured call's output
    assert timer.rate() > 0
    del timer
    gc.collect()
    assert all(ref() is None for ref in inputs)  # the timer was what held them


def test_every_graphed_timer_captures_on_one_stream_more_timers_than_torchs_pool_has_streams(monkeypatch):
    graphs = StandInCudaGraphs(monkeypatch, collects=False)
    monkeypatch.setattr(probe, "WARMUP_S", 0.0)
    monkeypatch.setattr(probe, "TIMING_S", 0.0)
    timers = [probe.Timer(probe.kernel_call("mm", "float32", [4, 4, 4], torch.device("cpu")), 1.0,
                          torch.device("cpu"), graphed=True) for _ in range(33)]
    assert len(graphs.capture_streams) == len(timers) and len(set(map(id, graphs.capture_streams))) == 1
    assert graphs.streams_made == 1


def test_timings_read_from_least_to_most_as_shown_a_tiny_ops_cost_as_well_as_a_rate():
    from reports.formatting import fmt_rate_range

    assert fmt_rate_range([6.60e5, 6.75e5, 6.70e5], "op/s") == "1.48 µs/op – 1.52 µs/op"
    assert fmt_rate_range([1.9e11, 1.8e11], "FLOP/s") == "180 GFLOP/s – 190 GFLOP/s"


def test_a_measurement_that_fails_is_named_and_costs_only_its_own_peak(tmp_path, monkeypatch):
    """A probe whose measurement fails (on a GPU, a CUDA error whose last line says only how to compile torch
    for device-side assertions) names that measurement and the error's first line, in a real child process; what
    it measured before is stored, and the needs after it are measured in a fresh process, so the run's roofline
    loses that one peak."""
    store_path = tmp_path / "results.sqlite"
    shutil.copy(REPO / "results" / "cpu-xeon-2core" / "results.sqlite", store_path)
    needs = [peaks.need("cpu", "cpu", 1, peaks.DISPATCH, "", []),
             peaks.need("cpu", "cpu", 1, "linear", "float32", [-1, 4, 4]),  # no tensor has a negative size
             peaks.need("cpu", "cpu", 1, "linear", "float32", [8, 4, 4])]
    monkeypatch.setattr(probe, "run_needs", lambda store, run_ids: needs)
    said = []
    with Store.open(store_path) as store:
        run_id = store.runs()["run_id"].iloc[0]
        probe.measure_run_peaks(store, "machine", run_id, said.append)
        stored = store.peaks("machine")
    assert said[-1].startswith("peaks: measuring linear float32 -1x4x4 on cpu failed: RuntimeError: "), said
    assert "negative dimension" in said[-1] and "2 of 3 measured and stored" in said[-1]
    assert sorted((op, tuple(shape)) for op, shape in zip(stored["op"], stored["shape"])) == \
        [(peaks.DISPATCH, ()), ("linear", (8, 4, 4))]
    assert (stored["value"] > 0).all()


def test_a_probe_whose_measurements_keep_failing_stops_after_its_processes():
    bad = [peaks.need("cpu", "cpu", 1, "linear", "float32", [-size, 4, 4]) for size in range(1, 6)]
    with pytest.raises(probe.ProbeFailed) as failed:
        probe.measure_in_subprocess(bad)
    assert str(failed.value).startswith("peaks: measuring linear float32 -1x4x4 on cpu failed: RuntimeError: ")
    assert str(failed.value).endswith(f"(and {probe.PROBE_PROCESSES - 1} more)")
    assert failed.value.rows == [] and failed.value.failed == bad[:probe.PROBE_PROCESSES]


def test_a_store_from_before_peaks_reads_as_having_none_and_gains_the_table_when_written(tmp_path):
    """The committed reference store predates peaks: read-only it reads, its report says why it has no
    roofline; opened for writing it gains the table and stays schema version 1."""
    old = tmp_path / "results.sqlite"
    shutil.copy(REPO / "results" / "cpu-xeon-2core" / "results.sqlite", old)
    with Store.open(old, readonly=True) as store:
        assert store.peaks().empty and store.row_counts()["peaks"] == 0
    code, _, (markdown, _) = render(load(str(old)), str(tmp_path / "report"))
    text = Path(markdown).read_text()
    assert code == 0 and "## How far from the machine's limits" in text and "did not record `work`" in text
    with Store.open(old) as store:
        store.add_peaks("k", [{"device_name": "cpu", "threads": 2, "op": peaks.DISPATCH, "dtype": "", "shape": [],
                               "value": 1e6, "unit": "op/s", "samples": [1e6], "method": {}}])
    with sqlite3.connect(old) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    with Store.open(old, readonly=True) as store:
        assert len(store.peaks("k")) == 1 and store.peaks("other").empty


def test_rlperf_probe_prints_and_stores_the_roofs_and_refuses_bad_input(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(probe.MEMORY_BYTES, "cpu", 8 * 2**20)
    monkeypatch.setitem(peaks.ROOF_SIDES, "cpu", (64, 128))
    path, rows = tmp_path / "results.sqlite", tmp_path / "peaks.json"
    assert main(["probe", "--device", "cpu", "--threads", "1", "--store", str(path), "--json", str(rows)]) == 0
    printed = capsys.readouterr().out
    assert "fastest of 7 timings" in printed and "µs/op" in printed
    measured = json.loads(rows.read_text())
    assert {row["op"] for row in measured} == {peaks.ROOF, peaks.MEMORY, peaks.DISPATCH}
    with Store.open(path, readonly=True) as store:
        assert len(store.peaks()) == len(measured)
    # more GPUs than any machine here has, so it is refused with a GPU or without one
    assert main(["probe", "--device", "cuda:99"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("rlperf probe: error: device: device=cuda:99 ") and "\n" not in error
    assert "needs a CUDA GPU; none is visible" in error or "needs 100 GPUs" in error
    for args, field in ((["--device", "tpu"], "--device"), (["--threads", "0"], "--threads")):
        with pytest.raises(SystemExit) as exited:
            main(["probe", *args])
        assert exited.value.code == 2
        error = capsys.readouterr().err.strip()
        assert field in error and "\n" not in error and "Traceback" not in error


def sweep(tmp_path, axes: str) -> tuple[Path, str]:
    suite = tmp_path / "roofline.toml"
    suite.write_text(f"""
        description = "two points against this machine's peaks"
        repeats = 1
        timeout_s = 120
        sample_hz = 0
        [fixed]
        device = "cpu"
        env = "synthetic"
        horizon = 16
        hidden_size = 64
        minibatch_size = 256
        update_epochs = 1
        total_steps = 4096
        threads = 1
        {axes}
    """.replace("\n        ", "\n"))
    run = Sweep(ProcessOptions(suite=str(suite), out_dir=tmp_path / "runs"),
                machine=Machine(torch=torch.__version__, cuda=None, cudnn=None, nccl=None, gpus=[]))
    assert run.run() == 0
    return run.store_path, run.run_id


def test_no_phase_of_a_real_run_exceeds_the_peaks_measured_here(tmp_path):
    """A ratio above 100% means the counts or the peaks are wrong. Peaks measured beside other work, or at a
    slow moment of a shared host that no process account shows, read low: as the reading tells a user, they
    are measured again (up to twice more) and the fastest measurement holds. A wrong count stays above."""
    store_path, run_id = sweep(tmp_path, """
        [axes]
        num_envs = [64]
        [[sweep]]
        [[sweep]]
        obs_shape = ["4,40,40"]
        obs_dtype = ["uint8"]
        encoder = ["cnn"]
        cnn_channels = [8]
    """)
    for again in (True, True, False):
        run = load(f"{store_path}::{run_id}")
        found, notes = roofline.analyze(run)
        if not again or not any(point.busy_peaks or point.over_ceiling() for point in found.values()):
            break
        with Store.open(store_path) as store:
            probe.measure_run_peaks(store, run.info["machine_key"], run_id, print, again=True)
    with Store.open(store_path, readonly=True) as store:
        assert probe.roofline_problem(store, run_id) is None  # peaks measured beside other work draw it too
        kept = store.peaks(run.info["machine_key"])
    lost_path = tmp_path / "lost.sqlite"
    shutil.copy(store_path, lost_path)
    # without one of the kernels' peaks (a probe that failed on it), the run's roofline is not whole
    lost = next(row for row in kept.to_dict("records") if row["op"] in peaks.KERNELS)
    with sqlite3.connect(lost_path) as db:
        rows = db.execute("SELECT rowid, shape FROM peaks WHERE op = ? AND dtype = ?", (lost["op"], lost["dtype"]))
        db.executemany("DELETE FROM peaks WHERE rowid = ?",
                       [(rowid,) for rowid, shape in list(rows) if json.loads(shape) == list(lost["shape"])])
    with Store.open(lost_path, readonly=True) as store:
        problem = probe.roofline_problem(store, run_id)
    assert problem == f"1 of the peaks its roofline needs were not measured, {probe.need_name(lost)} the first"
    if any(point.busy_peaks for point in found.values()):
        pytest.skip("every measurement of the peaks had other processes busy beside it")
    assert len(found) == 2 and not notes
    for point in found.values():
        assert point.over_ceiling() == [], point.reading
        for phase in point.phases:
            assert 0 < phase.of_ceiling <= 1 and 0 < phase.of_roof <= 1 and phase.ceiling <= phase.roof
        assert 0 < point.of_roof <= 1 and "BUG" not in " ".join(point.reading)
    _, _, (_, html_path) = render(run, str(tmp_path / "report"))
    html = Path(html_path).read_text()
    assert "How far from the machine" in html and html.count("arithmetic intensity (FLOP per byte it must move)") == 2


def test_a_rate_above_its_ceiling_is_named_a_bug_until_measuring_again_lifts_the_ceiling(tmp_path, capsys):
    """The same kind of run, its stored peaks made a hundred times too low, as a probe at a slow moment of a
    shared host could read them: every model phase reads above 100%, and the reading says it is a bug, not a
    success, and how to measure again. The next look at the run's peaks measures them all once more and keeps
    the faster rates: every ratio falls tenfold."""
    store_path, run_id = sweep(tmp_path, "[axes]\nnum_envs = [32]")
    # the sweep says what it measures before the probe starts, and how long it took after (then, were a phase
    # read above its ceiling, that it measures once more)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("peaks: ")]
    assert [line.split(" ")[1] for line in lines][:2] == ["measuring", "measured"], lines
    run = load(f"{store_path}::{run_id}")
    said = []
    with Store.open(store_path) as store:
        probe.measure_run_peaks(store, run.info["machine_key"], run_id, said.append)
    if not any(peaks.busy(row) for row in run.peaks.to_dict("records")):
        assert said[0].startswith("peaks: every peak this run needs is stored")  # measured once per machine
    with contextlib.closing(sqlite3.connect(store_path)) as db, db:
        # quiet, as such a probe's account would show: nothing left for a sweep to measure as missing
        db.execute("UPDATE peaks SET value = value / 100, method = json_set(method, '$.interference.contended', "
                   "json('false'))")
    (point,) = roofline.analyze(load(f"{store_path}::{run_id}"))[0].values()
    assert {what for what, _ in point.over_ceiling()} >= {f"{phase} of its ceiling"
                                                          for phase in roofline.MODEL_PHASES}
    assert point.reading[0].startswith("BUG: ") and "near its ceiling" not in " ".join(point.reading)
    assert "`rlperf probe --store`" in point.reading[0]
    assert "(above: a bug)" in roofline.phase_table([point]).to_string()
    said.clear()
    with Store.open(store_path) as store:  # as a sweep, a comparison or a gate does after its points
        probe.measure_run_peaks(store, run.info["machine_key"], run_id, said.append)
    once_more = [line for line in said if "measuring this run's peaks once more" in line]
    assert len(once_more) == 1 and "num_envs=32: eval_forward of its ceiling reads" in once_more[0], said
    (again,) = roofline.analyze(load(f"{store_path}::{run_id}"))[0].values()
    for low, measured in zip(point.phases, again.phases):
        assert measured.of_ceiling < low.of_ceiling / 10, (low.phase, low.of_ceiling, measured.of_ceiling)


def test_a_graphed_timer_orders_its_side_stream_after_the_stream_that_made_its_inputs(monkeypatch):
    # The inputs were made on the current stream; the warm-up, the calibration and the capture read them on the
    # side stream, which must wait for them first (here without CUDA: the streams and the graph record what they do).
    done = []

    class Stream:
        def __init__(self, name):
            self.name = name

        def wait_stream(self, other):
            done.append(f"{self.name} waits for {other.name}")

    @contextlib.contextmanager
    def on(stream, **_):
        done.append(f"on {stream.name}")
        yield

    side, current = Stream("side"), Stream("current")
    monkeypatch.setattr(probe, "capture_stream", lambda device: side)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "graph", lambda graph, stream=None: on(stream))
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: type("Graph", (), {"replay": lambda self: None})())
    probe.Timer(lambda: done.append("call"), work=1.0, device=torch.device("cpu"), graphed=True)
    assert done[0] == "side waits for current" and done[1] == "on side" and "call" in done
