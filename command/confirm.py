"""`rlperf confirm STORE`: measure the commits either side of each change point again, in one job, in pairs
(benches/confirm.py; docs/gate.md#confirming-a-change-point-rlperf-confirm).

Exit codes: 0 when every change point measured was confirmed (or there was none to measure), 1 when one was not
(or the machine refused a write), 2 for bad input.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benches.confirm import Confirm
from benches.options import ProcessOptions
from decisions.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from rlperf.arguments import (add_alpha, add_budget, add_diff, add_max_repeats, add_no_wait, add_threshold,
                              add_timeout)
from rlperf.errors import BadInput
from rlperf.processes import stop_signals_interrupt

TIMEOUT_S = 600.0  # seconds one trainer process may run


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("store", metavar="STORE", help="a results store whose history has change points")
    parser.add_argument("--out", default="runs", metavar="DIR", help="where the processes' logs go (default runs/)")
    add_max_repeats(parser, "at most N pairs per change point")
    add_budget(parser, "seconds each change point's pairs may take")
    add_diff(parser)
    add_timeout(parser, TIMEOUT_S)
    add_threshold(parser, "smallest relative change of SPS that counts", DEFAULT_THRESHOLD)
    add_alpha(parser, "the change points' level, and each confirmation's", DEFAULT_ALPHA)
    add_no_wait(parser)


def run(args: argparse.Namespace) -> int:
    from rlperf.terminal import default_console

    if not Path(args.store).is_file():
        raise BadInput(f"store: no store at {args.store}")
    with stop_signals_interrupt():
        return Confirm(ProcessOptions.from_args(args), Path(args.store), default_console()).run()
