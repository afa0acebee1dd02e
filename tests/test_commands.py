"""The commands' shared flags: one definition of each, so one value is allowed or refused alike by every command,
and one record of a measuring command's options, built from whatever flags the command takes."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

from benches.options import ProcessOptions
from rlperf.arguments import alpha_level, threshold_fraction, timeout_seconds
from command.cli import SUBCOMMANDS, OneLineParser

# each command's required arguments, so that its parser accepts a line
REQUIRED = {"bench": [], "gate": ["--suite", "smoke", "--baseline", "HEAD"],
            "bisect": ["GOOD", "BAD", "--suite", "smoke"], "confirm": ["results.sqlite"], "report": []}


def parser_of(command: str) -> argparse.ArgumentParser:
    parser = OneLineParser(prog=f"rlperf {command}")
    importlib.import_module(SUBCOMMANDS[command][0]).configure(parser)
    return parser


@pytest.mark.parametrize("command", sorted(REQUIRED))
def test_threshold_and_alpha_are_one_definition_refused_alike_everywhere(command, capsys):
    parser = parser_of(command)
    actions = {action.dest: action for action in parser._actions}
    assert actions["threshold"].type is threshold_fraction and actions["alpha"].type is alpha_level
    for flag, value, allowed in (("--threshold", "2", "above 0 and at most 1"),
                                 ("--alpha", "0.6", "above 0 and at most 0.5")):
        with pytest.raises(SystemExit) as refused:
            parser.parse_args([*REQUIRED[command], flag, value])
        assert refused.value.code == 2
        assert capsys.readouterr().err == (f"rlperf {command}: error: argument {flag}: must be a number {allowed} "
                                           f"(got {value!r})\n")
    for seconds in ("budget_s", "night_s"):
        if seconds in actions:
            assert actions[seconds].type is timeout_seconds and actions["timeout"].type is timeout_seconds


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e999"])
def test_no_number_flag_takes_an_infinite_or_undefined_value(text, capsys):
    # NaN compares false with every bound, and an infinite timeout or rate reaches time.sleep and int()
    for command, flag in (("collectives", "--rank-timeout"), ("bench", "--timeout"), ("gate", "--night-s"),
                          ("profile", "--sample-hz"), ("selfcheck", "--delay-ms")):
        with pytest.raises(SystemExit) as refused:
            parser_of(command).parse_args([*REQUIRED.get(command, []), f"{flag}={text}"])
        assert refused.value.code == 2
        said = capsys.readouterr().err
        assert said.startswith(f"rlperf {command}: error: argument {flag}: must be a number ") and said.count("\n") == 1


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_commands_help_renders(command):
    # argparse expands % in help texts: a bare percent sign breaks --help
    assert "usage: rlperf" in parser_of(command).format_help()


def test_an_alpha_of_one_percent_names_99_percent_intervals():
    help_text = " ".join(parser_of("report").format_help().split())
    assert "(default 0.01, 99% intervals)" in help_text


def test_the_options_record_is_built_from_each_commands_flags_and_defaults():
    gate = ProcessOptions.from_args(parser_of("gate").parse_args(
        [*REQUIRED["gate"], "--timeout", "30", "--threshold", "0.1", "--no-wait", "--out", "night"]))
    assert gate == ProcessOptions(suite="smoke", out_dir=Path("night"), timeout_s=30.0, threshold=0.1, wait=False)
    confirm = ProcessOptions.from_args(parser_of("confirm").parse_args(REQUIRED["confirm"]))
    assert confirm.suite is None and confirm.timeout_s == 600.0 and confirm.out_dir == Path("runs")
    bisect = ProcessOptions.from_args(parser_of("bisect").parse_args(REQUIRED["bisect"]))
    assert bisect.threshold is None  # bisect's own rule: from BAD's slowdown
    bench = ProcessOptions.from_args(parser_of("bench").parse_args(["--repeats", "2", "--fail-on-inconclusive"]))
    assert bench.repeats == 2 and bench.fail_on_inconclusive and bench.suite == "smoke"
    assert bench.launch == "forked" and gate.launch == "forked" and confirm.launch == "forked"


@pytest.mark.parametrize("command", ["bench", "gate", "bisect"])
def test_every_command_that_runs_a_suites_processes_starts_them_as_launch_says(command, capsys):
    fresh = parser_of(command).parse_args([*REQUIRED[command], "--launch", "fresh"])
    assert ProcessOptions.from_args(fresh).launch == "fresh"
    with pytest.raises(SystemExit) as refused:
        parser_of(command).parse_args([*REQUIRED[command], "--launch", "spawned"])
    assert refused.value.code == 2
    said = capsys.readouterr().err  # argparse's quoting of the choices differs between Python releases
    assert said.startswith(f"rlperf {command}: error: argument --launch: invalid choice: 'spawned' (choose from ")
    assert "forked" in said and "fresh" in said and said.count("\n") == 1
