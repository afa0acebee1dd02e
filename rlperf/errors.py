"""The two kinds of error a command ends with in one line: bad input (exit 2) and a fault of the machine
(exit 1), the checks of output paths that raise them, and the one way an output file is written: whole."""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import tempfile
from collections.abc import Iterator
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


def output_file(path: str | os.PathLike, field: str) -> Path:
    """Checks, before any work is done, that a file can be written at `path`: a directory there is bad input, a
    directory that cannot be written is a fault (output_dir)."""
    path = Path(path)
    if path.is_dir():
        raise BadInput(f"{field}: {path} is a directory; name a file")
    output_dir(path.parent, field)
    return path


@contextlib.contextmanager
def written_whole(path: str | os.PathLike) -> Iterator[Path]:
    """A partial file beside `path` for the block to write, which replaces `path` only when the block ends
    without error: a reader, or a disk that fills meanwhile, never leaves half a file at `path`. A write the
    machine refuses is a MachineFault naming `path`."""
    path = Path(path)
    partial = path.with_name(path.name + ".partial")
    try:
        yield partial
        os.replace(partial, path)
    except OSError as exc:
        if not is_machine_fault(exc):
            raise
        raise MachineFault(f"{path}: {exc.strerror or exc}") from None
    finally:
        partial.unlink(missing_ok=True)
