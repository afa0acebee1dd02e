"""`rlperf gate --suite SUITE --baseline REF`: did any point of the suite get slower than at commit REF? Both are
measured tonight in pairs of processes (benches/gate.py; docs/gate.md#rlperf-gate).

Exit codes: 0 when no point regressed and every point was measured, 1 when a point regressed (or the machine
refused a write), 3 when a point could not be measured or decided, 2 for bad input or a night that cannot keep its
promise (docs/gate.md#the-nights-promise); the last line says why.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benches.gate import Gate
from benches.night import LEAD_SHARE, MAX_SUSPECTS, NIGHT_S, REFINE_PAIRS, REFINE_POINTS, SCREEN_PAIRS
from benches.options import ProcessOptions
from decisions.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from rlperf.arguments import (MAX_TIMEOUT_S, add_alpha, add_diff, add_label, add_max_repeats, add_process_options,
                              add_threshold, non_negative_int, positive_int, timeout_seconds)
from rlperf.layout import DEFAULT_OUT, STORE_FILE
from rlperf.processes import stop_signals_interrupt


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (f"{parser.description}. Exit code 0 when no point regressed, 1 when one did, 3 when a "
                          f"point could not be measured, 2 for bad input or a night that cannot keep what it promises.")
    parser.add_argument("--suite", required=True, help="a suite in benches/suites or a path to a .toml file")
    parser.add_argument("--baseline", required=True, metavar="REF",
                        help="the commit (any git ref) the working tree is judged against, measured tonight in a "
                             "temporary worktree")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                        help=f"where the store ({STORE_FILE}), logs and the report go (default {DEFAULT_OUT}/)")
    add_process_options(parser, "every point")
    parser.add_argument("--night-s", type=timeout_seconds, default=NIGHT_S, metavar="S",
                        help=f"seconds of the whole night, screen to confirmation: the confirmation of the suspects "
                             f"gets what the screen and refinement leave, above 0 and at most {MAX_TIMEOUT_S:g} "
                             f"(default {NIGHT_S:g})")
    parser.add_argument("--accept-weaker", action="store_true",
                        help="run a night that cannot keep its promise (every point flagged 95%% of the time when "
                             "twice the threshold slower, --max-suspects confirmed) rather than refuse it: every "
                             "suspect beyond those confirmed is then undecided (exit 3), and the last line states "
                             "what the night detects per cut point (default: refuse such a night, exit 2)")
    parser.add_argument("--screen-pairs", type=positive_int, default=SCREEN_PAIRS, metavar="N",
                        help=f"pairs of processes a point gets in the screen on average, at least 2: shared out by "
                             f"each point's pair spread in the store's earlier screens on this machine, every point "
                             f"the same until they tell the points apart (default {SCREEN_PAIRS})")
    parser.add_argument("--refine-points", type=non_negative_int, default=REFINE_POINTS, metavar="N",
                        help=f"the points with the strongest screen that get {REFINE_PAIRS} more pairs before the "
                             f"suspects are chosen; 0 chooses from the screen alone (default {REFINE_POINTS})")
    parser.add_argument("--max-suspects", type=positive_int, default=MAX_SUSPECTS, metavar="N",
                        help=f"the suspects confirmed, the strongest evidence first: the first at {LEAD_SHARE:.0%}% of "
                             f"alpha, the others splitting the rest, a claim passing its level on (default "
                             f"{MAX_SUSPECTS})")
    add_max_repeats(parser, "at most N pairs in one suspect's confirmation")
    add_threshold(parser, "the smallest slowdown of SPS that counts: the screen weighs each point's pairs for a "
                          "slowdown of twice this against none, and a confirmation stops a point shown not slower "
                          "by this", DEFAULT_THRESHOLD)
    add_alpha(parser, "the chance of flagging any point on a night where nothing got slower", DEFAULT_ALPHA)
    add_label(parser, "gate")
    add_diff(parser)
    parser.add_argument("--summary", type=Path, metavar="PATH",
                        help="also write the outcome as JSON: the runs, each point's verdict, the conclusion and the "
                             "exit code (default: none)")


def run(args: argparse.Namespace) -> int:
    from rlperf.terminal import default_console

    gate = Gate(ProcessOptions.from_args(args), args.baseline, default_console(), screen_pairs=args.screen_pairs,
                max_suspects=args.max_suspects, summary=args.summary, refine_points=args.refine_points,
                night_s=args.night_s, accept_weaker=args.accept_weaker)
    with stop_signals_interrupt():
        return gate.run()
