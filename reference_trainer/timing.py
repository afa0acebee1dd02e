"""Phase timing where every second of an epoch lands in exactly one phase.

The timer marks boundaries: `enter(phase)` closes the current phase and opens the next, so phases tile
the epoch with no gaps. On CUDA a boundary is a CUDA event on the current stream, not a host clock
reading: queued kernels are charged to the phase that launched them, and host time spent while the GPU
waits is charged to the phase the host was in. Events are read once per epoch, after one synchronisation.
The events are made in the first epoch and recorded again in every later one (hundreds an epoch, each a
driver call to make), each read before it is recorded again. On CUDA, in the last warm-up epoch only, each
boundary also reads and resets the caching allocator's peak counters (host-side, never waiting for the device, but
tens of microseconds a read): each phase's peak memory, at no cost to the steady epochs.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager

import torch

from reference_trainer.config import PHASES
from rlperf.memory import device_peaks, fold_peaks, reset_device_peaks
from rlperf.phases import delayed_epoch
from rlperf.spin import spin


class SetupClock:
    """The seconds from the trainer's start to its first epoch, by what they went on: `lap(name)` charges the
    time since the previous lap to `name`. A host clock: setting up is the host's work (a CUDA context, the
    libraries, the copies of the weights), and whatever it queues on a GPU is waited for in the first epoch."""

    def __init__(self, start: float):
        self.seconds: dict[str, float] = {}
        self._last = start

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now

    def lap_beside(self, main: str, main_end: float, beside: str) -> None:
        """Charges the time since the previous lap to two stages that ran at once: `beside` gets only what it
        took after `main` had ended at `main_end` (the part `main` did not hide), `main` the rest."""
        now = time.perf_counter()
        alone = min(max(0.0, now - main_end), now - self._last)
        self.seconds[main] = self.seconds.get(main, 0.0) + now - self._last - alone
        self.seconds[beside] = self.seconds.get(beside, 0.0) + alone
        self._last = now


class PhaseTimer:
    def __init__(self, device: torch.device, enabled: bool, delays_ms: dict[str, float],
                 phases: tuple[str, ...] = PHASES, delay_every: int = 1, warmup_epochs: int = 1):
        self.enabled, self.phases = enabled, phases
        self.device, self.cuda = device, device.type == "cuda"
        # CUDA, timers on, the last warm-up epoch: each phase's [allocated, reserved] peak bytes, the larger over
        # its visits
        self.phase_peaks: dict[str, list[int]] = {}
        self.reading_peaks = False
        self.all_delays = {phase: ms / 1000.0 for phase, ms in delays_ms.items()}
        self.delay_every, self.warmup_epochs = delay_every, warmup_epochs
        self.epochs_started = 0
        self.delays: dict[str, float] = {}
        self.delayed_this_epoch: set[str] = set()
        self.marks: list[tuple[str, object, int]] = []
        self.range: AbstractContextManager | None = None
        self.trace_ranges = False
        self.record_timeline = False
        self.timeline: list[tuple[str, int, int]] = []
        self._epoch_start = 0.0
        # CUDA: every boundary event made so far, the first `events_used` of them recorded this epoch
        self.events: list[torch.cuda.Event] = []
        self.events_used = 0

    def _mark(self):
        if self.cuda:
            if self.events_used == len(self.events):
                self.events.append(torch.cuda.Event(enable_timing=True))
            event = self.events[self.events_used]
            self.events_used += 1
            event.record()
            return event
        return time.perf_counter()

    def start_epoch(self) -> None:
        self.delayed_this_epoch.clear()
        # with delay_every N, one epoch in N is delayed (`rlperf selfcheck` pairs it with its neighbour)
        delayed = delayed_epoch(self.epochs_started, self.delay_every, self.warmup_epochs)
        self.delays = self.all_delays if delayed else {}
        self.reading_peaks = self.cuda and self.enabled and self.epochs_started == self.warmup_epochs - 1
        self.epochs_started += 1
        self.marks.clear()
        if self.cuda:
            torch.cuda.synchronize()
        # last epoch's events were read after its synchronisation: they can be recorded again
        self.events_used = 0
        if self.reading_peaks:
            self.phase_peaks = {}
            reset_device_peaks(self.device)
        self._epoch_start = time.perf_counter()

    def enter(self, phase: str) -> None:
        if self.enabled:
            if self.reading_peaks and self.marks and self.marks[-1][0] != phase:
                self.close_phase_peaks()
            self.marks.append((phase, self._mark(), time.time_ns() if self.record_timeline else 0))
            if self.trace_ranges:
                if self.range is not None:
                    self.range.__exit__(None, None, None)
                self.range = torch.profiler.record_function(phase)
                self.range.__enter__()
        if phase in self.delays and phase not in self.delayed_this_epoch:
            # A known amount of work inside the phase, once per epoch, for `rlperf selfcheck`.
            self.delayed_this_epoch.add(phase)
            spin(self.delays[phase])

    def end_epoch(self) -> tuple[float, dict[str, float]]:
        """Closes the epoch; returns its seconds and the seconds of each phase."""
        if self.reading_peaks and self.marks:
            self.close_phase_peaks()
        end_mark = self._mark()
        if self.cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - self._epoch_start
        if self.range is not None:
            self.range.__exit__(None, None, None)
            self.range = None
        phases = dict.fromkeys(self.phases, 0.0)
        if not self.enabled:
            return seconds, phases
        end_ns = time.time_ns()
        for (phase, start, start_ns), (_, stop, stop_ns) in zip(self.marks, self.marks[1:] + [("", end_mark, end_ns)]):
            phases[phase] += start.elapsed_time(stop) / 1000.0 if self.cuda else stop - start
            if self.record_timeline:
                self.timeline.append((phase, start_ns, stop_ns))
        return seconds, phases

    def close_phase_peaks(self) -> None:
        """Charges the allocator's peaks since the last boundary to the phase it closes, and starts the next
        phase's from what is allocated now: two host calls, no wait for the device."""
        fold_peaks(self.phase_peaks, self.marks[-1][0], device_peaks(self.device))
        reset_device_peaks(self.device)
