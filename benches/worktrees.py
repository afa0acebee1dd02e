"""Commits checked out beside the working tree: a detached git worktree of a commit in a temporary directory,
for the commands that measure another commit than the working tree's (--against, the gate, bisect, confirm)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

from rlperf.errors import BadInput
from rlperf.machine import REPO_ROOT


def resolve_commit(ref: str, field: str = "against") -> str:
    """The commit REF names in this repository; bad input, named by `field`, when it names none."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except subprocess.CalledProcessError:
        raise BadInput(f"{field}: {ref!r} is not a commit of the repository at {REPO_ROOT}") from None
    except FileNotFoundError:
        raise BadInput(f"{field}: needs git, which is not installed") from None


def git(*args: str, cwd: Path = REPO_ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


@contextlib.contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """A detached checkout of `commit` in a temporary directory, removed afterwards."""
    parent = Path(tempfile.mkdtemp(prefix="rlperf-against-"))
    path = parent / "tree"
    try:
        git("worktree", "add", "--detach", str(path), commit)
        yield path
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            git("worktree", "remove", "--force", str(path))
        shutil.rmtree(parent, ignore_errors=True)
