"""`rlperf attach` on trainers rlperf did not write (profilers/attach.py): a hand-written Gymnasium loop, and
stable-baselines3's and TorchRL's PPO from the registry, unedited. Phases cover the steady time with `other`
shown, injected delays land in their phases, the agent steps counted are the trainer's own, and bad input is one
line. Tiny settings; benches/attach_trainers.py measures the larger ones."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

from profilers.attach_command import attached_environment
from profilers.command_check import shares_of
from profilers.interference import InterferenceMonitor
from rlperf.machine import REPO_ROOT
from rlperf.summary import OTHER, RunSummary

ATTACHED = ("env", "eval_forward", "train_forward", "learn")
# each phase's delay, large against how far an epoch's phase moves between two processes on a busy 2-core machine
# (a few milliseconds at these settings)
DELAY_MS = 150.0

HAND_LOOP = textwrap.dedent("""
    import time, sys
    import gymnasium as gym
    import torch
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(4)])
    policy = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.Adam(policy.parameters())
    obs, _ = envs.reset(seed=0)
    steps = 0
    for update in range(4):
        batch = []
        for step in range(16):
            with torch.no_grad():
                action = policy(torch.as_tensor(obs)).argmax(-1).numpy()
            obs, reward, term, trunc, _ = envs.step(action)
            steps += envs.num_envs
            batch.append(torch.as_tensor(obs))
        time.sleep(0.01)  # the loop's own work between rollout and update: other
        loss = policy(torch.cat(batch)).logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    time.sleep(0.3)  # after the last update: in no epoch
    print(steps)
