"""Phases in a user's own training loop, with the reference trainer's guarantees (docs/any-trainer.md).

    from rlperf import phases

    for update in range(updates):
        for step in range(horizon):
            with phases.phase("eval_forward"):
                action = policy.act(obs)
            with phases.phase("env"):
                obs, reward, done = envs.step(action)
            phases.steps(num_envs)
        with phases.phase("train_forward"):
            loss = policy.loss(batch)
        with phases.phase("learn"):
            loss.backward(); optimizer.step()
        phases.end_epoch()

Nothing is timed unless the harness names a summary path (RLPERF_SUMMARY); on CUDA a mark is an event read once
an epoch, so GPU work is charged to the phase that launched it without a wait inside the epoch.
"""

from __future__ import annotations

import atexit
import os
import platform
import sys
import time
from typing import Any

from rlperf import __version__
from rlperf.errors import MachineFault, written_whole
from rlperf.memory import device_peaks, host_peak_rss_bytes, memory_record, reset_device_peaks
from rlperf.spin import spin
from rlperf.summary import OTHER, PHASES, SCHEMA, RunSummary

SUMMARY_VARIABLE = "RLPERF_SUMMARY"
DELAY_VARIABLE = "RLPERF_INJECT_DELAY"
# delays in every Nth epoch only (2: every other), so that `rlperf selfcheck` compares adjacent epochs of one process
DELAY_EVERY_VARIABLE = "RLPERF_INJECT_DELAY_EVERY"
WARMUP_VARIABLE = "RLPERF_WARMUP_EPOCHS"
# The process that owns the summary: subprocesses that inherit the environment (env workers) time nothing.
OWNER_VARIABLE = "RLPERF_PHASES_OWNER"
TRACE_VARIABLE = "RLPERF_TRACE"
TRACE_EPOCHS_VARIABLE = "RLPERF_TRACE_EPOCHS"
MAX_DELAY_MS = 60_000.0
# the rollout's phases outside `env`, the policy's side of "Which side waits" (as the reference trainer's)
ROLLOUT_POLICY_PHASES = ("eval_forward", "eval_copy", "eval_misc")
# the RL and env libraries whose versions a summary records when the process imported them (docs/any-trainer.md)
RL_LIBRARIES = ("gymnasium", "gym", "stable_baselines3", "torchrl", "tensordict", "rsl_rl", "tianshou", "skrl",
                "pufferlib", "isaaclab", "ale_py")
# why no summary can be written, in the words of who started the clock: the phase API's calls, or attach's flags
API_WORDS = {"no_epoch": "no epoch ended (end_epoch was never called, or the run ended before its first update)",
             "warmup": WARMUP_VARIABLE,
             "no_steps": "no agent steps were counted in the steady epochs (steps() was never called)"}
ATTACH_WORDS = {"no_epoch": "no epoch ended: the command made no optimizer step (an epoch is a rollout and its "
                            "update, and ends with the update's last optimizer step)",
                "warmup": "--warmup-epochs",
                "no_steps": "no agent steps were counted in the steady epochs"}


class PhaseError(ValueError):
    """A phase mark that cannot be honoured: an unknown name, or an exit of a phase that is not the innermost
    one open. One line naming it."""


def parse_delays(text: str) -> dict[str, float]:
    """`PHASE=MS,...` as milliseconds by phase; refused in one line naming the part that is wrong."""
    delays = {}
    for part in filter(None, (piece.strip() for piece in text.split(","))):
        name, _, value = part.partition("=")
        if name not in PHASES:
            raise PhaseError(f"{DELAY_VARIABLE}: unknown phase {name!r} (allowed: {', '.join(PHASES)})")
        try:
            ms = float(value)
        except ValueError:
            raise PhaseError(f"{DELAY_VARIABLE}: {part!r} is not PHASE=MILLISECONDS") from None
        if not 0 <= ms <= MAX_DELAY_MS:
            raise PhaseError(f"{DELAY_VARIABLE}: {name}: milliseconds must be from 0 to {MAX_DELAY_MS:g}")
        delays[name] = ms
    return delays


def parse_warmup(text: str) -> int:
    if not text.isdigit():
        raise PhaseError(f"{WARMUP_VARIABLE}: must be a whole number of 0 or more (got {text!r})")
    return int(text)


