"""`rlperf runs STORE`: the runs a store holds, one line each; `--latest SUITE` prints only the newest run id
of a suite, for scripts (the nightly workflow finds tonight's run with it)."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path

from rlperf.errors import BadInput

COLUMNS = ("run_id", "suite", "status", "started_at", "git_commit", "label")


def moment(text: str) -> datetime:
    """An ISO 8601 time; one without an offset is UTC, as the store writes times."""
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an ISO 8601 time, e.g. 2026-11-22 or 2026-11-22T02:17:00+00:00 "
                                         f"(got {text!r})") from None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("store", metavar="STORE", type=Path, help="a results store (e.g. runs/results.sqlite)")
    parser.add_argument("--latest", metavar="SUITE",
                        help="print only the id of SUITE's newest run (default: list every run)")
    parser.add_argument("--since", metavar="TIME", type=moment,
                        help="with --latest: only a run started at or after TIME, an ISO 8601 time (UTC unless it "
                             "says otherwise), e.g. 2026-11-22T02:17:00+00:00 (default: any time)")


def run(args: argparse.Namespace) -> int:
    from rlperf.store import Store
    from rlperf.terminal import default_console

    if args.since and not args.latest:
        raise BadInput("since: needs --latest SUITE")
    if not args.store.is_file():
        raise BadInput(f"store: no store at {args.store}")
    with Store.open(args.store, readonly=True) as store:
        runs = store.runs()
    if args.latest:
        mine = runs[runs["suite"] == args.latest]
        if args.since:
            mine = mine[[datetime.fromisoformat(started) >= args.since for started in mine["started_at"]]]
        if mine.empty:
            since = f" started at or after {args.since.isoformat()}" if args.since else ""
            raise BadInput(f"latest: no run of suite {args.latest!r}{since} in {args.store}")
        print(mine.iloc[-1]["run_id"])
        return 0
    from reports.formatting import print_table

    table = runs[list(COLUMNS)].copy()
    table["git_commit"] = table["git_commit"].fillna("").str[:10]
    table["label"] = table["label"].fillna("")
    print_table(default_console(), table, f"{len(table)} runs in {args.store}")
    return 0
