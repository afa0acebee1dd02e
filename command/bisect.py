"""`rlperf bisect GOOD BAD --suite SUITE [--point KEY]`: the first commit between GOOD and BAD at which one
point of a suite runs slower than at GOOD (the search is benches/bisect.py's)."""

from __future__ import annotations

import argparse
from pathlib import Path

from benches.bisect import Bisect
from benches.options import ProcessOptions
from decisions.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from rlperf.arguments import add_alpha, add_budget, add_diff, add_max_repeats, add_process_options, add_threshold
from rlperf.layout import DEFAULT_OUT, STORE_FILE
from rlperf.processes import stop_signals_interrupt


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("good", metavar="GOOD", help="a commit (any git ref) at which the point was fast")
    parser.add_argument("bad", metavar="BAD", help="a later commit, descended from GOOD, at which it is slower")
    parser.add_argument("--suite", required=True,
                        help="a suite in benches/suites or a path to a .toml file; one of its points is measured")
    parser.add_argument("--point", metavar="KEY",
                        help="the point to measure: its key as stored (the JSON of its swept values, e.g. "
                             "'{\"num_envs\":64}') or its label as the bench prints it (default: the suite's only "
                             "point)")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"where the store ({STORE_FILE}) and the logs go (default {DEFAULT_OUT}/)")
    add_process_options(parser, "the point")
    add_max_repeats(parser, "at most N pairs of processes per commit; a commit still undecided then is skipped")
    add_budget(parser, "seconds each commit's measurement may take before it is skipped")
    add_diff(parser)
    add_threshold(parser, "smallest relative change of SPS that counts", None,
                  default_text=f"{DEFAULT_THRESHOLD} for BAD, then halfway, as a ratio, from GOOD to BAD's slowdown")
    add_alpha(parser, "one minus the confidence of each commit's verdict", DEFAULT_ALPHA)
    parser.add_argument("--json", type=Path, metavar="PATH",
                        help="also write the whole search (every step's commit, verdict, change, interval, pairs "
                             "and seconds) to this file (default: none)")


def run(args: argparse.Namespace) -> int:
    from rlperf.terminal import default_console

    bisect = Bisect(ProcessOptions.from_args(args), args.good, args.bad, default_console(), point=args.point,
                    json_path=args.json)
    with stop_signals_interrupt():
        return bisect.run()
