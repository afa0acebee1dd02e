"""`rlperf attach` on trainers rlperf did not write (profilers/attach.py): a hand-written Gymnasium loop, and
stable-baselines3's and TorchRL's PPO from the registry, unedited. Phases cover the steady time with `other`
shown, injected delays land in their phases, the agent steps counted are the trainer's own, and bad input is one
line. Tiny settings; benches/attach_trainers.py measures the larger ones."""

from __future__ import annotations

import gzip
import json
import os
import statistics
import subprocess
import sys
import textwrap
from collections import Counter

import pytest

from profilers.attach_command import attached_environment
from decisions.attribution import DELAY_EVERY, paired_shares
from profilers.interference import InterferenceMonitor
from rlperf.machine import REPO_ROOT
from rlperf.summary import OTHER, RunSummary

ATTACHED = ("env", "eval_forward", "eval_misc", "train_forward", "learn")
# each phase's delay, large against how far an epoch's phase moves from one epoch to the next on a busy 2-core
# machine (a few milliseconds at these settings, tens in a rare epoch)
DELAY_MS = 200.0

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
        time.sleep(0.01)  # the loop's own work between rollout and update: train_misc
        loss = policy(torch.cat(batch)).logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        time.sleep(0.005)  # after each update, before the next rollout: other (logging, checkpoints)
    time.sleep(0.3)  # after the last update: in no epoch
    print(steps)
""")


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
    # the process's peak resident set (torch alone holds more than 64 MiB); no device figures off CUDA
    assert summary.memory["host_peak_rss_bytes"] > 2 ** 26 and summary.memory["device_peak_reserved_bytes"] is None
    assert summary.steps == int(steps) == 4 * 16 * 4 and summary.steady_steps == 3 * 16 * 4
    assert all(summary.phases[name] > 0 for name in ATTACHED)
    # by position: the sleep between rollout and update is train_misc, the one after an update other (two of the
    # steady epochs hold one: the last update's is in no epoch, as the sleep after it is)
    claimed = sum(summary.phases[name] for name in ATTACHED)
    assert 3 * 0.010 <= summary.phases["train_misc"] < 3 * 0.010 + claimed
    assert 2 * 0.005 <= summary.phases[OTHER] < 2 * 0.005 + claimed
    assert summary.phases["eval_misc"] > 0  # the conversions between each env step and the next forward
    assert summary.wall_seconds - sum(epoch["seconds"] for epoch in summary.epochs) >= 0.3
    assert summary.attached["env_classes"] == ["gymnasium.vector.sync_vector_env.SyncVectorEnv"]
    assert "torch.optim.optimizer.register_optimizer_step_post_hook" in summary.attached["hooks"]
    # the global module hooks found the one root and were gone after the first optimizer step
    assert summary.attached["root_modules"] == 1 and summary.attached["global_module_hooks_on"] is False
    # the env library the command imported, with its version
    assert summary.versions["gymnasium"] == __import__("gymnasium").__version__


# one Gymnasium env stepped alone, and a vector env whose step the loop splits to overlap its own work
ONE_ENV_STEP = """
        obs, reward, term, trunc, _ = envs.step(int(action[0]))
        if term or trunc:
            obs, _ = envs.reset()
        obs = obs[None]"""
SPLIT_STEP = """
        envs.step_async(action)
        obs, reward, term, trunc, _ = envs.step_wait()"""
GYMNASIUM_LOOPS = {
    "one env": ('gym.make("CartPole-v1")', ONE_ENV_STEP, 1, "gymnasium.wrappers.common.TimeLimit"),
    "split vector step": ('gym.vector.AsyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)', SPLIT_STEP, 2,
                          "gymnasium.vector.async_vector_env.AsyncVectorEnv"),
    "vector env": ('gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2)',
                   "\n        obs, reward, term, trunc, _ = envs.step(action)", 2,
                   "gymnasium.vector.sync_vector_env.SyncVectorEnv"),
}


@pytest.mark.parametrize("kind", GYMNASIUM_LOOPS)
def test_gymnasium_steps_count_once_whether_one_env_a_vector_or_a_split_step(tmp_path, kind):
    make, step, agents, stepped = GYMNASIUM_LOOPS[kind]
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(f"""
        import json
        import gymnasium as gym
        import torch
        if __name__ == "__main__":
            torch.set_num_threads(1)
            envs = {make}
            policy = torch.nn.Linear(4, 2)
            optimizer = torch.optim.SGD(policy.parameters(), lr=0.01)
            obs, _ = envs.reset(seed=0)
            obs = obs.reshape(-1, 4)
            for update in range(3):
                for t in range(8):
                    with torch.no_grad():
                        action = policy(torch.as_tensor(obs)).argmax(-1).numpy()
    """) + textwrap.indent(textwrap.dedent(step), " " * 16) + textwrap.dedent("""
                loss = policy(torch.as_tensor(obs).reshape(-1, 4)).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            inner = gym.wrappers.TimeLimit.step
            print(json.dumps({"inner_step_timed": getattr(inner, "__rlperf_attached__", False)}))
    """).replace("\n", "\n    "))
    path = tmp_path / "summary.json"
    done = subprocess.run([sys.executable, str(script)], env=attached_environment(path), capture_output=True,
                          text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = RunSummary.check(json.loads(path.read_text()))
    assert summary.steps == 3 * 8 * agents and summary.attached["env_classes"] == [stepped]
    # a vector env's step restores the steps of the envs inside it: a vector loop pays for one wrapper a step
    assert json.loads(done.stdout.splitlines()[-1])["inner_step_timed"] is (kind == "one env")


# a simulator of the user's own: no library's env class, so attach knows no step of it until one is named
OWN_SIMULATOR = textwrap.dedent("""
    import numpy as np

    class BatchedSim:
        def __init__(self, count):
            self.count = count
            self.state = np.zeros((count, 4), np.float32)

        def step(self, actions):
            self.state += 0.01 * np.asarray(actions, np.float32)[:, None]
            return self.state.copy(), np.ones(self.count, np.float32)
