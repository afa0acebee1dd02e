"""One measurement at a time per machine: `rlperf bench` holds an exclusive lock on one file for as long as
it measures, so two sweeps (or two `--resume` of one run) never run their points together and measure
each other. The lock file holds who has it (pid, run, suite, store, start time) for the one that waits.

A wait can be long (a nightly gate holds the lock for hours): the waiting side says who holds the lock when it
starts waiting, then how long it has waited (after 30 s, 1, 2 and 5 minutes, then every 10 minutes), and
when the lock came.

The file is machine-wide (`/tmp/rlperf-bench.lock`, or $RLPERF_LOCK). The lock is flock's: the kernel
releases it when the holder exits, however it exits, so a killed sweep never leaves the machine locked.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlperf.errors import MachineFault, fault

DEFAULT_PATH = "/tmp/rlperf-bench.lock"
POLL_S = 0.25  # how often a waiting process tries the lock again
# how long into a wait it says it is still waiting: at these, then every WAIT_REPORT_EVERY_S
WAIT_REPORTS_S = (30.0, 60.0, 120.0, 300.0)
WAIT_REPORT_EVERY_S = 600.0


def lock_path() -> Path:
    return Path(os.environ.get("RLPERF_LOCK") or DEFAULT_PATH)


class MeasurementLock:
    def __init__(self, path: Path | None = None):
        self.path = path or lock_path()
        self.fd: int | None = None
        self.holder: dict[str, Any] = {}

    def acquire(self, wait: bool, say: Callable[[str], None], **holder: Any) -> None:
        """Takes the lock. When another process has it: with `wait`, says who has it, waits, saying now and then
        how long it has waited, and says when the lock came; without, raises MachineFault naming the holder."""
        try:
            # Another user's lock file may be read-only to us; flock works on a read-only descriptor too.
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except PermissionError:
                self.fd = os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            raise fault(self.path, exc) from None
        if not self.try_lock():
            busy = f"another rlperf bench is measuring on this machine ({describe(read_holder(self.path))})"
            if not wait:
                self.release()
                raise MachineFault(f"{busy}; refused by --no-wait (lock {self.path})")
            say(f"waiting: {busy}")
            self.wait_for(say)
        self.update(pid=os.getpid(), since=datetime.now(timezone.utc).isoformat(timespec="seconds"), **holder)

    def wait_for(self, say: Callable[[str], None]) -> None:
        started = time.monotonic()
        reports = report_times()
        next_report = next(reports)
        while not self.try_lock():
            waited = time.monotonic() - started
            if waited >= next_report:
                say(f"still waiting after {duration(waited)}: {describe(read_holder(self.path))}")
                next_report = next(reports)
            time.sleep(POLL_S)
        say(f"the lock came after {duration(time.monotonic() - started)} of waiting, at "
            f"{datetime.now().astimezone().strftime('%H:%M:%S')}")

    def try_lock(self) -> bool:
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def update(self, **holder: Any) -> None:
        """Records (more of) who holds the lock, e.g. the run id once the run has one."""
        self.holder.update(holder)
        if self.fd is None:
            return
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, json.dumps(self.holder).encode(), 0)
        except OSError:
            pass  # a lock file we may not write still locks; the waiting side then names no holder

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the only descriptor releases the flock
            self.fd = None

    def __enter__(self) -> "MeasurementLock":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def read_holder(path: Path) -> dict[str, Any]:
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "holder unknown"
    parts = [f"pid {holder.get('pid', '?')}"]
    if holder.get("run_id"):
        parts.append(f"run {holder['run_id']}")
    parts += [f"{key} {holder[key]}" for key in ("suite", "store", "since") if holder.get(key)]
    return ", ".join(parts)


def report_times() -> Iterator[float]:
    """Seconds into a wait at which to say it goes on: WAIT_REPORTS_S, then every WAIT_REPORT_EVERY_S."""
    yield from WAIT_REPORTS_S
    at = WAIT_REPORTS_S[-1] if WAIT_REPORTS_S else 0.0
    while True:
        at += WAIT_REPORT_EVERY_S
        yield at


def duration(seconds: float) -> str:
    """`42 s`, `17 min 3 s`, `2 h 5 min`."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"