def parse_delay_every(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise PhaseError(f"{DELAY_EVERY_VARIABLE}: must be a whole number of 1 or more (got {text!r})")
    return int(text)


def delayed_epoch(index: int, every: int, warmup_epochs: int) -> bool:
    """Whether epoch `index` takes the delays when one epoch in `every` does. Counted from the first steady epoch,
    blocks of `every` take their delay first, then last, in turn (for 2: D U U D D U), so that adjacent epochs pair
    and drift favours neither order of a pair. With `every` 1, every epoch, warm-up included."""
    if every == 1:
        return True
    steady = index - warmup_epochs
    if steady < 0:
        return False
    return steady % every == (0 if (steady // every) % 2 == 0 else every - 1)


def parse_trace_epochs(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise PhaseError(f"{TRACE_EPOCHS_VARIABLE}: must be a whole number of 1 or more (got {text!r})")
    return int(text)


class PhaseClock:
    """The marks of the epoch in progress, and the epochs closed so far. A mark is `(label, stamp)`: the segment
    from this stamp to the next belongs to `label`. Stamps are host clock readings, or CUDA events where the
    process has a CUDA context (decided per epoch, at its first mark)."""

    def __init__(self, writer: str = "phases", warmup_epochs: int = 1, delays_ms: dict[str, float] | None = None,
                 config: dict[str, Any] | None = None, delay_every: int = 1):
        self.writer = writer
        self.warmup_epochs = warmup_epochs
        self.delays_ms = dict(delays_ms or {})
        self.delay_every = delay_every
        self.all_delays = {name: ms / 1000.0 for name, ms in self.delays_ms.items()}
        self.delays = self.epoch_delays(0)
        # the label of a segment no open phase claims: `other`, unless attach knows better from where the loop is
        self.ground = OTHER
        # why the summary lacks SPS, where it does (attach saw no env step): said once, in the summary
        self.missing: str | None = None
        self.config = dict(config or {})
        self.attached: dict[str, Any] = {}
        self.stack: list[str] = []
        self.marks: list[tuple[str, Any]] = []
        self.delayed: set[str] = set()
        self.epoch_steps = 0
        self.epochs: list[dict] = []
        self.total_steps = 0
        self.phase_marks = 0
        self.process_start = process_start_seconds()
        self.started_unix_ns: int | None = None
        self.steady_start_ns: int | None = None
        self.epoch_host_start = 0.0
        self.cuda = False  # whether this epoch's stamps are CUDA events
        self.events: list[Any] = []  # recorded events, reused from epoch to epoch
        self.spare_events: list[Any] = []
        # the device's [allocated, reserved] peaks since the first steady epoch began, read at each steady epoch's
        # end (CUDA, where its context existed when the steady epochs began)
        self.device_peaks: tuple[int, int] | None = None
        self.peaks_reset = False
        self.finished = False

    # ---- marks ----------------------------------------------------------------------------------------

    def stamp(self):
        if not self.cuda:
            return time.perf_counter()
        if self.spare_events:
            event = self.spare_events.pop()
        else:
            import torch

            event = torch.cuda.Event(enable_timing=True)
        event.record()  # on the current stream
        self.events.append(event)
        return event

    def begin_epoch(self) -> None:
        # torch is never imported here: a loop that has not imported it has no device to time
        self.cuda = "torch" in sys.modules and cuda_initialized()
        if self.cuda:
            import torch

            torch.cuda.synchronize()  # the previous epoch's queued work is that epoch's
            if len(self.epochs) == self.warmup_epochs and not self.peaks_reset:
                reset_device_peaks(torch.cuda.current_device())
                self.peaks_reset = True
        self.epoch_host_start = time.perf_counter()
        if self.started_unix_ns is None:
            self.started_unix_ns = time.time_ns()
        self.marks = [(self.stack[-1] if self.stack else self.ground, self.stamp())]

    def enter(self, name: str, delay: bool = True) -> None:
        """Opens phase `name`; its injected delay, if any, is slept now unless `delay` is false (the caller then
        calls `delay_once` when it knows the phase is the one it opened)."""
        if not self.marks:
            self.begin_epoch()
        self.stack.append(name)
        self.phase_marks += 1
        self.marks.append((name, self.stamp()))
        if delay and self.delays:
            self.delay_once(name)

    def delay_once(self, name: str) -> None:
        if name in self.delays and name not in self.delayed:
            # A known amount of work inside the phase, once per epoch, for `rlperf selfcheck`.
            self.delayed.add(name)
            spin(self.delays[name])

    def relabel(self, first_mark: int, old: str, new: str) -> None:
        """Charges the segments of `old` from mark `first_mark` on to `new`, and makes the innermost open `old`
        a `new`: a phase opened before what it was could be known (attach's forward with grad whose outputs
        carry none)."""
        self.marks[first_mark:] = [(new if label == old else label, stamp) for label, stamp in self.marks[first_mark:]]
        for index in range(len(self.stack) - 1, -1, -1):
            if self.stack[index] == old:
                self.stack[index] = new
                break

    def exit(self, name: str) -> None:
        if not self.stack or self.stack[-1] != name:
            inner = f"{self.stack[-1]!r} is the innermost phase open" if self.stack else "no phase is open"
            raise PhaseError(f"unbalanced phase mark: exit of {name!r} while {inner}")
        self.stack.pop()
        self.marks.append((self.stack[-1] if self.stack else self.ground, self.stamp()))

    def steps(self, count: int) -> None:
        if not self.marks:
            self.begin_epoch()
        self.epoch_steps += count

    # ---- epochs ---------------------------------------------------------------------------------------

    def end_epoch(self, cut: int | None = None) -> None:
        """Closes the epoch at this moment, or at its mark `cut` (what followed it is dropped: the tail of a
        run after its last update, which belongs to no epoch)."""
        if not self.marks:
            self.begin_epoch()
        if cut is None:
            marks, end = self.marks, self.stamp()
        else:
            marks, end = self.marks[:cut], self.marks[cut][1]
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        host_seconds = time.perf_counter() - self.epoch_host_start
        if self.cuda and self.peaks_reset:
            import torch

            self.device_peaks = device_peaks(torch.cuda.current_device())
        phases = dict.fromkeys((*PHASES, OTHER), 0.0)
        stamps = [stamp for _, stamp in marks] + [end]
        for (label, start), stop in zip(marks, stamps[1:]):
            phases[label] += start.elapsed_time(stop) / 1000.0 if self.cuda else stop - start
        seconds = host_seconds if cut is None else sum(phases.values())
        index = len(self.epochs)
        warmup = index < self.warmup_epochs
        if not warmup and self.steady_start_ns is None:
            self.steady_start_ns = time.time_ns() - int(seconds * 1e9)
        self.epochs.append({"epoch": index, "steps": self.epoch_steps, "seconds": seconds, "warmup": warmup,
                            "phases": phases, "marks": len(marks), "episodes": 0, "mean_episode_return": None,
                            "end_seconds": time.time() - self.process_start, "delayed": sorted(self.delayed)})
        self.total_steps += self.epoch_steps
        self.epoch_steps = 0
        self.delayed.clear()
        self.delays = self.epoch_delays(len(self.epochs))
        self.spare_events += self.events
        self.events = []
        self.begin_epoch()

    def epoch_delays(self, index: int) -> dict[str, float]:
        """The delays of epoch `index`: every epoch's, or with `delay_every` N one epoch in each N."""
        return self.all_delays if delayed_epoch(index, self.delay_every, self.warmup_epochs) else {}

    # ---- the summary ----------------------------------------------------------------------------------

    def refusal(self) -> str | None:
        """Why no summary can be written, in one line; None when one can."""
        steady = [epoch for epoch in self.epochs if not epoch["warmup"]]
        words = ATTACH_WORDS if self.writer == "attach" else API_WORDS
        if not self.epochs:
            return words["no_epoch"]
        if self.phase_marks == 0:
            return f"no phase was marked in {len(self.epochs)} epochs: every second would be `other`"
        if not steady:
            return (f"all {len(self.epochs)} epochs were warm-up ({words['warmup']}={self.warmup_epochs}): "
                    "nothing steady to measure")
        if not sum(epoch["steps"] for epoch in steady) and self.missing is None:
            return words["no_steps"]
        return None

    def summary(self) -> RunSummary:
        steady = [epoch for epoch in self.epochs if not epoch["warmup"]]
        steady_seconds = sum(epoch["seconds"] for epoch in steady)
        steady_steps = sum(epoch["steps"] for epoch in steady)
        phases = {name: sum(epoch["phases"][name] for epoch in steady) for name in (*PHASES, OTHER)}
        wall = time.time() - self.process_start
        steady_start = steady[0]["end_seconds"] - steady[0]["seconds"]
        named = sum(seconds for name, seconds in phases.items() if name != OTHER)
        return RunSummary(
            schema=SCHEMA, writer=self.writer, config=self.config,
            sps=steady_steps / steady_seconds if steady_steps else None,
            steps=self.total_steps, steady_steps=steady_steps, steady_seconds=steady_seconds, wall_seconds=wall,
            phases=phases, epochs=self.epochs, sps_end_to_end=self.total_steps / wall,
            warmup_seconds=steady_start, phase_coverage=named / steady_seconds if steady_seconds else None,
            env_overlap={"env_busy_seconds": phases["env"], "env_wait_seconds": phases["env"],
                         "policy_seconds": sum(phases[name] for name in ROLLOUT_POLICY_PHASES)},
            device_name=self.device_name(), versions=versions(),
            steady_window_unix_ns=[self.steady_start_ns or 0, time.time_ns()],
            attached={"writer": self.writer, **self.attached, "unclaimed": phases[OTHER],
                      "delays_ms": self.delays_ms, "delay_every": self.delay_every,
                      **({"missing": self.missing} if self.missing else {}),
                      "marks_per_epoch": sum(epoch["marks"] for epoch in steady) / len(steady)},
            memory=memory_record(host_peak_rss_bytes(), self.device_peaks),
        )

    def device_name(self) -> str:
        if "torch" in sys.modules and cuda_initialized():
            import torch

            return torch.cuda.get_device_name(torch.cuda.current_device())
        return "cpu"

    def write(self, path: str) -> bool:
        """Writes the summary to `path`; says why in one line on stderr, and writes nothing, when it cannot."""
        self.finished = True
        why = self.refusal()
        if why is not None:
            sys.stderr.write(f"rlperf.phases: no summary written: {why}\n")
            return False
        import json

        try:
            with written_whole(path) as partial:
                partial.write_text(json.dumps(self.summary().to_dict()))
        except (OSError, MachineFault) as exc:  # at exit: one line, not a traceback
            sys.stderr.write(f"rlperf.phases: no summary written: {path}: {exc}\n")
            return False
        return True


class TracedPhaseClock(PhaseClock):
    """A clock that also traces its first `trace_epochs` steady epochs with torch.profiler into `trace_path` (a
    Chrome trace), each segment of an epoch a range named by its phase (`other` included), and keeps their
    `timeline` (phase, start and end in unix ns), as the reference trainer's traced epochs do: what `rlperf
    profile` reads. The profiler starts between the warm-up and the first steady epoch and steps at each epoch's
    end, so its start-up lands in no epoch; a traced run's SPS is never used."""

    def __init__(self, trace_path: str, trace_epochs: int = 1, **settings: Any):
        super().__init__(**settings)
        self.trace_path = trace_path
        self.trace_epochs = trace_epochs
        self.profiler: Any = None
        self.traced = 0  # epochs traced so far
        self.trace_written = False
        self.range: Any = None  # the range open now
        self.range_labels: list[str] = []  # the label of every range opened, relabelled as their marks are
        self.epoch_ranges = 0  # where this epoch's ranges start in range_labels
        self.epoch_marks_ns: list[tuple[str, int]] = []  # this epoch's marks, while traced: label, unix ns
        self.timeline: list[list] = []
        self.closing = False  # an epoch is ending: its end stamp opens no range
        self.cut: int | None = None
        self.end_ns = 0
        self.renamed = False

    @property
    def tracing(self) -> bool:
        return self.profiler is not None and self.traced < self.trace_epochs

    def stamp(self):
        if self.tracing and not self.closing:
            label = self.stack[-1] if self.stack else self.ground
            self.open_range(label)
            self.epoch_marks_ns.append((label, time.time_ns()))
        return super().stamp()

    def open_range(self, label: str) -> None:
        import torch

        if self.range is not None:
            self.range.__exit__(None, None, None)
        self.range = torch.profiler.record_function(label)
        self.range.__enter__()
        self.range_labels.append(label)

    def close_range(self) -> None:
        if self.range is not None:
            self.range.__exit__(None, None, None)
            self.range = None

    def begin_epoch(self) -> None:
        if self.closing:  # the traced epoch that just ended: its ranges and its profiler step end too
            self.closing = False
            self.close_traced_epoch()
        if self.profiler is None and self.traced == 0 and self.trace_path and len(self.epochs) >= self.warmup_epochs:
            self.start_profiler()
        self.epoch_ranges = len(self.range_labels)
        self.epoch_marks_ns = []
        super().begin_epoch()

    def end_epoch(self, cut: int | None = None) -> None:
        if self.tracing:
            self.closing, self.cut, self.end_ns = True, cut, time.time_ns()
        super().end_epoch(cut)

    def close_traced_epoch(self) -> None:
        self.close_range()
        marks = self.epoch_marks_ns if self.cut is None else self.epoch_marks_ns[:self.cut]
        end_ns = self.end_ns if self.cut is None else self.epoch_marks_ns[self.cut][1]
        stops = [ns for _, ns in marks[1:]] + [end_ns]
        self.timeline += [[label, start, stop] for (label, start), stop in zip(marks, stops)]
        self.epochs[-1]["traced"] = True
        self.traced += 1
        self.profiler.step()  # the schedule's last active step writes the trace
        if self.traced == self.trace_epochs:
            self.stop_profiler()

    def relabel(self, first_mark: int, old: str, new: str) -> None:
        super().relabel(first_mark, old, new)
        for index in range(first_mark, len(self.epoch_marks_ns)):
            label, ns = self.epoch_marks_ns[index]
            if label == old:
                self.epoch_marks_ns[index] = (new, ns)
                self.range_labels[self.epoch_ranges + index] = new
                self.renamed = True

    def start_profiler(self) -> None:
        try:
            import torch
        except ImportError:
            sys.stderr.write(f"rlperf.phases: no trace written: {TRACE_VARIABLE} asks for one, and this "
                             "interpreter has no torch\n")
            self.trace_path = ""
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda_initialized():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profiler = torch.profiler.profile(
            activities=activities, on_trace_ready=self.export,
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=self.trace_epochs, repeat=1))
        self.profiler.start()
        self.profiler.step()  # the schedule's warm-up step, taken outside every epoch

    def stop_profiler(self) -> None:
        """Stops the profiler (it writes what it recorded, if it has not yet)."""
        if self.profiler is not None:
            self.close_range()
            profiler, self.profiler = self.profiler, None
            profiler.stop()
            self.traced = self.trace_epochs

    def export(self, profiler: Any) -> None:
        profiler.export_chrome_trace(self.trace_path)
        if self.renamed:
            rename_ranges(self.trace_path, self.range_labels)
        self.trace_written = True

    def summary(self) -> RunSummary:
        summary = super().summary()
        if self.trace_written:
            summary.trace, summary.timeline = self.trace_path, self.timeline
        return summary

    def write(self, path: str) -> bool:
        self.stop_profiler()  # a run that ended before its traced epochs did: what was recorded
        return super().write(path)


def rename_ranges(path: str, labels: list[str]) -> None:
    """Gives the phase ranges of a written trace, in the order they were opened, the labels their marks took
    later (attach's forward opened as training that turned out to be acting). A trace whose phase ranges are
    not those opened is left as written."""
    import gzip
    import json

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as file:
        trace = json.load(file)
    names = {*PHASES, OTHER}
    ranges = sorted((event for event in trace.get("traceEvents", [])
                     if event.get("ph") == "X" and event.get("cat") == "user_annotation" and event.get("name") in names),
                    key=lambda event: event["ts"])
    if len(ranges) != len(labels):
        return
    for event, label in zip(ranges, labels):
        event["name"] = label
    with opener(path, "wt") as file:
        json.dump(trace, file)


def cuda_initialized() -> bool:
    """Whether the process has a CUDA context (asked only once torch is imported)."""
    import torch

    return torch.cuda.is_initialized()


def process_start_seconds() -> float:
    """The unix time this process started (psutil reads it from the kernel); now, where it cannot be read."""
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # psutil absent or refused: the run's wall then starts at the first import of this module
        return time.time()


def versions() -> dict[str, str | None]:
    """Python's, rlperf's, torch's and numpy's versions, and those of the RL and env libraries the process imported
    (RL_LIBRARIES), read from their installed distributions where the module has no `__version__`."""
    found = {"python": platform.python_version(), "rlperf": __version__}
    for name in ("torch", "numpy"):
        module = sys.modules.get(name)
        found[name] = getattr(module, "__version__", None) if module is not None else None
    for name in RL_LIBRARIES:
        if name in sys.modules:
            found[name] = library_version(name)
    return found


def library_version(module_name: str) -> str | None:
    version = getattr(sys.modules[module_name], "__version__", None)
    if isinstance(version, str):
        return version
    from importlib import metadata

    for distribution in metadata.packages_distributions().get(module_name, []):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


# ---- the module's API: one clock per process, only while the harness asks for a summary ------------------

_clock: PhaseClock | None = None
_path: str | None = None


class _Phase:
    """The context manager of one phase name; made once per name, so a `with` costs two calls."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __enter__(self) -> None:
        if _clock is not None:
            _clock.enter(self.name)

    def __exit__(self, *exc_info) -> None:
        if _clock is not None:
            _clock.exit(self.name)


_PHASE_MANAGERS = {name: _Phase(name) for name in PHASES}


def phase(name: str) -> _Phase:
    """The context manager of phase `name` (one of the reference trainer's names: rlperf.summary.PHASES)."""
    try:
        return _PHASE_MANAGERS[name]
    except KeyError:
        raise PhaseError(f"unknown phase {name!r} (allowed: {', '.join(PHASES)})") from None


def enter(name: str) -> None:
    """Opens phase `name` without a `with` (close it with `exit(name)`)."""
    phase(name).__enter__()


def exit(name: str) -> None:  # noqa: A001 - the API's pair to enter
    phase(name).__exit__(None, None, None)


def steps(count: int) -> None:
    """Counts `count` agent steps (environment steps times agents) in the epoch in progress."""
    if _clock is not None:
        _clock.steps(count)


def end_epoch() -> None:
    """Ends the epoch in progress (one rollout and its update); the next begins at once."""
    if _clock is not None:
        _clock.end_epoch()


def configure(**settings: Any) -> None:
    """Records the run's settings in the summary's `config` (for example `num_envs=8`)."""
    if _clock is not None:
        _clock.config.update(settings)


def finish() -> bool:
    """Writes the summary now (else it is written at exit); True when one was written."""
    if _clock is None or _clock.finished:
        return False
    return _clock.write(_path)


def active() -> bool:
    """Whether this process is timing its phases (the harness asked for a summary)."""
    return _clock is not None


def start(path: str, writer: str = "phases", environ: dict[str, str] | None = None) -> PhaseClock:
    """Starts timing this process's phases, the summary to be written to `path` (and its steady epochs traced,
    where the environment names a trace)."""
    global _clock, _path
    environ = os.environ if environ is None else environ
    settings = {"writer": writer, "warmup_epochs": parse_warmup(environ.get(WARMUP_VARIABLE, "1")),
                "delays_ms": parse_delays(environ.get(DELAY_VARIABLE, "")),
                "delay_every": parse_delay_every(environ.get(DELAY_EVERY_VARIABLE, "1"))}
    trace = environ.get(TRACE_VARIABLE)
    _clock = (TracedPhaseClock(trace, parse_trace_epochs(environ.get(TRACE_EPOCHS_VARIABLE, "1")), **settings)
              if trace else PhaseClock(**settings))
    _path = path
    os.environ[OWNER_VARIABLE] = str(os.getpid())
    atexit.register(finish)
    os.register_at_fork(after_in_child=_stop_in_child)
    return _clock


def stop() -> None:
    """Stops timing without writing a summary (a test's clean-up; a process that changes its mind)."""
    global _clock
    if _clock is not None:
        _clock.finished = True
    _clock = None


def _stop_in_child() -> None:
    """A forked child (an env worker) times nothing and writes nothing: the summary is its parent's."""
    global _clock
    _clock = None


def _start_from_environment() -> None:
    path = os.environ.get(SUMMARY_VARIABLE)
    owner = os.environ.get(OWNER_VARIABLE)
    if path and (owner is None or owner == str(os.getpid())):
        try:
            start(path)
        except PhaseError as exc:  # the harness's variables are bad input: one line, exit 2
            sys.stderr.write(f"rlperf.phases: {exc}\n")
            raise SystemExit(2) from None


_start_from_environment()
