"""Both sides of a comparison with the working tree run from twin checkouts (benches/worktrees.py): the baseline
commit and the working tree's state, uncommitted edits included, at paths of equal length in one folder."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from benches.runner import Launcher
from benches.worktrees import OWNER_FILE, PREFIX, prune_abandoned, twin_worktrees
from rlperf.machine import REPOSITORY_VARIABLE
from projectrepo import GIT_ENV

# the module each side runs: it says which code it is and where it ran
SAYS = 'import json, os; print(json.dumps({{"code": "{code}", "cwd": os.getcwd()}}))\n'


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True,
                          env={**GIT_ENV, "PATH": "/usr/bin:/bin"}).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository with one commit, an uncommitted edit, an untracked file and an ignored one; checkouts go to a
    temporary folder of the test's own."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "says.py").write_text(SAYS.format(code="committed"))
    (repo / ".gitignore").write_text("ignored.txt\n__pycache__/\n")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "The committed code")
    (repo / "says.py").write_text(SAYS.format(code="uncommitted edit"))
    (repo / "untracked.py").write_text("VALUE = 1\n")
    (repo / "ignored.txt").write_text("not the code\n")
    monkeypatch.setenv(REPOSITORY_VARIABLE, str(repo))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    return repo


def ran(launcher: Launcher, log: Path) -> dict:
    command = [sys.executable, "-m", "says"]
    with open(log, "w") as out:
        assert launcher.start(launcher.prepare(command), command, out, log).wait(120) == 0
    return json.loads(log.read_text().splitlines()[-1])


def test_both_sides_run_from_paths_of_equal_length_in_one_folder_the_working_side_with_its_edits(repo, tmp_path):
    status, head = git(repo, "status", "--porcelain"), git(repo, "rev-parse", "HEAD")
    with twin_worktrees("HEAD") as trees, Launcher("forked") as server, server.beside(trees["ref"]) as ref, \
            server.beside(trees["new"]) as new:
        assert trees["ref"].parent == trees["new"].parent and trees["ref"].parent.name.startswith(PREFIX)
        assert len(str(trees["ref"])) == len(str(trees["new"]))
        seen = {"ref": ran(ref, tmp_path / "ref.log"), "new": ran(new, tmp_path / "new.log")}
        assert seen == {"ref": {"code": "committed", "cwd": str(trees["ref"])},
                        "new": {"code": "uncommitted edit", "cwd": str(trees["new"])}}
        assert (trees["new"] / "untracked.py").is_file() and not (trees["ref"] / "untracked.py").exists()
        assert not (trees["new"] / "ignored.txt").exists()
    # the repository is as it was: its index, branches and stashes untouched, no checkout left
    assert git(repo, "status", "--porcelain") == status and git(repo, "rev-parse", "HEAD") == head
    assert git(repo, "stash", "list") == "" and git(repo, "branch", "--format=%(refname)") == "refs/heads/main"
    assert len(git(repo, "worktree", "list").splitlines()) == 1 and list((tmp_path / "tmp").iterdir()) == []


def test_twin_checkouts_whose_owner_was_killed_are_both_pruned(repo, tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    with twin_worktrees("HEAD") as trees:
        parent = trees["ref"].parent
        # as a SIGKILLed gate leaves them: its owner file names a process that is gone
        (parent / OWNER_FILE).write_text(json.dumps({"pid": int(gone.stdout), "started": 0.0, "repo": str(repo)}))
        assert prune_abandoned() == [parent]
        assert not parent.exists() and len(git(repo, "worktree", "list").splitlines()) == 1
