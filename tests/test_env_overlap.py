"""With two or more env groups, a group's env step runs beside the next group's policy step (stepping.py):
the schedule changes, the training does not, and the summary says how much env time the overlap hid."""

import json
import threading
import time

import numpy as np
import pytest
import torch

import reference_trainer.envs as envs_module
import reference_trainer.train as train_module
from reference_trainer.config import TrainConfig, validate
from reference_trainer.envs import GymVecEnv
from reference_trainer.stepping import InlineStepper, OverlappedStepper, busy_seconds
from reference_trainer.train import train

SMALL = dict(num_envs=8, horizon=8, minibatch_size=32, hidden_size=16, total_steps=8 * 8 * 4, threads=1,
             device="cpu")


def small(**overrides) -> TrainConfig:
    return validate(TrainConfig(**{**SMALL, **overrides}))


def per_epoch(summary: dict) -> list:
    return [(e["losses"], e["episodes"], e["mean_episode_return"]) for e in summary["epochs"]]


def sequential(monkeypatch) -> None:
    """Every group stepped in the trainer's thread when collected: the schedule before overlap."""
    monkeypatch.setattr(train_module, "env_stepper", lambda env, overlapped, device: InlineStepper(env))


def overlapped_always(monkeypatch) -> None:
    """Every group stepped by its worker thread, even an env that gains nothing from it."""
    monkeypatch.setattr(train_module, "env_stepper", lambda env, overlapped, device: OverlappedStepper(env, device))


def slow_envs(monkeypatch, seconds: float) -> None:
    """Every env step sleeps `seconds` first, holding no interpreter lock, as an emulator's threads do."""
    make_env = envs_module.make_env

    def slow_env(*args, **kwargs):
        env = make_env(*args, **kwargs)
        step = env.step
        env.step = lambda actions: (time.sleep(seconds), step(actions))[1]
        return env

    monkeypatch.setattr(envs_module, "make_env", slow_env)


def record_stepping_threads(monkeypatch) -> set[str]:
    """The names of the threads the envs' steps ran in, filled as the run steps."""
    names: set[str] = set()
    make_env = envs_module.make_env

    def recording(*args, **kwargs):
        env = make_env(*args, **kwargs)
        step = env.step

        def recorded_step(actions):
            names.add(threading.current_thread().name.split("_")[0])
            return step(actions)

        env.step = recorded_step
        return env

    monkeypatch.setattr(envs_module, "make_env", recording)
    return names


@pytest.mark.parametrize("env", ["memory", "cartpole", "catch"])
def test_numpy_envs_step_in_the_trainers_thread_and_would_train_alike_in_workers(monkeypatch, env):
    extra = dict(encoder="cnn", cnn_channels=4) if env == "catch" else {}
    inline_threads = record_stepping_threads(monkeypatch)
    inline = train(small(env=env, env_groups=2, **extra))
    assert inline_threads == {"MainThread"}

    overlapped_always(monkeypatch)
    worker_threads = record_stepping_threads(monkeypatch)
    overlapped = train(small(env=env, env_groups=2, **extra))
    assert worker_threads == {"env-group"}
    assert overlapped["episodes"] == inline["episodes"] > 0
    assert per_epoch(overlapped) == per_epoch(inline)


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_gym_cartpole_copies_train_alike_in_one_group_or_two_overlapped(vectorization):
    # gymnasium seeds copy i with seed + i, and a group's copies start at its first env's index, so the copies
    # are the same however they are grouped; async ones are sent their actions and waited for in the worker
    assert GymVecEnv("CartPole-v1", 2, seed=0, vectorization=vectorization).steps_on_its_own == (vectorization == "async")
    one = train(small(env="gym:CartPole-v1", vectorization=vectorization))
    two = train(small(env="gym:CartPole-v1", vectorization=vectorization, env_groups=2))
    assert two["episodes"] == one["episodes"] > 0
    for got, expected in zip(per_epoch(two), per_epoch(one)):
        assert got[1:] == expected[1:]
        assert got[0] == pytest.approx(expected[0], rel=1e-5, abs=1e-7)


def test_breakout_native_envs_train_alike_in_one_group_or_two_overlapped():
    pytest.importorskip("ale_py")
    cfg = dict(env="gym:ale_py:ALE/Breakout-v5", encoder="cnn", cnn_channels=4, num_envs=4, horizon=4,
               minibatch_size=8, total_steps=4 * 4 * 3, env_threads=1)
    assert GymVecEnv("ale_py:ALE/Breakout-v5", 2, seed=0, threads=1).steps_on_its_own
    one = train(small(**cfg))
    two = train(small(**cfg, env_groups=2))
    for got, expected in zip(per_epoch(two), per_epoch(one)):
        assert got[1:] == expected[1:]
        # the policy steps the CNN over batches of two frames instead of four: rounding differs in the last bits
        assert got[0] == pytest.approx(expected[0], rel=1e-5, abs=1e-6)


