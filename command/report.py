"""`rlperf report`: the report of one run (report.md, report.html), verdicts against a baseline, or the
nightly trend of a whole store (--history)."""

from __future__ import annotations

import argparse

from decisions.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from rlperf.arguments import add_alpha, add_threshold

EXIT_CODES = ("exit code: 1 when a point regressed (or could not be decided, with --fail-on-inconclusive), "
              "0 otherwise, 2 for bad input")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = f"{parser.description}. {EXIT_CODES}."
    parser.add_argument("results", nargs="?", metavar="RESULTS",
                        help="a results store, optionally PATH::RUN_ID (default: its latest run)")
    parser.add_argument("--baseline", metavar="BASELINE",
                        help="results to compare with: PATH or PATH::RUN_ID (default: none, no verdicts)")
    parser.add_argument("--out", default="report", metavar="DIR", help="where report.md and report.html go "
                        "(default: ./report)")
    add_threshold(parser, "smallest relative change that counts", DEFAULT_THRESHOLD)
    add_alpha(parser, "one minus the confidence of each change's interval, and the false-discovery rate of the "
                      "claims across points", DEFAULT_ALPHA, intervals=True)
    parser.add_argument("--fail-on-inconclusive", action="store_true",
                        help="exit 1 also when a point's change could not be decided either way (default: only "
                             "on a regression)")
    parser.add_argument("--allow-cross-machine", action="store_true",
                        help="compare with a baseline measured on another kind of machine (default: refused)")
    parser.add_argument("--history", metavar="STORE",
                        help="instead of one run: SPS over commits for every point in STORE, regressions marked "
                             "(default: report one run)")


def run(args: argparse.Namespace) -> int:
    from reports.formatting import print_table, print_verdicts
    from reports.history import print_changes, render_history
    from reports.render import render
    from decisions.rundata import load
    from rlperf.errors import BadInput
    from rlperf.terminal import default_console

    # Piped output (CI logs) stays wide, as the bench's table does, so point names are not split.
    console = default_console()
    if args.history:
        if args.results or args.baseline:
            raise BadInput("history: give either RESULTS or --history STORE, not both")
        paths, summary, changes = render_history(args.history, args.out, args.threshold, args.alpha)
        print_table(console, summary, "latest run of each suite and machine, against the run before it")
        print_changes(console, changes)
        console.print(f"history report: {paths[0]} and {paths[1]}", markup=False)
        return 0
    if not args.results:
        raise BadInput("results: a results store is required (PATH or PATH::RUN_ID)")
    candidate = load(args.results)
    baseline = load(args.baseline, field="baseline") if args.baseline else None
    code, verdicts, paths = render(candidate, args.out, baseline, args.threshold, args.alpha,
                                   args.allow_cross_machine, args.fail_on_inconclusive)
    if verdicts:
        print_verdicts(console, verdicts)
    console.print(f"report: {paths[0]} and {paths[1]}", markup=False)
    return code
