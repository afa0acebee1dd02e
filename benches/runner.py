"""Runs one suite point: R repeats of `python -m rlperf train`, each a process of its own with its own timeout,
its output kept in a log file, and utilization sampled around it. A repeat's process is forked from a warm
interpreter that has imported torch (rlperf/forkserver.py), or started fresh: `Launcher`.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from profilers.attach_command import ATTACH_VARIABLES, attached_environment, resolved
from rlperf.errors import BadInput
from rlperf.store import PointRecord, utc_now
from rlperf.summary import RunSummary
from benches.suite import Point
from profilers.interference import InterferenceMonitor
from reference_trainer.config import from_dict
from rlperf.forkserver import ForkedChild, ForkServer, ServerGone, forkable
from rlperf.machine import Machine, measured_repository, probe
from rlperf.processes import signal_name, spawn

REASON_LINES = 8
REASON_CHARS = 2000


def trainer_command(config: dict[str, Any], summary_path: Path, python: str = sys.executable) -> list[str]:
    """The reference trainer's command for a point, or a command point's own command, which runs in `rlperf
    attach`'s environment (`attached_environment_of`)."""
    if "command" in config:
        return list(config["command"])
    return [python, "-m", "rlperf", "train", *from_dict(config).to_args(), "--json", str(summary_path)]


def attached_environment_of(config: dict[str, Any], summary_path: Path) -> dict[str, str] | None:
    """The environment a command point's process starts in: `rlperf attach`'s, which has it write its summary to
    `summary_path` (and with `attach` false leaves the phases to its own rlperf.phases); None for the reference
    trainer, which takes its flags. The harness starts the command itself, fresh: an interpreter of `rlperf
    attach` between them would cost each repeat its start-up (0.17 s here)."""
    if "command" not in config:
        return None
    return attached_environment(summary_path, {}, config["warmup_epochs"], attach=config["attach"])


def environment_text(env: dict[str, str]) -> str:
    """The variables `rlperf attach` sets, as a shell line's prefix: a repeat's log shows how to run it again."""
    return " ".join(f"{name}={shlex.quote(env[name])}" for name in ATTACH_VARIABLES if env.get(name))


def repeat_config(config: dict[str, Any], repeat: int) -> dict[str, Any]:
    """The settings one repeat runs with. A point with a target_return measures learning, which varies by
    seed far more than speed does, so its repeat r trains with seed + r (each sample's summary records the
    seed it ran); every other point repeats the same work, so its repeats differ only by the machine's luck.
    Both sides of a comparison use the same seeds repeat by repeat."""
    if config.get("target_return") is None:
        return config
    return {**config, "seed": config["seed"] + repeat}


def last_lines(log_path: Path) -> str:
    try:
        lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return "\n".join(lines[-REASON_LINES:])[-REASON_CHARS:]


def config_mismatch(requested: dict[str, Any], ran: dict[str, Any]) -> str | None:
    """A setting the trainer did not honour (a knob silently ignored would make every figure a lie)."""
    for name, value in requested.items():
        if name in ran and ran[name] != value:
            return f"the trainer ran {name}={ran[name]!r} but the point asked for {value!r}"
    return None


class UtilizationProbe:
    """The profilers' NVML/CPU sampler, wrapped around each repeat; absent or disabled leaves no rows."""

    def __init__(self, sample_hz: float):
        self.sample_hz = sample_hz
        self.sampler_class = None
        self.unavailable: str | None = None
        if sample_hz <= 0:
            self.unavailable = "sampling turned off (sample_hz = 0)"
            return
        from profilers.sampler import UtilizationSampler

        self.sampler_class = UtilizationSampler

    def start(self, gpu_uuids: list[str]):
        if self.sampler_class is None:
            return None
        sampler = self.sampler_class(interval_s=1.0 / self.sample_hz, gpu_uuids=gpu_uuids)
        sampler.start()
        if gpu_uuids and sampler.unavailable and not self.unavailable:
            self.unavailable = sampler.unavailable
        return sampler


