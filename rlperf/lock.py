"""One measurement at a time per machine: `rlperf bench` holds an exclusive lock on one file for as long as
it measures, so two sweeps (or two `--resume` of one run) never run their points together and measure
each other. The lock file holds who has it (pid, run, suite, store, start time) for the one that waits.

The file is machine-wide (`/tmp/rlperf-bench.lock`, or $RLPERF_LOCK). The lock is flock's: the kernel
releases it when the holder exits, however it exits, so a killed sweep never leaves the machine locked.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlperf.errors import MachineFault, fault

DEFAULT_PATH = "/tmp/rlperf-bench.lock"


def lock_path() -> Path:
    return Path(os.environ.get("RLPERF_LOCK") or DEFAULT_PATH)


class MeasurementLock:
    def __init__(self, path: Path | None = None):
        self.path = path or lock_path()
        self.fd: int | None = None
        self.holder: dict[str, Any] = {}

    def acquire(self, wait: bool, say: Callable[[str], None], **holder: Any) -> None:
        """Takes the lock. When another process has it: with `wait`, says once who has it and waits;
        without, raises MachineFault naming the holder."""
        try:
            # Another user's lock file may be read-only to us; flock works on a read-only descriptor too.
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            except PermissionError:
                self.fd = os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            raise fault(self.path, exc) from None
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            busy = f"another rlperf bench is measuring on this machine ({describe(read_holder(self.path))})"
            if not wait:
                self.release()
                raise MachineFault(f"{busy}; refused by --no-wait (lock {self.path})") from None
            say(f"waiting: {busy}")
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        self.update(pid=os.getpid(), since=datetime.now(timezone.utc).isoformat(timespec="seconds"), **holder)

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
