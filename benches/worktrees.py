"""Commits checked out beside the working tree: detached git worktrees in a temporary directory, for the commands
that measure another commit than the working tree's (--against, the gate, bisect, confirm); where the working tree
is one side, its state is checked out too, beside the other at a path of equal length (`twin_worktrees`).

A process killed by SIGKILL (a CI step's timeout) cannot remove its checkout. Each checkout therefore names its
owner, and every new checkout first removes those whose owner is gone; a live owner's are never touched."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

from rlperf.errors import BadInput
from rlperf.machine import measured_repository

PREFIX = "rlperf-worktree-"
OWNER_FILE = "owner.json"  # beside the checkout: the pid and start time of the process that made it
# psutil derives a start time from clock ticks since boot: the same process reads the same to well within this
START_TIME_SLACK_S = 1.0


def resolve_commit(ref: str, field: str = "against") -> str:
    """The commit REF names in this repository; bad input, named by `field`, when it names none."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    except subprocess.CalledProcessError:
        raise BadInput(f"{field}: {ref!r} is not a commit of the repository at {measured_repository()}") from None
    except FileNotFoundError:
        raise BadInput(f"{field}: needs git, which is not installed") from None


def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd or measured_repository(), capture_output=True, text=True,
                          check=True).stdout.strip()


@contextlib.contextmanager
def worktree(commit: str, say: Callable[[str], None] = lambda text: None) -> Iterator[Path]:
    """A detached checkout of `commit` in a temporary directory, removed afterwards (`checkouts`)."""
    with checkouts({"tree": commit}, say) as paths:
        yield paths["tree"]


@contextlib.contextmanager
def twin_worktrees(commit: str, say: Callable[[str], None] = lambda text: None) -> Iterator[dict[str, Path]]:
    """Both sides of a comparison of the working tree with `commit`, checked out side by side at paths of equal
    length in one temporary directory: "ref" at `commit`, "new" at the working tree as it is now, uncommitted edits
    and untracked files included (`working_tree_commit`). Their processes then differ in nothing but the code, where
    the working tree's own path gave its side an offset of its own (docs/decision-rules.md)."""
    with checkouts({"ref": commit, "new": working_tree_commit()}, say) as paths:
        yield paths


@contextlib.contextmanager
def checkouts(commits: dict[str, str], say: Callable[[str], None] = lambda text: None) -> Iterator[dict[str, Path]]:
    """Detached checkouts of `commits` (folder name -> commit) in one temporary directory, removed afterwards. The
    directory names its owner, this process, so that what an owner killed before it could remove it leaves is
    pruned by the next checkout made (`prune_abandoned`, which says what it removed through `say`)."""
    prune_abandoned(say)
    parent = Path(tempfile.mkdtemp(prefix=PREFIX))
    paths = {name: parent / name for name in commits}
    try:
        (parent / OWNER_FILE).write_text(json.dumps(this_owner()))
        for name, commit in commits.items():
            git("worktree", "add", "--detach", str(paths[name]), commit)
        yield paths
    finally:
        for path in paths.values():
            with contextlib.suppress(subprocess.CalledProcessError):
                git("worktree", "remove", "--force", str(path))
        shutil.rmtree(parent, ignore_errors=True)


# who a commit of the working tree's state names: git refuses a commit without an author
STATE_AUTHOR = {"GIT_AUTHOR_NAME": "rlperf", "GIT_AUTHOR_EMAIL": "rlperf@localhost",
                "GIT_COMMITTER_NAME": "rlperf", "GIT_COMMITTER_EMAIL": "rlperf@localhost"}


def working_tree_commit() -> str:
    """The working tree as it is, as a commit on HEAD that no branch names (what `git stash create` makes, with the
    untracked files git does not ignore too), written through an index of its own: the repository's index, branches
    and stashes are untouched. A checkout's HEAD keeps it from git's garbage collection while the checkout lives."""
    repo = measured_repository()
    index = repo / git("rev-parse", "--git-path", "index")
    with tempfile.TemporaryDirectory(prefix="rlperf-index-") as scratch:
        own_index = Path(scratch) / "index"
        if index.exists():
            shutil.copyfile(index, own_index)  # its cached file stats spare `add` rereading unchanged files
        env = {**os.environ, **STATE_AUTHOR, "GIT_INDEX_FILE": str(own_index)}

        def in_own_index(*args: str) -> str:
            return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True,
                                  env=env).stdout.strip()

        in_own_index("add", "--all")
        tree = in_own_index("write-tree")
        return in_own_index("commit-tree", tree, "-p", "HEAD", "-m", "rlperf: the working tree as measured")


def this_owner() -> dict[str, Any]:
    """This process as a checkout's owner: a pid is reused once its process is gone, its start time is not."""
    return {"pid": os.getpid(), "started": psutil.Process().create_time(), "repo": str(measured_repository())}


def owner_alive(owner: dict[str, Any]) -> bool:
    try:
        started = psutil.Process(owner["pid"]).create_time()
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
    return abs(started - owner["started"]) < START_TIME_SLACK_S


def read_owner(parent: Path) -> dict[str, Any] | None:
    try:
        owner = json.loads((parent / OWNER_FILE).read_text())
        owner["pid"], owner["started"] = int(owner["pid"]), float(owner["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # another user's, or one whose owner was killed before it wrote this: left alone
    return owner


def prune_abandoned(say: Callable[[str], None] = lambda text: None) -> list[Path]:
    """Removes the checkouts in the temporary directory whose owner is gone (killed by SIGKILL, as a CI step's
    timeout does, before it could remove them), with git's record of each in the owner's repository, and the
    records this repository keeps of checkouts whose directory is gone. Returns the directories removed."""
    removed = []
    for parent in sorted(Path(tempfile.gettempdir()).glob(PREFIX + "*")):
        owner = read_owner(parent)
        if owner is None or owner_alive(owner):
            continue
        repo = Path(owner.get("repo") or measured_repository())
        for tree in (path for path in parent.iterdir() if path.is_dir()) if repo.is_dir() else ():
            with contextlib.suppress(subprocess.CalledProcessError, OSError):
                git("worktree", "remove", "--force", str(tree), cwd=repo)
        shutil.rmtree(parent, ignore_errors=True)
        removed.append(parent)
    with contextlib.suppress(subprocess.CalledProcessError, OSError):
        git("worktree", "prune")
    if removed:
        say(f"removed {len(removed)} checkout(s) left by a killed process: " + ", ".join(map(str, removed)))
    return removed