""")


def attached(command: list[str], tmp_path, delays: dict[str, float] | None = None, name: str = "summary",
             timeout: float = 120) -> tuple[RunSummary, str]:
    path = tmp_path / f"{name}.json"
    env = attached_environment(path, delays)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return RunSummary.check(json.loads(path.read_text())), done.stdout


def test_a_hand_written_gymnasium_loop_is_attributed_without_a_line_changed(tmp_path):
    # the command's interpreter has a sitecustomize of its own, which the bootstrap shadows: it still runs
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    script = tmp_path / "loop.py"
    script.write_text(HAND_LOOP.replace("print(steps)", "print(os.environ.get('THEIRS_RAN'), steps)")
                      .replace("import time, sys", "import time, sys, os"))
    path = tmp_path / "summary.json"
    env = attached_environment(path, base={**os.environ, "PYTHONPATH": str(theirs)})
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    ran, steps = done.stdout.split()[-2:]
    assert ran == "yes"
    summary = RunSummary.check(json.loads(path.read_text()))
    assert summary.writer == "attach" and len(summary.epochs) == 4
    assert summary.steps == int(steps) == 4 * 16 * 4 and summary.steady_steps == 3 * 16 * 4
    assert all(summary.phases[name] > 0 for name in ATTACHED)
    # the sleep between rollout and update is other, and little else is; the one after the last update is in no epoch
    slept = 3 * 0.010
    assert slept <= summary.phases[OTHER] < slept + sum(summary.phases[name] for name in ATTACHED)
    assert summary.wall_seconds - sum(epoch["seconds"] for epoch in summary.epochs) >= 0.3
    assert summary.attached["env_classes"] == ["gymnasium.vector.sync_vector_env.SyncVectorEnv"]
    assert "torch.optim.optimizer.register_optimizer_step_post_hook" in summary.attached["hooks"]
    # the global module hooks found the one root and were gone after the first optimizer step
    assert summary.attached["root_modules"] == 1 and summary.attached["global_module_hooks_on"] is False


# one warm-up epoch and three steady ones each; the policies wide enough that their glue stays under a tenth
SB3 = [sys.executable, "-m", "benches.trainers.sb3_ppo", "--updates", "4", "--n-envs", "16", "--n-steps", "64",
       "--batch-size", "256", "--n-epochs", "4", "--net", "256"]
TORCHRL = [sys.executable, "-m", "benches.trainers.torchrl_ppo", "--updates", "4", "--n-envs", "8", "--n-steps",
           "64", "--batch-size", "256", "--n-epochs", "2", "--net", "128"]


@pytest.mark.parametrize("library, command, own_count", [("stable_baselines3", SB3, "num_timesteps"),
                                                         ("torchrl", TORCHRL, "collected_frames")],
                         ids=["stable-baselines3", "torchrl"])
def test_a_registry_trainers_ppo_is_attributed_and_its_delays_land_in_their_phases(tmp_path, library, command,
                                                                                  own_count):
    pytest.importorskip(library)
    plain, out = attached(command, tmp_path, name="plain")
    own = json.loads(out.strip().splitlines()[-1])
    # the agent steps counted from the env are the trainer's own count, over the same window: the whole run
    assert plain.steps == own[own_count] and plain.steady_steps == 3 * plain.epochs[-1]["steps"]
    assert all(plain.phases[name] > 0 for name in ATTACHED) and OTHER in plain.phases
    assert plain.phase_coverage >= 0.90, plain.phases
    monitor = InterferenceMonitor()
    monitor.start()
    delayed, _ = attached(command, tmp_path, dict.fromkeys(ATTACHED, DELAY_MS), name="delayed")
    busy = monitor.stop()
    shares = shares_of(plain, delayed, ATTACHED, DELAY_MS)
    # a share short of its delay fails on a quiet machine; beside another process's load it proves nothing, as
    # `rlperf selfcheck` says (the monitor's rule)
    assert all(share >= 0.95 for share in shares.values()) or busy["contended"], (shares, busy)


def test_rlperf_profile_traces_an_attached_loops_steady_epoch_with_its_phase_ranges(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(HAND_LOOP)
    out = tmp_path / "profile"
    done = subprocess.run([sys.executable, "-m", "rlperf", "profile", "--out", str(out), "--sample-hz", "50", "--",
                           sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    with gzip.open(out / "trace.json.gz", "rt") as file:
        trace = json.load(file)  # a Chrome trace: JSON
    ranges = Counter(event["name"] for event in trace["traceEvents"]
                     if event.get("ph") == "X" and event.get("cat") == "user_annotation")
    # one steady epoch of 16 env steps and their acting forwards, one training forward and its learn step
    assert ranges["env"] == ranges["eval_forward"] == 16 and ranges["train_forward"] == ranges["learn"] == 1, ranges
    assert ranges["ProfilerStep#1"] == 1 and ranges[OTHER] > 16
    track = [event for event in trace["traceEvents"] if event.get("cat") == "rlperf_phase"]  # the timeline merged
    assert len(track) == sum(ranges[name] for name in (*ATTACHED, OTHER))
    profile = json.loads((out / "profile.json").read_text())
    assert profile["config"]["command"] == [sys.executable, str(script)] and profile["config"]["attach"] is True
    found = profile["trace_summary"]
    assert found["traced_epochs"] == 1 and found["env_steps"] == 16 * 4 and found["phases_host_us"]["learn"] > 0
    assert profile["clock_check"]["matched_ranges"] == len(track)
    assert "phases in the trace (ms)" in done.stdout and "other" in done.stdout


def test_a_command_that_is_not_found_fails_or_writes_no_summary_is_one_line(tmp_path):
    def attach(*command: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rlperf", "attach", "--", *command], capture_output=True,
                              text=True, timeout=60, cwd=tmp_path)

    missing = attach("no-such-trainer", "--fast")
    assert missing.returncode == 2
    assert missing.stderr == "rlperf attach: error: command: 'no-such-trainer' not found (allowed: a program on " \
                             "PATH or a path to one)\n"
    failing = attach(sys.executable, "-c", "raise SystemExit(3)")
    assert failing.returncode == 3 and failing.stderr.endswith("rlperf attach: the command exited with code 3\n")
    idle = attach(sys.executable, "-c", "pass")
    assert idle.returncode == 1
    assert idle.stderr.splitlines()[-2:] == [
        "rlperf.phases: no summary written: no epoch ended (end_epoch was never called, or the run ended before its "
        "first update)",
        "rlperf attach: error: command: exited 0 but wrote no summary (its last lines say why: no epoch ended, "
        "or no phase was marked)"]


@pytest.mark.gpu
def test_on_cuda_an_attached_sb3_ppo_lands_each_delay_in_its_phase(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("stable_baselines3")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    command = [*SB3, "--device", "cuda"]
    plain, _ = attached(command, tmp_path, name="plain")
    assert plain.device_name != "cpu"
    monitor = InterferenceMonitor()
    monitor.start()
    delayed, _ = attached(command, tmp_path, dict.fromkeys(ATTACHED, DELAY_MS), name="delayed")
    busy = monitor.stop()
    shares = shares_of(plain, delayed, ATTACHED, DELAY_MS)
    # a share short of its delay fails on a quiet machine; beside another process's load it proves nothing, as
    # `rlperf selfcheck` says (the monitor's rule)
    assert all(share >= 0.95 for share in shares.values()) or busy["contended"], (shares, busy)
