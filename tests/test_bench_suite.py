"""Suite files: expansion, exclusion, the shipped suites, and bad input refused before anything is stored."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from benches import suite as suites
from rlperf.machine import Machine
from rlperf.store import Store
from reference_trainer.config import TrainConfig
from rlperf.errors import BadInput

GOOD = """
    repeats = 2
    [fixed]
    env = "synthetic"
    horizon = 8
    minibatch_size = 64
    total_steps = 2048
    [axes]
    num_envs = [8, 16]
    dtype = ["fp32", "bf16"]
    [[exclude]]
    num_envs = 16
    dtype = "bf16"
"""


def write(tmp_path, text, name="suite.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_axes_expand_to_the_cartesian_product_less_the_excluded_points(tmp_path):
    suite = suites.load(str(write(tmp_path, GOOD)))
    assert [p.axes for p in suite.points] == [
        {"num_envs": 8, "dtype": "fp32"}, {"num_envs": 8, "dtype": "bf16"}, {"num_envs": 16, "dtype": "fp32"}]
    assert suite.points[0].key == '{"dtype":"fp32","num_envs":8}'
    config = suite.points[1].config
    assert config == {**TrainConfig().to_dict(), "env": "synthetic", "horizon": 8, "minibatch_size": 64,
                      "total_steps": 2048, "num_envs": 8, "dtype": "bf16"}
    assert suite.repeats == 2 and suite.timeout_s == 600.0


def test_sweep_blocks_cross_the_top_level_axes_and_pool_their_points(tmp_path):
    path = write(tmp_path, """
        [fixed]
        env = "synthetic"
        [axes]
        num_envs = [64, 128]
        [[sweep]]
        [[sweep]]
        lstm = [false]
        [[sweep]]
        device = ["cuda"]
        pinned = [true]
    """)
    labels = [p.label for p in suites.load(str(path)).points]
    assert labels == ["num_envs=64", "num_envs=128", "num_envs=64, lstm=false", "num_envs=128, lstm=false",
                      "num_envs=64, device=cuda, pinned=true", "num_envs=128, device=cuda, pinned=true"]


def test_shipped_suites_load_and_smoke_sweeps_batch_dtype_and_lstm_on_cpu():
    assert {"smoke", "nightly", "hardware"} <= set(suites.available_suites())
    smoke = suites.load("smoke")
    assert set(smoke.axis_names) == {"num_envs", "dtype", "lstm"}
    assert len(smoke.points) == 8 and all(p.config["device"] == "cpu" for p in smoke.points)
    nightly = suites.load("nightly")
    knobs = {name for p in nightly.points for name in p.axes}
    assert {"pinned", "non_blocking", "copy_stream", "env_groups", "cuda_graphs", "compile", "world_size", "dtype"} <= knobs
    assert {p.config["num_envs"] for p in nightly.points} == {1024, 4096}
    hardware = suites.load("hardware")
    assert {p.config["device"] for p in hardware.points} == {"cpu", "cuda"}
    for name, device in (("learning", "cpu"), ("learning-atari", "cuda")):
        learning = suites.load(name)
        assert all(p.config["target_return"] is not None and p.config["device"] == device for p in learning.points)
        assert learning.repeats >= 5  # at 4 seeds a side even a complete separation gives log-rank p = 0.007


def test_device_override_changes_the_points_and_the_suite_hash():
    plain = suites.load("smoke")
    assert suites.load("smoke", {"device": "cpu"}).suite_hash != plain.suite_hash
    with pytest.raises(BadInput, match="device: is swept as an axis"):
        suites.load("hardware", {"device": "cpu"})


@pytest.mark.parametrize("text, message", [
    ("[axes\nnum_envs = [1]", r"suite\.toml: not valid TOML"),
    ("warmup = 1", r"suite\.toml: warmup: unknown key \(allowed: description, repeats"),
    ("[axes]\nbatch = [1, 2]", r"suite\.toml: axes\.batch: unknown setting \(allowed: env, seed"),
    ("[axes]\nnum_envs = [64, \"128\"]", r"suite\.toml: axes\.num_envs\[1\]: must be int \(got str '128'\)"),
    ("[axes]\nnum_envs = 64", r"suite\.toml: axes\.num_envs: must be a non-empty list of values \(got 64\)"),
    ("[axes]\nnum_envs = [0]", r"suite\.toml: point \[num_envs=0\]: num_envs: must be a positive number"),
    ("[axes]\ndtype = [\"fp8\"]", r"point \[dtype=fp8\]: dtype: unknown dtype 'fp8' \(allowed: fp32, bf16, fp16\)"),
    ("repeats = 0", r"suite\.toml: repeats: must be how many times .* \(got 0\)"),
    ("sample_hz = -1", r"suite\.toml: sample_hz: must be utilization samples"),
    ("[fixed]\ntrace_dir = \"t\"", r"fixed\.trace_dir: unknown setting \(tracing belongs to `rlperf profile`\)"),
    ("[fixed]\nlstm = 1", r"suite\.toml: fixed\.lstm: must be bool \(got int 1\)"),
    ("[fixed]\nlstm = true\n[axes]\nlstm = [true, false]", r"fixed\.lstm: is also swept as an axis"),
    ("[axes]\nlstm = [true]\n[[exclude]]\ndtype = \"bf16\"", r"exclude\[0\]\.dtype: is not an axis of this suite"),
    ("[axes]\nlstm = [true]\n[[exclude]]\nlstm = true", r"suite\.toml: exclude: removes every point"),
    ("[fixed]\nlearning_rate = nan", r"point \[default\]: learning_rate: must be a finite number \(got nan\)"),
    # refused before 4 million points are checked one by one
    ("[axes]\nseed = [" + ", ".join(map(str, range(1, 2001))) + "]\nhidden_size = ["
     + ", ".join(map(str, range(1, 2001))) + "]",
     r"suite\.toml: axes: cross into 4,000,000 points \(allowed: at most 10,000\)"),
])
def test_bad_suites_name_the_file_the_key_and_what_is_allowed(tmp_path, text, message):
    with pytest.raises(BadInput, match=message):
        suites.load(str(write(tmp_path, text)))


def test_unknown_suite_name_lists_the_shipped_ones():
    with pytest.raises(BadInput, match=r"suite: unknown suite 'smok' \(allowed: atari, doctor-night, envs-curve, gate, "
                                  r"gpu-smoke, hardware, learning, learning-atari, nightly, overhead, sb3-ppo, smoke, "
                                  r"torchrl-ppo"):
        suites.load("smok")


def test_bad_suite_on_the_command_line_exits_2_with_one_line_and_leaves_the_store_alone(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with Store.open(out / "results.sqlite") as store:
        store.create_run("earlier", "h", {"git": {}}, "m")
        before = store.row_counts()
    bad = write(tmp_path, "[axes]\nnum_envs = [64, -1]")
    done = subprocess.run([sys.executable, "-m", "rlperf", "bench", "--suite", str(bad), "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "suite.toml: point [num_envs=-1]: num_envs: must be a positive number" in done.stderr
    with Store.open(out / "results.sqlite", readonly=True) as store:
        assert store.row_counts() == before
    assert sorted(p.name for p in out.iterdir()) == ["results.sqlite"]


def test_bad_option_values_are_refused_by_the_parser(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rlperf", "bench", "--repeats", "0"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == ("rlperf bench: error: argument --repeats: must be a whole number of 1 or more "
                                   "(got '0')")


def test_points_that_need_missing_gpus_get_a_reason():
    cpu_only = Machine(torch="2.13.0+cpu", cuda=None, cudnn=None, nccl=None, gpus=[])
    base = TrainConfig().to_dict()
    assert cpu_only.skip_reason(base) is None
    assert "needs a CUDA GPU; none is visible (torch 2.13.0+cpu (CPU build))" in cpu_only.skip_reason(
        {**base, "device": "cuda", "cuda_graphs": True})
    one_gpu = Machine(torch="2.13.0", cuda="12.8", cudnn=91000, nccl="2.27.3",
                      gpus=[{"index": 0, "name": "NVIDIA H100", "uuid": "GPU-abc", "bf16": True}])
    assert one_gpu.skip_reason({**base, "device": "cuda"}) is None
    assert one_gpu.gpu_uuids({**base, "device": "cuda"}) == ["GPU-abc"]
    assert one_gpu.gpu_uuids(base) == []
    assert one_gpu.skip_reason({**base, "device": "cuda", "world_size": 2}) == (
        "device=cuda with world_size=2 needs 2 GPUs; 1 visible")
    assert one_gpu.resolve_device("auto") == "cuda" and cpu_only.resolve_device("auto") == "cpu"


@pytest.mark.parametrize("device, chosen", [("cpu", "smoke"), ("cuda", "gpu-smoke"), ("cuda:1", "gpu-smoke")])
def test_nox_bench_runs_the_smoke_suite_of_the_machines_first_device(device, chosen):
    assert suites.smoke_suite(device) == chosen
    suite = suites.load(chosen, {"device": device})
    assert {p.config["device"] for p in suite.points} == {device}


def test_the_gpu_smoke_measures_sizes_where_a_gpu_means_something_in_few_processes():
    smoke = suites.load("gpu-smoke")
    configs = [p.config for p in smoke.points]
    assert all(c["device"] == "cuda" and c["hidden_size"] == 128 and c["lstm"] for c in configs)
    assert {c["num_envs"] for c in configs} == {1024, 4096}
    assert {(c["cuda_graphs"], c["dtype"]) for c in configs if c["num_envs"] == 4096} == {
        (False, "fp32"), (True, "fp32"), (False, "bf16"), (True, "bf16")}
    # three minutes with the peaks: at most one process a point, each at most 16 epochs
    assert smoke.repeats * len(configs) <= 5
    assert all(c["total_steps"] // (c["num_envs"] * c["horizon"]) <= 16 for c in configs)


def test_the_envs_curve_times_the_trainer_alone_on_a_gpu_from_1024_to_65536_envs():
    curve = suites.load("envs-curve")
    configs = [p.config for p in curve.points]
    assert [c["num_envs"] for c in configs] == [1024 << k for k in range(7)]
    assert all(c["device"] == "cuda" and c["cuda_graphs"] and c["env"] == "synthetic-device"
               and c["hidden_size"] == 128 for c in configs)
    # the same number of updates at every size: the minibatch grows with the envs
    assert {c["num_envs"] * c["horizon"] // c["minibatch_size"] for c in configs} == {16}