class Launcher:
    """Where and how one checkout's repeats start: in `cwd` (another checkout's code is imported from there),
    forked from one warm interpreter (`method` "forked"), or as fresh interpreters ("fresh"). The launchers made
    `beside` this one, for the other checkouts of a comparison, fork from the same server: an offset one server's
    children share then falls on every side alike, where a server per side made it read as a code change. A forked
    start that cannot be had (a command not of this interpreter, a server that refuses or dies starting) is a fresh
    one for every side, and the repeat's log says why."""

    def __init__(self, method: str = "forked", cwd: Path | None = None, shared: "Launcher | None" = None):
        self.method = method
        self.cwd = cwd
        self.owner = shared or self  # whose server every launcher beside it forks from, and who closes it
        self.server: ForkServer | None = None
        self.refused: str | None = None

    def beside(self, cwd: Path | None) -> "Launcher":
        """A launcher for the checkout in `cwd` that starts its repeats as this one does, from the same server."""
        return Launcher(self.method, cwd, self.owner)

    def __enter__(self) -> "Launcher":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        if self.owner is self and self.server is not None:
            self.server.close()
            self.server = None

    def prepare(self, command: list[str], fresh: bool = False) -> ForkServer | None:
        """The server that will fork `command`, started (its imports done) on first use; None for a fresh start,
        which a `fresh` command always has (another trainer's, whose environment is read at its start). Called
        before a repeat's accounts open: the server's imports are neither the trainer's nor another program's."""
        owner = self.owner
        if self.method != "forked" or fresh or not forkable(command) or owner.refused is not None:
            return None
        if owner.server is None:
            try:
                server = ForkServer(owner.cwd)
            except ServerGone as gone:
                owner.refused = str(gone)
                return None
            if server.refused:
                owner.refused = f"the fork server refused: {server.refused}"
                server.close()
                return None
            owner.server = server
        return owner.server

    def probe_machine(self) -> Machine:
        """What the machine can run (rlperf/machine.py), asked of a child of the server that will fork the
        repeats, so that its imports are paid once for both; of a fresh interpreter if it cannot be forked."""
        server = self.prepare([sys.executable, "-m", "rlperf.machine"])
        try:
            return probe(server=server)
        except ServerGone:
            self.gone()
            return probe()

    def start(self, server: ForkServer | None, command: list[str], log, log_path: Path,
              env: dict[str, str] | None = None) -> ForkedChild | subprocess.Popen:
        """The repeat's process, in a session of its own (a timeout ends it and any ranks it started together),
        dying with this harness (through `spawn`, or with its server), its output in `log`; with `env`, another
        trainer's command in that environment."""
        if server is not None:
            return server.start(command, log_path, cwd=self.cwd)
        if self.method == "forked" and self.owner.refused:
            log.write(f"started fresh: {self.owner.refused}\n")
            log.flush()
        return spawn(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                     start_new_session=True, cwd=self.command_cwd(env is not None), env=env)

    def command_cwd(self, command_point: bool) -> Path | None:
        """Where a repeat runs: the checkout's directory; a command point from the root of its repository's
        checkout (the working tree's, or a commit's)."""
        return self.cwd or (measured_repository() if command_point else None)

    def gone(self) -> None:
        """The server died: the next repeat, of whichever side, starts another."""
        owner = self.owner
        if owner.server is not None:
            owner.server.close()
            owner.server = None


