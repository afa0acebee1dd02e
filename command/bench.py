"""`rlperf bench`: run a sweep suite, one fresh trainer process per repeat, every sample stored as it lands.

Importing this module stays cheap; torch is only ever imported by the processes it starts.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from decisions.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from rlperf.arguments import (add_alpha, add_budget, add_label, add_max_repeats, add_process_options, add_threshold,
                              positive_int)
from rlperf.errors import BadInput
from rlperf.layout import DEFAULT_OUT, STORE_FILE
from rlperf.processes import stop_signals_interrupt


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", default="smoke",
                        help="a suite in benches/suites (smoke, nightly, hardware, overhead, atari) or a path to a .toml "
                             "file (default smoke)")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"where the store ({STORE_FILE}), logs and reports go (default {DEFAULT_OUT}/)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the newest unfinished run of this suite in the store, skipping finished "
                             "points (default: start a new run)")
    parser.add_argument("--repeats", type=positive_int, metavar="R",
                        help="fresh processes per point (default: the suite's `repeats`)")
    add_process_options(parser, "every point")
    add_label(parser, "none")
    parser.add_argument("--export", metavar="PATH", type=Path,
                        help="also write the run's samples as a flat table: .csv, .parquet or .json (default: none)")
    parser.add_argument("--baseline", metavar="RESULTS", default=os.environ.get("RLPERF_BASELINE") or None,
                        help="compare the report with this store (PATH or PATH::RUN_ID); exit 1 on a regression "
                             "(default: $RLPERF_BASELINE, else no comparison)")
    parser.add_argument("--against", metavar="REF",
                        help="measure the suite at git REF (a temporary worktree) and at the working tree, in "
                             "alternating processes, and judge the working tree against REF (default: no comparison; a "
                             "suite with an [against] table is measured in pairs against it, at the working tree)")
    parser.add_argument("--until-decided", action="store_true",
                        help="with pairs (--against, or a suite's [against]): add pairs of processes to each point "
                             "until its verdict is decided, "
                             "spending alpha over the looks (default: the suite's repeats in pairs, judged once)")
    add_max_repeats(parser, "with --until-decided: at most N pairs per point")
    add_budget(parser, "with --until-decided: seconds each point may take before its pairs so far are judged one "
                       "last time")
    add_threshold(parser, "smallest relative change of SPS that counts", DEFAULT_THRESHOLD)
    add_alpha(parser, "one minus the confidence of each change's interval", DEFAULT_ALPHA, intervals=True)
    parser.add_argument("--fail-on-inconclusive", action="store_true",
                        help="with --baseline or --against: exit 1 also when a point could not be decided "
                             "(default: only on a regression)")


def run(args: argparse.Namespace) -> int:
    paired = args.against is not None or has_against_table(args.suite)
    check_combinations(args, paired)
    with stop_signals_interrupt():
        return against(args) if paired else sweep(args)


def has_against_table(suite: str) -> bool:
    """Whether the suite measures its points in pairs against its own [against] settings (a bad suite is refused
    here, in one line)."""
    from benches import suite as suites

    return suites.load(suite).against is not None


def check_combinations(args: argparse.Namespace, paired: bool) -> None:
    if not paired:
        if args.until_decided:
            raise BadInput("until-decided: needs --against REF, or a suite with an [against] table (pairs of "
                           "processes to add)")
        return
    pairs = "--against (REF's run" if args.against is not None else "a suite with [against] (its [against] side's run"
    for flag, value in (("resume", args.resume), ("export", args.export), ("baseline", args.baseline)):
        if value:
            raise BadInput(f"{flag}: cannot be combined with {pairs} is the baseline)")
    if args.until_decided and args.repeats:
        raise BadInput("repeats: with --until-decided the pairs are added until decided; use --max-repeats")


def sweep(args: argparse.Namespace) -> int:
    """Sweep, then report: the run is measured and stored, then judged against the baseline if one is named."""
    from benches.options import ProcessOptions
    from benches.sweep import Sweep
    from reports.render import render
    from decisions.rundata import load, load_run
    from rlperf.store import Store

    # A bad baseline stops here, before any point runs. Loading it now also pins its run: a bare PATH cannot
    # come to mean this very run once it is the store's latest.
    baseline = load(args.baseline, field="baseline") if args.baseline else None
    options = ProcessOptions.from_args(args)
    sweep = Sweep(options, resume=args.resume, export=args.export)
    failed = sweep.run()
    with Store.open(sweep.store_path, readonly=True) as store:
        candidate = load_run(store, sweep.run_id)
    out_dir = options.out_dir / sweep.run_id / "report"
    status, _, _ = render(candidate, str(out_dir), baseline, args.threshold, args.alpha,
                          fail_on_inconclusive=args.fail_on_inconclusive)
    against = f" (against {baseline.store_path}::{baseline.run_id})" if baseline else ""
    verdict = "regressions found" if status else "no regression" if baseline else ""
    sweep.console.print(f"report: {out_dir}{against}" + (f": {verdict}" if verdict else ""))
    return 1 if failed or status else 0


def against(args: argparse.Namespace) -> int:
    from benches.against import Against
    from benches.options import ProcessOptions
    from rlperf.terminal import default_console

    return Against(ProcessOptions.from_args(args), args.against, default_console(),
                   until_decided=args.until_decided).run()
