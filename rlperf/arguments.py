"""argparse types and limits, and the flags several commands take, each defined once: one bad value reads the
same everywhere, and one flag means one range everywhere."""

from __future__ import annotations

import argparse
import math
import re
import unicodedata
from collections.abc import Callable

from rlperf.forkserver import LAUNCHES

# A repeat longer than a day is a hung process, not a measurement; a sampler above 100 Hz measures itself
# (each NVML PCIe reading blocks 20 ms) and floods the store.
MAX_TIMEOUT_S = 86400.0
MAX_SAMPLE_HZ = 100.0
# --until-decided and bisect: at most this many pairs of processes per point, within this many seconds each.
# On two cores a small point's processes' SPS vary by about 12% and a pair takes about 14 s: 600 s reaches the
# design's last looks for such a point.
DEFAULT_MAX_REPEATS = 40
DEFAULT_BUDGET_S = 600.0


def positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of 1 or more (got {text!r})")
    return int(text)


def non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number of 0 or more (got {text!r})")
    return int(text)


def number_in(low: float, high: float, low_included: bool) -> Callable[[str], float]:
    """An argparse type for a finite number in [low, high] (or (low, high]); one message for every value
    outside."""
    allowed = f"{'from' if low_included else 'above'} {low:g}"
    if math.isfinite(high):
        allowed += f" {'to' if low_included else 'and at most'} {high:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and low <= value <= high) or (value == low and not low_included):
            raise argparse.ArgumentTypeError(f"must be a number {allowed} (got {text!r})")
        return value

    return parse


positive_float = number_in(0, math.inf, low_included=False)


def device_choice(text: str) -> str:
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"must be auto, cpu, cuda or cuda:N (got {text!r})")
    return text


def label_text(text: str) -> str:
    """A note stored with a run and printed in tables and reports: UTF-8 text on one line."""
    # Bytes that are not UTF-8 reach argv as surrogate escapes, which SQLite cannot store.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"must be UTF-8 text (got {text.encode('utf-8', 'surrogateescape')!r})") \
            from None
    # A newline splits a table's row and a report's line; an escape sequence would drive the reader's terminal.
    if any(unicodedata.category(char) == "Cc" for char in text):
        raise argparse.ArgumentTypeError(f"must be one line of text without control characters (got {text!r})")
    return text


# ---- the flags several commands take, each defined once -----------------------------------------------------
# What a flag means differs by command (the gate's alpha is the night's, a report's each interval's), so each
# command says it in `meaning`; the flag's type, limits and the rest of its help are the same everywhere.

timeout_seconds = number_in(0, MAX_TIMEOUT_S, low_included=False)
threshold_fraction = number_in(0, 1, low_included=False)
alpha_level = number_in(0, 0.5, low_included=False)


def add_threshold(parser: argparse.ArgumentParser, meaning: str, default: float | None,
                  default_text: str | None = None) -> None:
    parser.add_argument("--threshold", type=threshold_fraction, default=default,
                        help=f"{meaning}, as a fraction above 0 and at most 1 "
                             f"(default {default_text or format(default, 'g')})")


def add_alpha(parser: argparse.ArgumentParser, meaning: str, default: float, intervals: bool = False) -> None:
    """`intervals`: alpha is one minus the confidence of an interval, whose level the default's help names."""
    confidence = f", {100 * (1 - default):.0f}%% intervals" if intervals else ""
    parser.add_argument("--alpha", type=alpha_level, default=default,
                        help=f"{meaning}, above 0 and at most 0.5 (default {default:g}{confidence})")


def add_max_repeats(parser: argparse.ArgumentParser, meaning: str, default: int = DEFAULT_MAX_REPEATS) -> None:
    parser.add_argument("--max-repeats", type=positive_int, default=default, metavar="N",
                        help=f"{meaning} (default {default})")


def add_budget(parser: argparse.ArgumentParser, meaning: str, default: float = DEFAULT_BUDGET_S) -> None:
    parser.add_argument("--budget-s", type=timeout_seconds, default=default, metavar="S",
                        help=f"{meaning}, above 0 and at most {MAX_TIMEOUT_S:g} (default {default:g})")


def add_timeout(parser: argparse.ArgumentParser, default: float | None = None) -> None:
    """`default` None: the suite's."""
    default_text = "the suite's `timeout_s`" if default is None else format(default, "g")
    parser.add_argument("--timeout", type=timeout_seconds, default=default, metavar="S",
                        help=f"seconds one trainer process may run before it is killed, above 0 and at most "
                             f"{MAX_TIMEOUT_S:g} (default {default_text})")


def add_no_wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-wait", dest="wait", action="store_false",
                        help="when another rlperf bench is measuring on this machine, exit 1 at once instead of "
                             "waiting for it (default: wait)")


def add_diff(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--diff", action="store_true",
                        help="where a commit and a phase are named, run the `rlperf profile --against` command the "
                             "last lines give, which says which operator (default: only print it)")


def add_label(parser: argparse.ArgumentParser, default_text: str) -> None:
    parser.add_argument("--label", type=label_text,
                        help=f"a note stored with the runs, e.g. the change being measured (default: {default_text})")


def add_process_options(parser: argparse.ArgumentParser, scope: str) -> None:
    """--device, --timeout, --sample-hz, --no-wait and --launch, as every command that runs a suite's trainer
    processes takes them; `scope` names what --device moves ("every point", "the point")."""
    parser.add_argument("--device", type=device_choice,
                        help=f"run {scope} on this device instead of the suite's: cpu, cuda, cuda:N, or auto "
                             "(the first GPU when there is one) (default: the suite's)")
    add_timeout(parser)
    parser.add_argument("--sample-hz", type=number_in(0, MAX_SAMPLE_HZ, low_included=True), metavar="HZ",
                        help=f"utilization samples per second around each process, 0 for none, at most "
                             f"{MAX_SAMPLE_HZ:g} (default: the suite's `sample_hz`)")
    add_no_wait(parser)
    parser.add_argument("--launch", choices=LAUNCHES, default=LAUNCHES[0],
                        help="how each trainer process starts: forked from an interpreter that has imported torch "
                             "(saves each process the imports), or fresh (default forked)")