class PointRunner:
    """Runs points for one sweep; `command_for` is how a repeat's process is started (the trainer), `launcher`
    where and how (default: forked, in this process's directory); `side`, the side of a pair it runs ("ref" runs
    a point's [against] config where its suite has one)."""

    def __init__(self, run_dir: Path, repeats: int, timeout_s: float, utilization: UtilizationProbe,
                 command_for: Callable[[dict[str, Any], Path], list[str]] = trainer_command,
                 launcher: Launcher | None = None, side: str | None = None):
        self.run_dir = run_dir.absolute()  # the paths it hands the trainer must hold in another checkout too
        self.repeats = repeats
        self.timeout_s = timeout_s
        self.utilization = utilization
        self.command_for = command_for
        self.launcher = launcher or Launcher()
        self.side = side

    def point_dir(self, index: int, point: Point) -> Path:
        slug = "".join(c if c.isalnum() or c in "._" else "-" for c in point.label.replace(" ", "_"))
        return self.run_dir / "points" / f"{index:03d}_{slug}"[:120]

    def run(self, index: int, point: Point, gpu_uuids: list[str]) -> PointRecord:
        started_at, t0 = utc_now(), time.monotonic()
        record = PointRecord(point_key=point.key, config=point.config_for(self.side), status="ok",
                             started_at=started_at, seconds=0.0)
        directory = self.point_dir(index, point)
        directory.mkdir(parents=True, exist_ok=True)
        for repeat in range(self.repeats):
            status, reason, summary = self.run_repeat(point, repeat, directory, gpu_uuids, record)
            if status != "ok":
                record.status = status
                record.reason = f"repeat {repeat + 1} of {self.repeats}: {reason}"
                break
            record.samples.append((repeat, summary))
        record.seconds = time.monotonic() - t0
        return record

    def run_repeat(self, point: Point, repeat: int, directory: Path, gpu_uuids: list[str],
                   record: PointRecord) -> tuple[str, str | None, RunSummary | None]:
        summary_path = directory / f"repeat-{repeat}.json"
        log_path = directory / f"repeat-{repeat}.log"
        summary_path.unlink(missing_ok=True)
        config = repeat_config(point.config_for(self.side), repeat)
        command = self.command_for(config, summary_path)
        env = attached_environment_of(config, summary_path)
        if env is not None:
            try:
                command = resolved(command, self.launcher.command_cwd(True))
            except BadInput as exc:
                log_path.write_text(f"$ {' '.join(command)}\n{exc}\n")
                return "failed", str(exc), None
        server = self.launcher.prepare(command, fresh=env is not None)
        sampler = self.utilization.start(gpu_uuids)
        monitor = InterferenceMonitor(gpu_uuids)
        timed_out = False
        child = None
        monitor.start()
        try:
            with open(log_path, "w") as log:
                log.write("$ " + (environment_text(env) + " " if env else "") + " ".join(command) + "\n")
                log.flush()
                child = self.launcher.start(server, command, log, log_path, env)
                try:
                    child.wait(timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    timed_out = True
                finally:
                    if child.returncode is None:
                        os.killpg(child.pid, signal.SIGKILL)
                        child.wait()
        except ServerGone as gone:  # the trainer died with it
            self.launcher.gone()
            return "failed", str(gone), None
        finally:
            rows = sampler.stop() if sampler is not None else []
            interference = monitor.stop(rows, child.cpu_seconds if isinstance(child, ForkedChild) else 0.0)
            record.utilization += [(repeat, *row) for row in rows]

        if timed_out:
            return "timeout", f"killed after {self.timeout_s:g} s\n{last_lines(log_path)}", None
        if child.returncode != 0:
            return "failed", f"{exit_text(child.returncode)}\n{last_lines(log_path)}", None
        try:
            summary = RunSummary.check(json.loads(summary_path.read_text()))
        except (OSError, ValueError) as exc:
            return "failed", f"exit code 0 but no readable summary ({exc})\n{last_lines(log_path)}", None
        except BadInput as exc:
            return "failed", f"exit code 0 but {exc}", None
        mismatch = config_mismatch(config, summary.config)
        if mismatch:
            return "failed", mismatch, None
        summary.interference = {**interference, "launch": "forked" if server is not None else "fresh"}
        return "ok", None, summary


def exit_text(returncode: int) -> str:
    name = signal_name(returncode)
    if name is not None:
        hint = " (the kernel's out-of-memory killer?)" if returncode == -signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exit code {returncode}"
