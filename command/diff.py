"""`rlperf diff A B`: the traced diff of two existing profile directories (two machines, two runs, two commands):
B against A, phase by phase, then operator by operator inside the phases that changed (docs/profiling.md#traced-diffs).

A and B are each `rlperf profile --out DIR`'s directory (one process) or a directory of such profiles, one per
process (`rlperf profile --against`'s OUT/ref and OUT/new). What cannot be compared is refused in one line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from decisions.trace_diff import DEFAULT_ALPHA
from rlperf.arguments import add_alpha
from rlperf.errors import output_dir, output_file, written_whole


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help="the profile directory compared against (the reference side)")
    parser.add_argument("b", metavar="B", help="the profile directory compared (the side whose changes are shown)")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="write diff.json, diff.md and diff.html here (default: print only)")
    parser.add_argument("--json", metavar="FILE", default=None, help="also write the diff as JSON here (default: none)")
    add_alpha(parser, "the chance that the diff claims some phase changed when none did", DEFAULT_ALPHA)


def run(args: argparse.Namespace) -> int:
    from profilers.profile_sets import read_side
    from reports.trace_diff import compared, print_diff, write_diff
    from rlperf.terminal import default_console

    if args.json:
        output_file(args.json, "json")
    if args.out:
        output_dir(Path(args.out), "out")
    found = compared({"A": read_side(args.a, "a"), "B": read_side(args.b, "b")}, args.alpha)
    console = default_console()
    console.print(f"A: {args.a}; B: {args.b}", markup=False, soft_wrap=True)
    print_diff(console, found)
    if args.out:
        paths = write_diff(found, Path(args.out))
        console.print(f"diff: {', '.join(map(str, paths))}", markup=False, soft_wrap=True)
    if args.json:
        with written_whole(args.json) as partial:
            partial.write_text(json.dumps(found, indent=1))
    return 0