def test_a_groups_env_step_runs_while_the_next_groups_policy_computes(monkeypatch):
    """Group 0's k-th env step does not end until group 1's k-th policy step has begun: only a schedule that
    overlaps them finishes without the gates timing out."""
    launches: dict[int, int] = {}
    gates: dict[tuple[int, int], threading.Event] = {}
    timed_out = []
    launch_step, make_env = train_module.Trainer.launch_step, envs_module.make_env

    def gate(group, k):
        return gates.setdefault((group, k), threading.Event())

    def witnessed_launch(self, group, t):
        launches[group] = launches.get(group, 0) + 1
        gate(group, launches[group]).set()
        launch_step(self, group, t)

    steps_taken: dict[int, int] = {}

    def gated(cfg, num_envs, env_offset=0, device=None):
        env = make_env(cfg, num_envs, env_offset, device)
        step = env.step

        def gated_step(actions):
            k = steps_taken[env_offset] = steps_taken.get(env_offset, 0) + 1
            if env_offset == 0 and not gate(1, k).wait(timeout=10):
                timed_out.append(k)
            return step(actions)

        env.step = gated_step
        return env

    monkeypatch.setattr(train_module.Trainer, "launch_step", witnessed_launch)
    monkeypatch.setattr(envs_module, "make_env", gated)
    overlapped_always(monkeypatch)
    train(small(env="memory", env_groups=2, total_steps=8 * 8 * 2))
    assert steps_taken == {0: 2 * 8, 4: 2 * 8} and not timed_out


def test_the_summary_says_how_much_env_time_the_overlap_hid(monkeypatch):
    """An env step of 20 ms beside a policy step of 30 ms (both sleeping, so neither holds the interpreter):
    overlapped, the trainer waits for little of the env's time; in sequence, for all of it."""
    launch_step = train_module.Trainer.launch_step

    def slow_policy(self, group, t):
        launch_step(self, group, t)
        time.sleep(0.03)

    slow_envs(monkeypatch, 0.02)
    monkeypatch.setattr(train_module.Trainer, "launch_step", slow_policy)
    overlapped_always(monkeypatch)
    cfg = small(env="memory", env_groups=2, num_envs=4, horizon=4, minibatch_size=8, total_steps=4 * 4 * 3)
    steady_env_steps = 2 * 4 * 2  # two steady epochs of four steps of two groups

    overlap = train(cfg)["env_overlap"]
    assert overlap["env_busy_seconds"] >= 0.02 * steady_env_steps
    assert overlap["policy_seconds"] >= 0.03 * steady_env_steps
    assert overlap["env_wait_seconds"] < 0.3 * overlap["env_busy_seconds"]

    sequential(monkeypatch)
    inline = train(cfg)["env_overlap"]
    assert inline["env_wait_seconds"] == inline["env_busy_seconds"] >= 0.02 * steady_env_steps


def test_an_env_stepped_on_the_device_has_no_overlap_to_report():
    summary = train(small(env="synthetic-device", env_groups=2))
    assert summary["env_overlap"] is None
    assert all(e["env_busy_seconds"] is None for e in summary["epochs"])


