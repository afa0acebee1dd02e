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
    from reports.formatting import print_table
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


def print_verdicts(console, verdicts) -> None:
    from rich.table import Table
    from rich.text import Text

    from reports.formatting import fmt_change, fmt_detectable, fmt_sps
    from decisions.verdicts import fmt_interval

    colors = {"regressed": "bold red", "improved": "green", "failed": "magenta", "missing": "yellow", "new": "cyan",
              "inconclusive": "yellow"}
    table = Table(title="verdicts against the baseline")
    for column in ("point", "status", "baseline SPS", "SPS", "change (interval)", "detects"):
        table.add_column(column, no_wrap=True)  # point names stay whole in CI logs; the note takes the rest
    table.add_column("phases that grew; note", overflow="fold")
    for verdict in verdicts:
        sps = verdict.sps
        grew = ", ".join(f"{phase} {fmt_change(change.relative)}" for phase, change in verdict.phases_grew)
        # Text cells, not markup: point labels and reasons come from results and may contain brackets.
        table.add_row(
            Text(verdict.point), Text(verdict.status, style=colors.get(verdict.status, "")),
            fmt_sps(sps.baseline) if sps else "–", fmt_sps(sps.candidate) if sps else "–",
            f"{fmt_change(sps.relative)} {fmt_interval(sps)}" if sps else "–",
            fmt_detectable(verdict.detectable) if sps else "–",
            Text("; ".join(text for text in (grew, verdict.reason) if text)),
        )
    console.print(table)


def print_gate(console, found, plan) -> None:
    from rich.table import Table
    from rich.text import Text

    from decisions import screening
    from reports.formatting import fmt_change, fmt_detectable
    from decisions.verdicts import fmt_interval

    colors = {screening.REGRESSED: "bold red", screening.PASSED: "green", screening.NOT_CONFIRMED: "yellow",
              screening.UNMEASURED: "magenta", screening.UNDECIDED: "magenta", screening.SKIPPED: "dim"}
    table = Table(title="gate: did any point get slower?")
    for column in ("point", "status", "screen (pairs)", "pair noise", "confirmation (pairs)", "detects"):
        table.add_column(column, no_wrap=True)
    table.add_column("note", overflow="fold")
    for verdict in found:
        screen, sps = verdict.screen, verdict.confirmation.sps if verdict.confirmation else None
        table.add_row(
            Text(verdict.point), Text(verdict.status, style=colors.get(verdict.status, "")),
            f"{fmt_change(screen.estimate)} ({screen.quiet}/{screen.pairs})" if screen.quiet else "–",
            f"{screen.spread:.1%}" if screen.quiet > 1 else "–",
            f"{fmt_change(sps.relative)} {fmt_interval(sps)} ({sps.n_candidate})" if sps else "–",
            fmt_detectable(screening.point_detectable(plan, screen)),
            Text(verdict.note or screen.reason))
    console.print(table)
