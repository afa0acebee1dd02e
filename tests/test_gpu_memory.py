"""Peak device memory on CUDA: each phase's peak holds what the phase allocated and nothing a later phase did, read
without a synchronisation; the reference trainer's summary carries every timed phase's peaks, and rlperf.phases the
steady epochs' peaks. Every test needs CUDA and skips without it; the attribution is checked on a CPU with the
allocator's figures scripted in tests/test_memory.py."""

import pytest
import torch

from reference_trainer.config import TrainConfig, validate
from reference_trainer.timing import PhaseTimer
from reference_trainer.train import train
from rlperf import phases
from rlperf.summary import RunSummary

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BIG = 256 * 2 ** 20  # bytes: far above what the small phases around it hold


def test_a_phase_that_allocates_a_big_tensor_shows_at_least_its_size_and_its_neighbours_do_not():
    device = torch.device("cuda", torch.cuda.current_device())
    timer = PhaseTimer(device, True, {})
    small = torch.ones(1024, device=device)
    timer.start_epoch()
    torch.cuda.set_sync_debug_mode("error")  # a hidden synchronisation at a boundary would raise here
    try:
        timer.enter("env")
        small = small * 2
        timer.enter("learn")
        big = torch.empty(BIG // 4, dtype=torch.float32, device=device)
        big.fill_(1.0)
        del big
        timer.enter("log")
        small = small + 1
        timer.close_phase_peaks()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    timer.end_epoch()
    peaks = timer.phase_peaks
    assert peaks["learn"][0] >= BIG and peaks["learn"][1] >= BIG
    assert peaks["env"][0] < BIG and peaks["log"][0] < BIG, peaks
    assert all(allocated <= reserved for allocated, reserved in peaks.values())


def test_the_trainers_summary_holds_each_timed_phases_peaks_and_the_steady_epochs():
    cfg = validate(TrainConfig(env="synthetic", device="cuda", num_envs=256, horizon=16, minibatch_size=1024,
                               hidden_size=64, total_steps=256 * 16 * 4, seed=3))
    memory = RunSummary.check(train(cfg)).memory
    timed = {"env", "eval_copy", "eval_forward", "train_misc", "train_forward", "learn", "log"}
    assert timed <= set(memory["phases"]), memory["phases"]
    for peaks in memory["phases"].values():
        assert 0 < peaks["device_peak_allocated_bytes"] <= peaks["device_peak_reserved_bytes"]
    # the steady epochs hold what the warm-up epoch's largest phase held: no phase allocates more as training goes on
    largest = max(p["device_peak_allocated_bytes"] for p in memory["phases"].values())
    assert 0.5 * largest <= memory["device_peak_allocated_bytes"] <= 1.5 * largest
    # the update's activations over whole sequences outweigh one rollout step's
    assert memory["phases"]["train_forward"]["device_peak_allocated_bytes"] > \
        memory["phases"]["env"]["device_peak_allocated_bytes"]
    assert memory["host_peak_rss_bytes"] > 0


def test_without_timers_the_summary_still_holds_the_steady_epochs_device_peaks():
    cfg = validate(TrainConfig(env="synthetic", device="cuda", num_envs=256, horizon=16, minibatch_size=1024,
                               hidden_size=64, total_steps=256 * 16 * 4, seed=3, timers=False))
    memory = RunSummary.check(train(cfg)).memory
    assert memory["phases"] is None
    assert 0 < memory["device_peak_allocated_bytes"] <= memory["device_peak_reserved_bytes"]


def test_a_users_loop_gets_the_steady_epochs_device_peaks():
    torch.zeros(1, device="cuda")  # the CUDA context the clock looks for
    clock = phases.PhaseClock(warmup_epochs=1)
    for epoch in range(2):
        clock.enter("learn")
        if epoch == 1:  # steady
            big = torch.empty(BIG // 4, dtype=torch.float32, device="cuda")
            del big
        clock.exit("learn")
        clock.steps(8)
        clock.end_epoch()
    allocated, reserved = clock.summary().memory["device_peak_allocated_bytes"], \
        clock.summary().memory["device_peak_reserved_bytes"]
    assert BIG <= allocated <= reserved