def test_the_report_says_which_side_waits_and_older_runs_read_as_not_measured(tmp_path):
    from decisions.rundata import load
    from reports.render import env_overlap_section, which_side_waits
    from rlperf.machine import machine_key
    from rlperf.store import PointRecord, Store, utc_now

    measured = train(small(env="gym:CartPole-v1", env_groups=2))
    older = {key: value for key, value in measured.items() if key not in ("env_overlap", "env_build_seconds")}
    print_ = {"git": {"commit": "0" * 16, "dirty": False}, "cpu": {"model": "Test CPU"}, "gpus": [], "suite_hash": "h"}
    path = tmp_path / "results.sqlite"
    with Store.open(path) as db:
        run_id = db.create_run("overlap", "h", print_, machine_key(print_), None)
        for values, summary in (({"env_groups": 2}, measured), ({"env_groups": 1}, older)):
            db.record_point(run_id, PointRecord(json.dumps(values), summary["config"], "ok", utc_now(), 1.0,
                                                samples=[(0, summary)]))
        db.finish_run(run_id, "complete")
    table = env_overlap_section(load(f"{path}::{run_id}")).tables[0].set_index("point")
    assert table.loc["env_groups=2", "which side waits"].startswith("env ")
    assert table.loc["env_groups=1", "which side waits"] == "not measured"
    assert table.loc["env_groups=1", "env (µs/step)"] == "not measured"
    # the start-up and its building, as the summary has them; a run stored before the building was timed has the sum
    assert table.loc["env_groups=2", "env start-up s"] == (
        f"{measured['env_start_seconds']:.2f} ({measured['env_build_seconds']:.2f} building)")
    assert table.loc["env_groups=1", "env start-up s"] == f"{measured['env_start_seconds']:.2f}"

    # the side named is the larger one, and a single group says nothing was hidden
    assert which_side_waits(72.0, 43.2, 30.0, 100.0, 2) == (
        "env 72% of the step, 40% of it hidden behind the policy (96% of the policy's time), policy 30%: the env side "
        "limits the rollout, more cores or env threads would speed it")
    assert "policy side limits" in which_side_waits(20.0, 1.0, 60.0, 100.0, 2)
    assert which_side_waits(20.0, 20.0, 60.0, 100.0, 1) == (
        "env 20% of the step, none of it hidden (one env group), policy 60%: the policy side limits the rollout, a "
        "faster device would speed it; --env-groups 2 could hide at most 20% of the step")
    # an env of 2% of the step (a synthetic env on a GPU) leaves groups nothing worth hiding, and the line says so
    assert which_side_waits(2.0, 2.0, 26.0, 100.0, 1).endswith("--env-groups 2 could hide at most 2% of the step")


class LateActions:
    """The actions of a group's step reach the host `delay` seconds after the step is launched, as a non_blocking
    copy's do while the device computes: `synchronize` waits until then, and notes the thread that waited and
    for how long."""

    def __init__(self, delay: float, waits: list[tuple[str, float]]):
        self.delay, self.waits, self.launched = delay, waits, 0.0

    def record(self) -> None:
        self.launched = time.perf_counter()

    def synchronize(self) -> None:
        seconds = max(0.0, self.launched + self.delay - time.perf_counter())
        self.waits.append((threading.current_thread().name.split("_")[0], seconds))
        time.sleep(seconds)


def with_late_actions(monkeypatch, delay: float) -> list[tuple[str, float]]:
    """Every group's actions `delay` seconds late from now on; the waits for them, filled as the run steps."""
    waits: list[tuple[str, float]] = []
    init = train_module.Trainer.__init__

    def late_actions_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.actions_ready = [LateActions(delay, waits) for _ in self.envs]

    monkeypatch.setattr(train_module.Trainer, "__init__", late_actions_init)
    return waits


def test_actions_that_reach_the_host_late_are_waited_for_by_each_groups_worker_and_every_env_steps_at_once(
        monkeypatch):
    """With non_blocking copies (CUDA) launch_step returns before the actions are on the host. Each group's
    worker thread waits for them, never the trainer's, so the host launches the next group meanwhile and the
    groups' env steps run beside each other: with envs of 20 ms and actions 10 ms late, the trainer waits for
    about one group's env time a step, not both (a host waiting for a group's actions before starting the
    next one serialises the envs, its wait then the sum of their steps), and the env is busy for about as long,
    the groups' steps at once counted once. The training is the same."""
    cfg = small(env="memory", env_groups=2, num_envs=4, horizon=4, minibatch_size=8, total_steps=4 * 4 * 3)
    slow_envs(monkeypatch, 0.02)
    overlapped_always(monkeypatch)
    default = train(cfg)
    waits = with_late_actions(monkeypatch, 0.01)
    late = train(cfg)
    assert len(waits) == 3 * 4 * 2 and {thread for thread, _ in waits} == {"env-group"}
    overlap = late["env_overlap"]
    steps_time = 0.02 * 2 * 4 * 2  # two steady epochs of four steps of two groups
    assert overlap["env_wait_seconds"] < 0.7 * steps_time, overlap
    assert 0.02 * 2 * 4 <= overlap["env_busy_seconds"] < 0.7 * steps_time, overlap
    assert per_epoch(late) == per_epoch(default)


def test_envs_stepped_in_the_trainers_thread_wait_for_late_actions_only_when_collecting_them(monkeypatch):
    """The numpy envs step in the trainer's thread. A group's late actions are waited for when the trainer
    collects its step, after the other group's env step, so the device's 10 ms hide behind that env's 20 ms:
    only each epoch's first wait is not hidden (waiting right after launching would wait all 10 ms each time)."""
    cfg = small(env="memory", env_groups=2, num_envs=4, horizon=4, minibatch_size=8, total_steps=4 * 4 * 3)
    slow_envs(monkeypatch, 0.02)
    default = train(cfg)
    waits = with_late_actions(monkeypatch, 0.01)
    late = train(cfg)
    assert len(waits) == 3 * 4 * 2 and {thread for thread, _ in waits} == {"MainThread"}
    assert sum(seconds for _, seconds in waits) < 0.25 * 0.01 * len(waits), waits
    assert per_epoch(late) == per_epoch(default)


