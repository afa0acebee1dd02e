"""`rlperf profile --against REF`: the working tree and REF traced in one job, each from a checkout beside the
working tree (benches/worktrees.py), `processes` traced processes a side started in turn (REF, working tree, REF,
...), then their diff (decisions/trace_diff.py) shown and written beside the traces (docs/profiling.md#traced-diffs).

Each process is a profile directory of its own, `OUT/ref/N` or `OUT/new/N`, its trace named by side and process
(`trace-ref-1.json.gz`), so that `rlperf diff OUT/ref OUT/new` reads the same diff again.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from benches.worktrees import checkouts, resolve_commit, working_tree_commit
from profilers.profile_run import PROFILE_NAME, TRACE_NAME, ProfileResult
from profilers.profile_sets import read_side
from reference_trainer.config import TrainConfig, from_dict
from reports.trace_diff import compared, print_diff, write_diff
from rlperf.errors import BadInput
from rlperf.processes import run_to_completion
from rlperf.terminal import say_on

SIDES = ("ref", "new")
# One side's process traced from a checkout into a directory: profile_run or profile_command, bound to the options.
TraceOne = Callable[[Path, Path], ProfileResult]


def traced_against(ref: str, processes: int, out_dir: Path, trace_one: TraceOne, console: Console,
                   alpha: float, at: str | None = None) -> tuple[int, dict | None]:
    """Both sides traced and diffed: REF against the working tree, or against commit `at`; the exit code and the
    diff (None where a process failed: its message said why)."""
    say = say_on(console)
    commit, new_commit = checked_sides(ref, at, processes)
    labels = {"ref": f"{ref} ({commit[:10]})",
              "new": f"{at} ({new_commit[:10]})" if new_commit else "working tree"}
    # twin checkouts in one folder, the working tree's state committed to a ref of its own where it is a side
    with checkouts({"ref": commit, "new": new_commit or working_tree_commit()}, say) as trees:
        for index in range(1, processes + 1):
            for side in SIDES:
                directory = out_dir / side / str(index)
                say(f"profile: tracing {labels[side]}, process {index} of {processes}")
                result = trace_one(trees[side], directory)
                for message in result.messages:
                    say(f"profile: {side} {index}: {message}")
                if result.returncode != 0:
                    return result.returncode, None
                name_trace(directory, f"{side}-{index}")
    found = compared({labels["ref"]: read_side(out_dir / "ref", "ref"),
                      labels["new"]: read_side(out_dir / "new", "new")}, alpha)
    found["labels"] = labels
    found["again"] = f"rlperf diff {out_dir / 'ref'} {out_dir / 'new'}"
    paths = write_diff(found, out_dir)
    print_diff(console, found)
    console.print(f"diff: {', '.join(map(str, paths))}; traces for ui.perfetto.dev in {out_dir}/ref/N and "
                  f"{out_dir}/new/N; `{found['again']}` reads it again", markup=False, soft_wrap=True)
    return 0, found


def checked_sides(ref: str, at: str | None, processes: int) -> tuple[str, str | None]:
    """The commits of both sides (None for the working tree); bad input, before anything is made, where a ref names
    no commit or a side would have no spread."""
    if processes < 2:
        raise BadInput(f"processes: at least 2 a side, so that each side has a spread to judge by (got {processes})")
    return resolve_commit(ref), resolve_commit(at, "at") if at is not None else None


def name_trace(directory: Path, name: str) -> Path:
    """The process's trace renamed `trace-NAME.json.gz` (side and process in the file name, as a trace opened
    beside others shows it), and its profile.json pointed at it."""
    renamed = directory / f"trace-{name}.json.gz"
    (directory / TRACE_NAME).rename(renamed)
    profile_path = directory / PROFILE_NAME
    profile = json.loads(profile_path.read_text())
    profile["trace"] = profile["trace_summary"]["trace"] = str(renamed)
    profile_path.write_text(json.dumps(profile, indent=1))
    return renamed


def against_command(config: dict, ref: str, at: str | None, out: str) -> list[str]:
    """The `rlperf profile --against` command that diffs a point (a suite point's config: the reference trainer's,
    or a command's) at commit `at` (None: the working tree) against `ref`."""
    sides = ["--against", ref, *(["--at", at] if at else []), "--out", out]
    if "command" in config:
        return ["rlperf", "profile", "--device", str(config.get("device", "cpu")), "--warmup-epochs",
                str(config.get("warmup_epochs", 1)), *sides, "--", *config["command"]]
    fields = set(TrainConfig().to_dict())
    cfg = from_dict({name: value for name, value in config.items() if name in fields})
    return ["rlperf", "profile", *cfg.to_args(leave_out=("trace_dir", "trace_epochs")), *sides]


def shell_line(words: list[str]) -> str:
    """`words` as a shell line to paste: quoted only where a shell would read a word otherwise (a ref such as
    HEAD~1 stays as written: a tilde inside a word is not expanded)."""
    return " ".join(word if re.fullmatch(r"[\w@%+=:,./^-][\w@%+=:,./~^-]*", word) else shlex.quote(word)
                    for word in words)


def follow_up(say, config: dict, ref: str, at: str | None, out: str, run: bool, deadline: float | None) -> None:
    """The last lines of a command that named a commit and a phase: the diff that says which operator, and with
    `run` that diff made now, unless the budget (a time.monotonic() deadline) is spent."""
    command = against_command(config, ref, at, out)
    say(f"which operator: {shell_line(command)}")
    if not run:
        return
    left = None if deadline is None else deadline - time.monotonic()
    if left is not None and left <= 0:
        say("diff: skipped: the budget is spent (run the command above)")
        return
    code = run_to_completion([sys.executable, "-m", "rlperf", *command[1:]], timeout_s=left)
    if code == 124:
        say("diff: ended: it ran past the budget (run the command above)")
