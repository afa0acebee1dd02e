"""`rlperf profile` end to end on the CPU: a real trainer child, a real torch.profiler trace, real py-spy."""

import gzip
import json
import shutil
import statistics
import subprocess
import sys

import pytest
import torch

from profilers import pyspy, trace_events
from profilers.profile_tables import print_profile
from profilers.timeline import clock_check, merge_timeline
from reference_trainer.config import PHASES
from command.cli import main

TINY_SHAPE = ["--env", "synthetic", "--num-envs", "8", "--horizon", "8", "--minibatch-size", "32", "--hidden-size",
              "16", "--total-steps", "192", "--warmup-epochs", "1", "--trace-epochs", "1"]
TINY = [*TINY_SHAPE, "--device", "cpu"]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "run"
    done = subprocess.run([sys.executable, "-m", "rlperf", "profile", *TINY, "--out", str(out), "--pyspy",
                           "--sample-hz", "50", "--quiet"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out, done


def test_trace_has_the_events_perfetto_reads(profiled):
    out, _ = profiled
    with gzip.open(out / "trace.json.gz", "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert complete and all({"ts", "dur", "pid", "tid", "name"} <= e.keys() for e in complete)
    counters = [e for e in events if e["ph"] == "C"]
    assert counters and all(isinstance(e["args"]["value"], float) and isinstance(e["pid"], int) for e in counters)
    named = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {named[e["pid"]] for e in counters} == {"host CPU and RAM (psutil)"}
    assert {e["name"] for e in counters} == {"cpu_util_percent", "ram_used_bytes"}
    assert (out / "trace.json.gz").stat().st_size < 3_000_000


def test_every_phase_is_a_range_on_the_host_and_on_the_phase_track(profiled):
    out, _ = profiled
    trace = trace_events.load(out / "trace.json.gz")
    host_ranges = {e["name"] for e in trace_events.complete_events(trace, "user_annotation")}
    track = {e["name"] for e in trace_events.complete_events(trace, "rlperf_phase")}
    assert set(PHASES) <= host_ranges
    assert set(PHASES) == track
    assert len(trace_events.profiler_steps(trace)) == 1


def test_profile_summary_and_utilization_files(profiled):
    out, done = profiled
    profile = json.loads((out / "profile.json").read_text())
    summary = profile["trace_summary"]
    assert summary["kind"] == "cpu" and summary["gpu"] is None
    assert summary["env_steps"] == 64 and summary["traced_epochs"] == 1
    assert all(summary["phases_host_us"][phase] > 0 for phase in PHASES)
    assert summary["top_operators"] and summary["cpu_ops_per_env_step"] > 1
    assert profile["utilization"]["unavailable"] == "gpu: the run uses no GPU"
    assert profile["utilization"]["whole_run"]["cpu"]["samples"] >= 5
    assert profile["clock_check"]["matched_ranges"] >= len(PHASES)
    assert not profile["clock_check"]["corrected"]
    assert "SPS" in profile["note"]
    header = (out / "utilization.csv").read_text().splitlines()[0]
    assert header == "t_ns,source,metric,value"
    assert "steady" not in done.stdout  # the profiled run's own SPS table is never shown


def test_pyspy_writes_speedscope_and_flamegraph(profiled):
    out, _ = profiled
    profile = json.loads((out / "profile.json").read_text())
    assert profile["pyspy"]["speedscope"] == str(out / pyspy.SPEEDSCOPE_NAME)
    stacks = pyspy.stack_counts(out / pyspy.SPEEDSCOPE_NAME)
    assert any("train" in frame for stack in stacks for frame in stack)
    svg = (out / pyspy.SVG_NAME).read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg


def test_traced_epochs_shorter_than_the_sampling_interval_say_so_rather_than_print_an_empty_table(profiled, capsys):
    out, _ = profiled
    profile = json.loads((out / "profile.json").read_text())
    profile["utilization"]["traced_epochs"] = {}
    print_profile(profile)
    said = " ".join(capsys.readouterr().out.split())
    assert "utilization over the traced epochs" not in said
    assert "no sample fell within the traced epochs, which were shorter than the 20 ms between samples" in said


def test_a_known_sample_and_a_phase_boundary_land_on_the_trace_clock(profiled, tmp_path):
    out, _ = profiled
    timeline = json.loads((out / "summary.json").read_text())["timeline"]
    trace_path = tmp_path / "trace.json.gz"
    shutil.copy(out / "trace.json.gz", trace_path)
    learn_start_ns = next(start for phase, start, _ in timeline if phase == "learn")
    rows = [(learn_start_ns, "probe", "known", 42.0)]
    check = merge_timeline(trace_path, rows, timeline)
    trace = trace_events.load(trace_path)
    known = next(e for e in trace["traceEvents"] if e["ph"] == "C" and e["name"] == "known")
    # the sample lands exactly where the base conversion puts its unix time
    assert known["ts"] == pytest.approx((learn_start_ns - trace["baseTimeNanoseconds"]) / 1000, abs=0.01)
    assert known["args"] == {"value": 42.0}
    # and that clock agrees with the trace's: each range opens right after the timer reads the clock, tens
    # of microseconds apart, though a busy machine may preempt the trainer in between for one range, so
    # the agreement is judged on the median over every phase range
    assert not check["corrected"] and abs(check["median_offset_us"]) < 500
    offsets = []
    for phase in PHASES:
        ranges = sorted(e["ts"] for e in trace_events.complete_events(trace, "user_annotation") if e["name"] == phase)
        # `rlperf profile` merged the phase track once already; this merge adds the same slices again
        slices = sorted({e["ts"] for e in trace_events.complete_events(trace, "rlperf_phase") if e["name"] == phase})
        assert len(slices) == len(ranges), phase
        offsets += [abs(a - b) for a, b in zip(slices, ranges)]
    assert statistics.median(offsets) < 500


def test_a_wrong_trace_base_is_detected_and_corrected(profiled, tmp_path):
    out, _ = profiled
    timeline = json.loads((out / "summary.json").read_text())["timeline"]
    trace = trace_events.load(out / "trace.json.gz")
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") != "rlperf_phase"]
    trace["baseTimeNanoseconds"] += 5_000_000_000
    trace_path = tmp_path / "shifted.json.gz"
    trace_events.save(trace, trace_path)
    assert clock_check(trace, timeline)["corrected"]
    learn_start_ns = next(start for phase, start, _ in timeline if phase == "learn")
    merge_timeline(trace_path, [(learn_start_ns, "probe", "known", 1.0)], timeline)
    merged = trace_events.load(trace_path)
    known = next(e for e in merged["traceEvents"] if e["ph"] == "C" and e["name"] == "known")
    # the correction is the median offset over every range (5 s here), applied to every sample
    shift_us = clock_check(trace, timeline)["median_offset_us"]
    assert abs(shift_us - 5_000_000) < 500
    assert known["ts"] == pytest.approx((learn_start_ns - trace["baseTimeNanoseconds"]) / 1000 + shift_us, abs=0.01)


def test_pyspy_that_cannot_run_leaves_a_message_and_the_run_goes_on(tmp_path, monkeypatch, capsys):
    failing = tmp_path / "py-spy"
    failing.write_text("#!/bin/sh\necho 'Error: Operation not permitted (os error 1)' >&2\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setattr(pyspy, "find_pyspy", lambda: str(failing))
    out = tmp_path / "run"
    assert main(["profile", *TINY, "--out", str(out), "--pyspy", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "py-spy could not run the trainer" in err and "ran it without py-spy" in err
    profile = json.loads((out / "profile.json").read_text())
    assert profile["pyspy"]["unavailable"].startswith("py-spy could not run the trainer")
    assert (out / "trace.json.gz").exists()


def test_missing_pyspy_is_reported_without_a_run(monkeypatch, tmp_path):
    from profilers.profile_run import _pyspy_command

    monkeypatch.setattr(pyspy, "find_pyspy", lambda: None)
    info, command = _pyspy_command(tmp_path, 100, False, ["python"])
    assert command is None and info["unavailable"].startswith("py-spy is not installed")


@pytest.mark.parametrize("argv, message", [
    (["--no-timers"], "timers: rlperf profile needs the phase timers"),
    (["--trace-dir", "x"], "unrecognized arguments: --trace-dir"),
    (["x"], "unrecognized arguments: x (a command to profile follows --)"),
    (["--no-attach"], "no-attach: belongs to a command's profile (name one after --)"),
    (["--num-envs", "8", "--", "python", "train.py"], "num-envs: a command's profile takes no trainer options"),
    (["--sample-hz", "0"], "argument --sample-hz: must be a number above 0 and at most 100"),
    (["--pyspy-rate", "0"], "argument --pyspy-rate: must be a whole number of 1 or more"),
    (["--num-envs", "0"], "num_envs: must be a positive number"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    try:
        code = main(["profile", "--out", str(tmp_path / "p"), *argv])
    except SystemExit as exit:  # argparse's refusals exit from inside main
        code = exit.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "p").exists()


def test_an_existing_profile_is_never_overwritten(tmp_path, capsys):
    (tmp_path / "trace.json.gz").write_bytes(b"keep me")
    assert main(["profile", "--out", str(tmp_path)]) == 2
    assert "already holds a profile" in capsys.readouterr().err
    assert (tmp_path / "trace.json.gz").read_bytes() == b"keep me"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_profile_has_device_time_kernels_and_nvml_tracks(tmp_path):
    out = tmp_path / "gpu"
    argv = TINY_SHAPE + ["--device", "cuda", "--num-envs", "64", "--total-steps", "1536"]
    assert main(["profile", *argv, "--out", str(out), "--quiet"]) == 0
    profile = json.loads((out / "profile.json").read_text())
    summary = profile["trace_summary"]
    assert summary["kind"] == "gpu"
    # a small run's kernels last under a microsecond: HTA must still break its device time down
    assert summary["gpu"] is not None and "gpu_unavailable" not in summary, summary.get("gpu_unavailable")
    gpu = summary["gpu"]
    assert 0 < gpu["busy_us"] <= gpu["span_us"]
    assert gpu["compute_us"] + gpu["non_compute_us"] == pytest.approx(gpu["busy_us"], rel=1e-6)
    assert summary["kernels_per_env_step"] > 0 and summary["launches_per_env_step"] > 0
    assert summary["phases_device_us"]["learn"] > 0
    trace = trace_events.load(out / "trace.json.gz")
    kernel_names = {e["name"] for e in trace_events.complete_events(trace, trace_events.GPU_ACTIVITY_CATEGORIES)}
    assert summary["top_kernels"]
    for kernel in summary["top_kernels"]:
        assert kernel["calls"] >= 1 and kernel["total_us"] > 0
        assert kernel["name"] in kernel_names or kernel["name"] == "others"
    sources = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    if profile["utilization"]["unavailable"] is None:
        assert any(name.startswith("NVML GPU-") for name in sources)
