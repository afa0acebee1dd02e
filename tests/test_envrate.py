"""`python -m benches.envrate`: the trainer's own env stepped alone, its start-up and rate printed, bad input
refused in one line."""

import os
import re
import subprocess
import sys
import time

import pytest


def envrate(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RLPERF_LOCK": str(tmp_path / "lock")}  # a lock of its own: no wait behind a sweep
    return subprocess.run([sys.executable, "-m", "benches.envrate", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_the_synthetic_env_alone_reports_its_start_and_rate(tmp_path):
    proc = envrate(tmp_path, "--env", "synthetic", "--num-envs", "8", "--obs-shape", "4,84,84", "--obs-dtype",
                   "uint8", "--steps", "10", "--repeats", "3")
    assert proc.returncode == 0, proc.stderr
    assert "synthetic: 8 envs, observations [4, 84, 84] uint8" in proc.stdout
    start = re.search(r"start-up (\d+\.\d\d) s: construction (\d+\.\d\d) s, then the first reset (\d+\.\d\d) s",
                      proc.stdout)
    assert start and float(start[1]) == pytest.approx(float(start[2]) + float(start[3]), abs=0.011)
    rates = re.search(r"env alone: ([\d,]+) agent steps/s, median of 3 x 10 steps \(([\d, ]+)\)", proc.stdout)
    assert rates and float(rates[1].replace(",", "")) > 0 and len(rates[2].split(", ")) == 3


def test_a_native_env_alone_runs_with_the_threads_it_was_given(tmp_path):
    pytest.importorskip("ale_py")
    proc = envrate(tmp_path, "--env", "gym:ale_py:ALE/Breakout-v5", "--num-envs", "2", "--env-threads", "1",
                   "--steps", "5", "--repeats", "1", "--warmup-steps", "0")
    assert proc.returncode == 0, proc.stderr
    assert "2 envs, 1 env threads, observations [4, 84, 84] uint8" in proc.stdout


@pytest.mark.parametrize("args, field", [
    (("--env", "memory", "--env-threads", "2"), "env_threads"),
    (("--num-envs", "0"), "num_envs"),
    (("--steps", "0"), "steps"),
    (("--env", "nowhere"), "env"),
])
def test_bad_input_is_one_line_naming_its_field(tmp_path, args, field):
    proc = envrate(tmp_path, *args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and f"error: {field}: " in proc.stderr


def test_groups_step_at_once_as_the_trainer_steps_them(monkeypatch, capsys):
    """Two groups of gymnasium's sync copies, each step sleeping 50 ms outside the interpreter lock: stepped at
    once, as the trainer's steppers step them, a step of all 4 envs takes about 50 ms, not 100."""
    from benches import envrate as envrate_module
    from reference_trainer import envs as envs_module

    make_env = envs_module.make_env

    def slow_env(*args, **kwargs):
        env = make_env(*args, **kwargs)
        step = env.step
        env.step = lambda actions: (time.sleep(0.05), step(actions))[1]
        return env

    monkeypatch.setattr(envs_module, "make_env", slow_env)
    cfg = envrate_module.env_config(env="gym:CartPole-v1", vectorization="sync", num_envs=4, env_groups=2)
    result = envrate_module.measure(cfg, steps=6, repeats=1, warmup_steps=0)
    assert 4 / 0.075 < result["median"] < 4 / 0.05


def test_groups_are_named_in_the_first_line(tmp_path):
    proc = envrate(tmp_path, "--env", "gym:CartPole-v1", "--vectorization", "sync", "--num-envs", "4",
                   "--env-groups", "2", "--steps", "5", "--repeats", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("gym:CartPole-v1: 4 envs in 2 groups stepped at once, observations [4] float32")


def test_an_interrupt_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    """What a CI step's time cap or Ctrl-C does mid-measurement: one line, no traceback."""
    from benches import envrate as envrate_module

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(envrate_module, "measure", interrupted)
    monkeypatch.setenv("RLPERF_LOCK", str(tmp_path / "lock"))
    with pytest.raises(SystemExit) as exit_:
        envrate_module.main(["--env", "synthetic", "--num-envs", "4"])
    assert exit_.value.code == 130 and capsys.readouterr().err == "python -m benches.envrate: interrupted\n"