""")
OWN_LOOP = textwrap.dedent("""
    import json, sys
    import torch
    from sim import BatchedSim
    sim = BatchedSim(8)
    policy = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.Adam(policy.parameters())
    obs, steps = sim.state.copy(), 0
    for update in range(5):
        batch = []
        for step in range(16):
            with torch.no_grad():
                action = policy(torch.as_tensor(obs)).argmax(-1).numpy()
            obs, reward = sim.step(action)
            steps += sim.count
            batch.append(torch.as_tensor(obs))
        loss = policy(torch.cat(batch)).logsumexp(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(json.dumps({"steps": steps}))
""")


def attach_cli(arguments: list[str], tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlperf", "attach", *arguments], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


def test_a_loop_over_an_env_no_library_defines_is_summarised_without_sps_and_told_the_flag(tmp_path):
    (tmp_path / "sim.py").write_text(OWN_SIMULATOR)
    (tmp_path / "loop.py").write_text(OWN_LOOP)
    done = attach_cli(["--json", "run.json", "--", sys.executable, "loop.py"], tmp_path)
    assert done.returncode == 0, done.stderr
    said = done.stderr.strip().splitlines()[-1]
    assert said.startswith("rlperf attach: no env step was seen: the command stepped no env class attach knows ("), said
    assert "most-called step methods on the main thread were sim:BatchedSim.step (16 calls)" in said, said
    assert said.endswith("name the env's step with --env-step MODULE:CLASS.METHOD. SPS is left out")
    assert "no SPS: named phases" in done.stdout
    summary = RunSummary.check(json.loads((tmp_path / "run.json").read_text()), sps_required=False)
    # epochs are bounded by the updates (acting after an optimizer step begins the next), and the phases shown
    assert summary.sps is None and len(summary.epochs) == 5 and summary.steps == 0
    assert summary.phases["env"] == 0 and all(summary.phases[name] > 0 for name in
                                              ("eval_forward", "train_forward", "learn"))
    assert summary.attached["missing"] == said.removeprefix("rlperf attach: ")


@pytest.mark.parametrize("named, agents", [("sim:BatchedSim.step", []), ("sim:BatchedSim.step", ["count"]),
                                           ("__main__:LocalSim.step", ["8"])], ids=["module", "attribute", "script"])
def test_an_env_step_named_by_the_flag_is_the_env_phase_and_counts_its_agents(tmp_path, named, agents):
    (tmp_path / "sim.py").write_text(OWN_SIMULATOR)
    loop = OWN_LOOP
    if named.startswith("__main__"):  # the class defined in the script itself
        loop = loop.replace("from sim import BatchedSim", OWN_SIMULATOR.replace("BatchedSim", "LocalSim")) \
                   .replace("BatchedSim(8)", "LocalSim(8)")
    (tmp_path / "loop.py").write_text(loop)
    flags = ["--env-step", named, *(["--agents-per-step", *agents] if agents else [])]
    done = attach_cli([*flags, "--json", "run.json", "--", sys.executable, "loop.py"], tmp_path)
    assert done.returncode == 0, done.stderr
    summary = RunSummary.check(json.loads((tmp_path / "run.json").read_text()))
    own = json.loads(done.stdout.splitlines()[0])
    # the step's agents: the class has no num_envs, so the default is the length of the actions it was given
    assert summary.steps == own["steps"] == 5 * 16 * 8 and summary.phases["env"] > 0
    assert summary.attached["env_steps_named"] == [named] and summary.phase_coverage >= 0.9


@pytest.mark.parametrize("arguments, needle", [
    (["--env-step", "sim.BatchedSim.step"], "--env-step: 'sim.BatchedSim.step' is not MODULE:CLASS.METHOD"),
    (["--env-step", "sim:BatchedSim.step", "--agents-per-step", "0"],
     "--agents-per-step: must be a whole number of 1 or more, or the name of the env's attribute"),
    (["--agents-per-step", "8"], "--agents-per-step: counts the steps --env-step names; name one"),
])
def test_a_malformed_env_step_flag_is_one_line_and_exit_2(tmp_path, arguments, needle):
    done = attach_cli([*arguments, "--", sys.executable, "-c", "pass"], tmp_path)
    assert done.returncode == 2 and needle in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


# one warm-up epoch and six steady ones each, three of them delayed; the policies wide enough that their glue stays
# under a tenth
SB3 = [sys.executable, "-m", "benches.trainers.sb3_ppo", "--updates", "7", "--n-envs", "16", "--n-steps", "64",
       "--batch-size", "256", "--n-epochs", "4", "--net", "256"]
TORCHRL = [sys.executable, "-m", "benches.trainers.torchrl_ppo", "--updates", "7", "--n-envs", "8", "--n-steps",
           "64", "--batch-size", "256", "--n-epochs", "2", "--net", "128"]
RSL_RL = [sys.executable, "-m", "benches.trainers.rsl_rl_ppo", "--updates", "7", "--n-envs", "64", "--n-steps", "24",
          "--net", "128"]
TIANSHOU = [sys.executable, "-m", "benches.trainers.tianshou_ppo", "--updates", "7", "--n-envs", "8", "--n-steps",
            "128", "--batch-size", "256", "--n-epochs", "4", "--net", "128"]
REGISTRY_TRAINERS = [("stable_baselines3", SB3, "num_timesteps"), ("torchrl", TORCHRL, "collected_frames"),
                     ("rsl_rl", RSL_RL, "tot_timesteps"), ("tianshou", TIANSHOU, "train_step")]


def undelayed_coverage(summary: RunSummary) -> float:
    """The named phases' share of the steady epochs that had no delay."""
    plain = [epoch for epoch in summary.steady_epochs if not epoch["delayed"]]
    seconds = sum(epoch["seconds"] for epoch in plain)
    return 1 - sum(epoch["phases"][OTHER] for epoch in plain) / seconds


@pytest.mark.parametrize("library, command, own_count", REGISTRY_TRAINERS,
                         ids=["stable-baselines3", "torchrl", "rsl-rl", "tianshou"])
def test_a_registry_trainers_ppo_is_attributed_and_its_delays_land_in_their_phases(tmp_path, library, command,
                                                                                  own_count):
    pytest.importorskip(library)
    summary, out, busy = delayed_in_every_other_epoch(command, tmp_path)
    own = json.loads(out.strip().splitlines()[-1])
    # the agent steps counted from the env are the trainer's own count, over the same window: the whole run
    assert summary.steps == own[own_count] and summary.steady_steps == 6 * summary.epochs[-1]["steps"]
    assert summary.versions[library] is not None
    assert all(summary.phases[name] > 0 for name in ATTACHED) and OTHER in summary.phases
    assert undelayed_coverage(summary) >= 0.90, summary.phases
    # each delayed epoch against its undelayed neighbour: the delay lands in its phase, not short of it and not
    # beyond it; beside another process's load that proves nothing, as `rlperf selfcheck` says (the monitor's rule)
    # (the median of three pairs: one epoch's garbage collection or run of episode resets moves a pair by tens of
    # milliseconds, which `rlperf selfcheck` meets with more pairs)
    shares = {name: paired_shares(summary.epochs, name, DELAY_MS / 1000) for name in ATTACHED}
    assert all(len(pairs) == 3 for pairs in shares.values()), shares
    assert all(0.9 <= statistics.median(pairs) <= 1.1 for pairs in shares.values()) or busy["contended"], \
        (shares, busy)


def delayed_in_every_other_epoch(command: list[str], tmp_path) -> tuple[RunSummary, str, dict]:
    """One attached run of `command` with DELAY_MS in each attached phase of every other epoch: its summary, its
    output and the interference monitor's account of it."""
    monitor = InterferenceMonitor()
    monitor.start()
    path = tmp_path / "summary.json"
    env = attached_environment(path, dict.fromkeys(ATTACHED, DELAY_MS), delay_every=DELAY_EVERY)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    busy = monitor.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    return RunSummary.check(json.loads(path.read_text())), done.stdout, busy


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
    # one steady epoch of 16 env steps, their acting forwards and the glue after each, the glue before training,
    # one training forward and its learn step, and what follows the update
    assert ranges["env"] == ranges["eval_forward"] == 16 and ranges["eval_misc"] >= 16, ranges
    assert ranges["train_misc"] == ranges["train_forward"] == ranges["learn"] == 1, ranges
    assert ranges["ProfilerStep#1"] == 1 and ranges[OTHER] >= 1
    track = [event for event in trace["traceEvents"] if event.get("cat") == "rlperf_phase"]  # the timeline merged
    assert len(track) == sum(ranges[name] for name in (*ATTACHED, "train_misc", OTHER))
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
        "rlperf.phases: no summary written: no epoch ended: the command made no optimizer step (an epoch is a rollout "
        "and its update, and ends with the update's last optimizer step)",
        "rlperf attach: error: command: exited 0 but wrote no summary (the line above, from rlperf, says why)"]


@pytest.mark.gpu
def test_on_cuda_an_attached_sb3_ppo_lands_each_delay_in_its_phase(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("stable_baselines3")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    summary, _, busy = delayed_in_every_other_epoch([*SB3, "--device", "cuda"], tmp_path)
    assert summary.device_name != "cpu"
    # the device's peaks over the steady epochs: the policy and its optimizer's state at least
    assert 0 < summary.memory["device_peak_allocated_bytes"] <= summary.memory["device_peak_reserved_bytes"]
    # on CUDA a boundary is an event: each delay still lands in its phase, within 95-105%, on a quiet machine
    shares = {name: paired_shares(summary.epochs, name, DELAY_MS / 1000) for name in ATTACHED}
    assert all(0.95 <= statistics.median(pairs) <= 1.05 for pairs in shares.values()) or busy["contended"], \
        (shares, busy)