def test_the_envs_busy_time_counts_groups_stepping_at_once_once():
    assert busy_seconds([(5.0, 6.0), (0.0, 2.0), (1.0, 3.0), (1.5, 2.5)]) == 4.0
    assert busy_seconds([]) == 0.0


class GatedActions:
    def __init__(self):
        self.gate = threading.Event()
        self.fails = False

    def synchronize(self) -> None:
        self.gate.wait(timeout=10)
        if self.fails:
            raise RuntimeError("the device failed")


class CountingEnv:
    steps_on_its_own = False
    steps_beside_the_policy = True

    def __init__(self):
        self.actions: list = []

    def step(self, actions):
        self.actions.append(actions.copy())
        return actions, actions, actions, actions


@pytest.mark.parametrize("stepper_class", [OverlappedStepper, InlineStepper])
def test_an_env_steps_only_once_its_actions_are_on_the_host_and_neither_side_counts_that_wait(stepper_class):
    """start returns while the actions are on their way; the env steps once they came, in the group's worker
    or when the trainer collects the step; the time before they came is the device's, in neither busy nor wait."""
    env, ready = CountingEnv(), GatedActions()
    stepper = stepper_class(env)
    try:
        stepper.start(np.arange(3), ready)
        time.sleep(0.05)
        assert env.actions == []
        threading.Timer(0.05, ready.gate.set).start()
        assert stepper.finish()[0].tolist() == [0, 1, 2]
        spans, wait = stepper.take_times()
        assert len(spans) == 1 and busy_seconds(spans) < 0.04 and wait < 0.04

        ready = GatedActions()
        ready.fails = True
        stepper.start(np.arange(3), ready)
        ready.gate.set()
        with pytest.raises(RuntimeError, match="the device failed"):
            stepper.finish()
        assert len(env.actions) == 1
    finally:
        stepper.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("knobs", [{}, dict(pinned=True, non_blocking=True, copy_stream=True)])
def test_on_cuda_overlapped_gym_copies_train_as_one_group_does(knobs):
    """The two orders on CUDA: with blocking action copies each env step starts after its own group's
    actions; with non_blocking ones, after the next group is launched. Every copy is held back on its stream
    (train's copy_delay_cycles), so an env stepped on actions not yet copied, or observations refilled while
    a copy still reads them, changes the losses."""
    # sync copies, seeded one by one: gymnasium's own CartPole vector env (auto) draws every copy's start
    # from one generator, so two groups of it would start from other states than one group does
    cfg = dict(env="gym:CartPole-v1", vectorization="sync", device="cuda", num_envs=64, horizon=8,
               minibatch_size=128, hidden_size=32, total_steps=64 * 8 * 4, **knobs)
    one = train(validate(TrainConfig(**cfg)))
    two = train(validate(TrainConfig(**cfg, env_groups=2)), copy_delay_cycles=2_000_000)
    assert two["env_overlap"]["env_busy_seconds"] > 0 and two["episodes"] == one["episodes"] > 0
    for got, expected in zip(per_epoch(two), per_epoch(one)):
        assert got[1:] == expected[1:]
        assert got[0] == pytest.approx(expected[0], rel=1e-4, abs=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_with_non_blocking_copies_the_groups_envs_step_beside_each_other(monkeypatch):
    """Each group's worker waits on the real event behind its actions' copy, on the trainer's device, and the
    trainer waits for about half of the time its envs' steps took, not all of it (as it did when a group's env
    started only after the other group's had ended)."""
    slow_envs(monkeypatch, 0.02)
    overlapped_always(monkeypatch)
    cfg = validate(TrainConfig(env="memory", device="cuda", env_groups=2, num_envs=64, horizon=8, minibatch_size=128,
                               hidden_size=32, total_steps=64 * 8 * 4, pinned=True, non_blocking=True))
    summary = train(cfg)
    steady_epochs = len(summary["epochs"]) - cfg.warmup_epochs
    steps_time = 0.02 * steady_epochs * cfg.horizon * cfg.env_groups
    assert steady_epochs >= 2 and summary["env_overlap"]["env_wait_seconds"] < 0.7 * steps_time, summary["env_overlap"]
