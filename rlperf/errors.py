"""The two kinds of error a command ends with in one line: bad input (exit 2) and a fault of the machine
(exit 1), and the checks of output paths that raise them."""

from __future__ import annotations

import errno
import os
import sqlite3
import tempfile
from pathlib import Path


class BadInput(Exception):
    """User input that cannot be used. The message is one line naming the field and what is allowed;
    the command line prints it and exits with code 2."""


class ConfigError(BadInput, ValueError):
    """A setting of the trainer's config that cannot be used: names the field and what is allowed."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field_name = field_name


class MachineFault(Exception):
    """The machine refused a write (read-only file system, disk full, permission denied). The message is
    one line naming the path and the cause; the command line prints it and exits with code 1."""


# sqlite3 reports these as OperationalError with only a message to tell them apart.
SQLITE_FAULTS = ("readonly database", "database or disk is full", "unable to open database file", "disk I/O error")


def is_machine_fault(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.OperationalError):
        return any(text in str(exc) for text in SQLITE_FAULTS)
    return isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES,
                                                      errno.EPERM, errno.EIO)


def fault(path: str | os.PathLike | None, exc: BaseException) -> MachineFault:
    """A MachineFault naming the path (the one the error names, else `path`) and what the operating system
    or SQLite said."""
    cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    where = exc.filename if isinstance(exc, OSError) and exc.filename else path
    return MachineFault(cause if where is None else f"{where}: {cause}")


def output_dir(path: str | os.PathLike, field: str) -> Path:
    """Creates the output directory `path` if needed and checks that a file can be written in it, before any
    work is done. An existing file there is bad input; a directory that cannot be written is a fault."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise BadInput(f"{field}: {path} exists and is not a directory; name a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        # Named by the directory: the probe file's temporary name would mean nothing to the reader.
        cause = f"{field}: {path}: {exc.strerror or exc}"
        raise (MachineFault(cause) if is_machine_fault(exc) else BadInput(cause)) from None
    return path
