"""`rlperf compare A B`: two machines side by side (the work is in reports/comparison.py, imported only when
the command runs)."""

from __future__ import annotations

import argparse
import math

from rlperf.errors import BadInput

SIDES = ("A", "B")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help="results of the first machine: PATH or PATH::RUN_ID")
    parser.add_argument("b", metavar="B", help="results of the second machine: PATH or PATH::RUN_ID")
    parser.add_argument("--label", action="append", default=[], metavar="SIDE=NAME",
                        help="a name for a side, e.g. --label A=rtx4090 --label B=h100x4 (default: A and B)")
    parser.add_argument("--price", action="append", default=[], metavar="SIDE=PER_HOUR",
                        help="the machine's price per hour, e.g. --price A=0.35; adds steps per dollar "
                             "(default: none)")
    parser.add_argument("--out", default="compare", metavar="DIR",
                        help="where report.md and report.html go (default: ./compare)")


def parse_sides(entries: list[str], field: str) -> dict[str, str]:
    values = {}
    for entry in entries:
        side, sep, value = entry.partition("=")
        if side not in SIDES or not sep or not value.strip():
            raise BadInput(f"{field}: expected A=VALUE or B=VALUE (got {entry!r})")
        if side in values:
            raise BadInput(f"{field}: {side} is given twice ({side}={values[side]} and {entry}); give each side once")
        values[side] = value
    return values


def parse_prices(entries: list[str]) -> dict[str, float]:
    prices = {}
    for side, text in parse_sides(entries, "price").items():
        try:
            price = float(text)
        except ValueError:
            price = math.nan
        if not math.isfinite(price) or price <= 0:
            raise BadInput(f"price: {side}'s hourly price must be a number above 0 (got {text!r})")
        prices[side] = price
    return prices


def run(args: argparse.Namespace) -> int:
    from reports.comparison import build, summary
    from reports.formatting import print_table
    from reports.page import write_report
    from decisions.rundata import load
    from rlperf.terminal import default_console

    labels = {"A": "A", "B": "B", **parse_sides(args.label, "label")}
    prices = parse_prices(args.price)
    runs = {"A": load(args.a, "A"), "B": load(args.b, "B")}
    paths = write_report(build(runs, labels, prices), args.out)
    console = default_console()
    table = summary(runs, labels)
    if table.empty:
        console.print("no configuration was measured successfully on both machines", markup=False)
    else:
        print_table(console, table, f"median steady SPS, {labels['A']} vs {labels['B']}")
    console.print(f"comparison: {paths[0]} and {paths[1]}", markup=False)
    return 0
