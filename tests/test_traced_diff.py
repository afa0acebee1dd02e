"""Traced diffs: a CUDA trace's phases broken down from its events, the rule that claims a change only beyond each
side's process spread, `rlperf diff`'s refusals, and `rlperf profile --against` end to end on the CPU."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from command.cli import main
from decisions.trace_diff import diff, judged, refusal
from profilers.profile_sets import TracedProcess
from profilers import trace_events
from profilers.trace_phases import phase_breakdown

HOST, DEVICE, STREAM = 4242, 0, 7
TINY = ["--env", "synthetic", "--num-envs", "8", "--horizon", "8", "--minibatch-size", "32", "--hidden-size", "16",
        "--total-steps", "192", "--warmup-epochs", "1", "--trace-epochs", "1", "--device", "cpu"]


def cuda_trace(gemm_us: float = 30.0, extra_kernel_us: float = 0.0) -> dict:
    """One epoch as Kineto writes a CUDA run: `env` copies 4096 bytes host to device; `learn` runs aten::mm, which
    launches a gemm kernel (and, with `extra_kernel_us`, a second kernel), then synchronises the stream."""
    gpu = {"device": 0, "stream": STREAM}

    def x(cat, name, pid, ts, dur, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": STREAM if pid == DEVICE else HOST, "ts": ts,
                "dur": dur, "args": args}

    learn_us = 100.0 + gemm_us + extra_kernel_us
    events = [
        x("user_annotation", "ProfilerStep#1", HOST, 0.0, 400.0),
        x("user_annotation", "env", HOST, 10.0, 50.0), x("gpu_user_annotation", "env", DEVICE, 20.0, 30.0, **gpu),
        x("cuda_runtime", "cudaMemcpyAsync", HOST, 20.0, 4.0, correlation=1),
        x("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", DEVICE, 25.0, 10.0, correlation=1, bytes=4096, **gpu),
        x("user_annotation", "learn", HOST, 100.0, learn_us),
        x("gpu_user_annotation", "learn", DEVICE, 110.0, gemm_us + extra_kernel_us, **gpu),
        x("cpu_op", "aten::mm", HOST, 101.0, 20.0),
        x("cuda_runtime", "cudaLaunchKernel", HOST, 102.0, 5.0, correlation=2),
        x("kernel", "ampere_sgemm_64x64", DEVICE, 110.0, gemm_us, correlation=2, **gpu),
        x("cuda_runtime", "cudaStreamSynchronize", HOST, 150.0, 8.0, correlation=4),
    ]
    if extra_kernel_us:
        events += [x("cuda_runtime", "cudaLaunchKernel", HOST, 130.0, 5.0, correlation=3),
                   x("kernel", "vectorized_elementwise_kernel", DEVICE, 110.0 + gemm_us, extra_kernel_us,
                     correlation=3, **gpu)]
    return {"traceEvents": events}


def test_a_cuda_traces_kernels_launches_syncs_and_copies_land_in_their_phases(tmp_path):
    (tmp_path / "trace.json").write_text(json.dumps(cuda_trace()))  # a Chrome trace file, as Kineto writes one
    phases = phase_breakdown(trace_events.load(tmp_path / "trace.json"), ("env", "learn"), device_ranges=True)
    learn, env = phases["learn"], phases["env"]
    assert learn["host_us"] == 130.0 and learn["device_us"] == 30.0
    assert learn["kernels"] == {"ampere_sgemm_64x64": [30.0, 1]}
    assert learn["launches"] == 1 and learn["syncs"] == 1 and learn["copy_bytes"] == 0
    assert learn["operators"] == {"aten::mm": [15.0, 1]}  # its 5 us launch call is not its own time
    assert env["copy_bytes"] == 4096 and env["launches"] == 0 and env["kernels"] == {}
    assert phases["other"]["host_us"] == 0.0


def process(name: str, trace: dict, scale: float = 1.0, memory: dict | None = None,
            settings: dict | None = None) -> TracedProcess:
    """A traced process whose times are the trace's times `scale`d (one process's luck)."""
    by_phase = phase_breakdown(trace, ("env", "learn"), device_ranges=True)
    for phase in by_phase.values():
        phase["host_us"] *= scale
        phase["device_us"] *= scale
        for table in (phase["operators"], phase["kernels"]):
            for figures in table.values():
                figures[0] *= scale
    return TracedProcess(name, "reference", settings or {"num_envs": 8}, "gpu", 10, by_phase, memory, Path(name))


def test_a_kernel_that_grew_leads_its_phase_and_a_new_one_is_named_new():
    ref = [process(f"ref{i}", cuda_trace(), scale) for i, scale in enumerate((1.0, 1.02, 0.99))]
    new = [process(f"new{i}", cuda_trace(gemm_us=60.0, extra_kernel_us=5.0), scale)
           for i, scale in enumerate((1.01, 0.98, 1.0))]
    found = diff(ref, new)
    learn_device = next(r for r in found["phases"] if r["phase"] == "learn" and r["measure"] == "device")
    assert learn_device["verdict"] == "grown"
    assert all(r["verdict"] == "unchanged" for r in found["phases"] if r["phase"] == "env")
    kernels = found["changed"][0]["kernels"]
    assert [k["name"] for k in kernels] == ["ampere_sgemm_64x64", "vectorized_elementwise_kernel"]
    assert kernels[0]["verdict"] == "grown" and kernels[0]["ref_calls"] == pytest.approx(0.1)
    assert kernels[0]["new_calls"] == pytest.approx(0.1)
    assert kernels[1]["presence"] == "new"
    counts = {row["name"]: row for row in found["counts"]}
    assert counts["launches"]["ref"] == pytest.approx(0.1) and counts["launches"]["new"] == pytest.approx(0.2)
    assert counts["syncs"]["new"] == pytest.approx(0.1) and counts["bytes copied"]["ref"] == pytest.approx(409.6)
    assert found["memory"] is None  # no side measured memory: no rows


def test_a_change_within_the_processes_spread_is_not_claimed():
    same = [process(f"p{i}", cuda_trace(), scale) for i, scale in enumerate((1.0, 1.3, 0.8, 1.1))]
    assert diff(same[:2], same[2:])["claims"] == []
    # a 10% change against about 1% spread is claimed; against 30% it is not
    assert judged([100, 101, 99], [110, 111, 109], 0.05, 1.0)["verdict"] == "grown"
    assert judged([100, 130, 80], [110, 140, 90], 0.05, 1.0)["verdict"] == "unchanged"
    assert judged([100], [200], 0.05, 1.0)["verdict"] == "no spread"


def test_memory_rows_only_where_both_sides_measured_it():
    memory = {"host_peak_rss_bytes": 500_000_000, "device_peak_allocated_bytes": 100_000_000,
              "device_peak_reserved_bytes": 200_000_000,
              "phases": {"learn": {"device_peak_allocated_bytes": 90_000_000, "device_peak_reserved_bytes": 2e8}}}
    grown = {**memory, "device_peak_allocated_bytes": 150_000_000}
    ref = [process("r1", cuda_trace(), 1.0, memory), process("r2", cuda_trace(), 1.01, {**memory,
                                                                                       "host_peak_rss_bytes": 5.01e8})]
    new = [process("n1", cuda_trace(), 1.0, grown), process("n2", cuda_trace(), 1.01, {**grown,
                                                                                     "device_peak_allocated_bytes": 1.51e8})]
    rows = {row["name"]: row for row in diff(ref, new)["memory"]}
    assert set(rows) == {"host_peak_rss_bytes", "device_peak_allocated_bytes", "device_peak_reserved_bytes",
                         "learn device_peak_allocated_bytes", "learn device_peak_reserved_bytes"}
    assert rows["device_peak_allocated_bytes"]["verdict"] == "grown"
    assert diff(ref, [process("n", cuda_trace()), process("m", cuda_trace())])["memory"] is None


def test_other_settings_or_phases_are_refused_naming_which():
    ref = [process("r", cuda_trace())]
    assert refusal({"A": ref, "B": [process("n", cuda_trace(), settings={"num_envs": 16})]}).startswith(
        "settings: num_envs 8 against 16")
    assert refusal({"A": ref, "B": [process("n", cuda_trace(), settings={"num_envs": 8, "device": "cuda",
                                                                         "seed": 3})]}) is None
    command = process("c", cuda_trace())
    command.by_phase = {"env": command.by_phase["env"], "acting": command.by_phase["learn"]}
    assert refusal({"A": ref, "B": [command]}).startswith("phases: A has env, learn, other; B has env, acting")


@pytest.fixture(scope="module")
def against(tmp_path_factory):
    """Two processes a side of the working tree against HEAD, the reference trainer at its smallest."""
    out = tmp_path_factory.mktemp("against") / "diff"
    done = subprocess.run([sys.executable, "-m", "rlperf", "profile", *TINY, "--out", str(out), "--against", "HEAD",
                           "--processes", "2"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return out, done


def test_profile_against_traces_both_sides_in_turn_and_writes_the_diff(against):
    out, done = against
    for side in ("ref", "new"):
        for index in (1, 2):
            assert (out / side / str(index) / f"trace-{side}-{index}.json.gz").exists()
    found = json.loads((out / "diff.json").read_text())
    assert [row["phase"] for row in found["phases"] if row["measure"] == "host"][:2] == ["env", "eval_copy"]
    assert len(found["processes"]["ref"]) == len(found["processes"]["new"]) == 2
    assert "# Traced diff" in (out / "diff.md").read_text() and "<table>" in (out / "diff.html").read_text()
    order = [line for line in done.stdout.splitlines() if line.startswith("profile: tracing")]
    assert [("HEAD" in line) for line in order] == [True, False, True, False]  # A B A B
    assert "2 against 2 traced processes" in done.stdout


def test_diff_of_the_same_directories_reads_the_same_diff(against, tmp_path, capsys):
    out, _ = against
    assert main(["diff", str(out / "ref"), str(out / "new"), "--json", str(tmp_path / "d.json")]) == 0
    again = json.loads((tmp_path / "d.json").read_text())
    assert again["phases"] == json.loads((out / "diff.json").read_text())["phases"]
    assert main(["diff", str(out / "ref" / "1"), str(out / "new" / "1")]) == 0
    assert "one process a side has no spread" in capsys.readouterr().out


def test_diff_refuses_other_settings_in_one_line(against, tmp_path, capsys):
    out, _ = against
    other = tmp_path / "other"
    profile = json.loads((out / "new" / "1" / "profile.json").read_text())
    profile["config"]["horizon"] = 4
    other.mkdir()
    (other / "profile.json").write_text(json.dumps(profile))
    assert main(["diff", str(out / "ref"), str(other)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("rlperf diff: error: settings: horizon 8 against 4") and "\n" not in error
    (tmp_path / "empty").mkdir()
    assert main(["diff", str(out / "ref"), str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err.startswith("rlperf diff: error: b: ")


def test_the_chains_last_line_is_a_command_that_parses_and_a_spent_budget_skips_it():
    from benches.traced_against import against_command, follow_up
    from command.cli import build_parser

    point = {"env": "synthetic", "num_envs": 32, "total_steps": 8192, "trace_epochs": 1, "device": "cpu"}
    command = against_command(point, "abc1234~1", "abc1234", "runs/traced-diff")
    assert command[:2] == ["rlperf", "profile"] and command[-6:] == ["--against", "abc1234~1", "--at", "abc1234",
                                                                      "--out", "runs/traced-diff"]
    parsed = build_parser(["profile"]).parse_args(command[1:])
    assert (parsed.env, parsed.num_envs, parsed.total_steps, parsed.against) == ("synthetic", 32, 8192, "abc1234~1")
    other = against_command({"command": ["python", "train.py"], "device": "cpu", "warmup_epochs": 2}, "HEAD", None, "d")
    assert build_parser(["profile"]).parse_args(other[1:]).argv == ["--", "python", "train.py"]
    lines = []
    follow_up(lines.append, point, "HEAD~1", None, "runs/d", run=True, deadline=0.0)  # the night already spent
    assert lines[0].startswith("which operator: rlperf profile --env synthetic") and lines[1].startswith("diff: skipped")
