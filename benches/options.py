"""What a command that runs trainer processes is told by its flags, in one record built once from the parsed
arguments: which suite, where its processes run and for how long, what is sampled around them, and how their
verdicts are judged. Each command's flags of its own (a sweep's --resume, the gate's --baseline) are arguments
of that command, not fields here."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from benches import suite as suites
from decisions.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from rlperf.arguments import DEFAULT_BUDGET_S, DEFAULT_MAX_REPEATS
from rlperf.forkserver import LAUNCHES
from rlperf.layout import DEFAULT_OUT
from rlperf.machine import Machine

# The record's fields whose flags are named otherwise (field: the flag's `dest`); every other field is its flag's.
FLAG_NAMES = {"out_dir": "out", "timeout_s": "timeout"}


@dataclass(frozen=True)
class ProcessOptions:
    suite: str | None = None  # a suite name or file; None for a command that reads its points from a store
    out_dir: Path = Path(DEFAULT_OUT)
    repeats: int | None = None  # processes per point (pairs, in a comparison); None: the suite's
    device: str | None = None  # None: the suite's
    timeout_s: float | None = None  # seconds one trainer process may run; None: the suite's
    sample_hz: float | None = None  # None: the suite's
    label: str | None = None  # a note stored with the runs
    max_repeats: int = DEFAULT_MAX_REPEATS  # pairs at most, where pairs are added until decided
    budget_s: float = DEFAULT_BUDGET_S  # seconds those pairs may take
    threshold: float | None = DEFAULT_THRESHOLD  # None: the command's own rule (bisect's, from BAD's slowdown)
    alpha: float = DEFAULT_ALPHA
    wait: bool = True  # for another measurement on this machine; False refuses instead
    launch: str = LAUNCHES[0]  # how a trainer process starts (benches/runner.py Launcher)
    fail_on_inconclusive: bool = False
    diff: bool = False  # run the traced diff of a commit and phase named, as the last lines give it

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ProcessOptions":
        """The record of a command's parsed flags; a field whose flag the command does not take keeps its
        default."""
        given: dict[str, Any] = {}
        for field in fields(cls):
            flag = FLAG_NAMES.get(field.name, field.name)
            if hasattr(args, flag):
                given[field.name] = getattr(args, flag)
        if "out_dir" in given:
            given["out_dir"] = Path(given["out_dir"])
        return cls(**given)

    def suite_on(self, machine: Machine) -> tuple[suites.Suite, dict[str, Any]]:
        """The suite with --device resolved on `machine`, and the overrides that made it (none without
        --device)."""
        overrides = {"device": machine.resolve_device(self.device)} if self.device else {}
        return suites.load(self.suite, overrides), overrides

    def launch_for(self, suite: suites.Suite) -> str:
        """How the suite's processes start: a suite of commands starts each fresh, under `rlperf attach`, so no
        server is warmed for it, not even to probe the machine."""
        return "fresh" if suite.is_command_suite else self.launch

    def timeout_for(self, suite: suites.Suite) -> float:
        return self.timeout_s or suite.timeout_s

    def sample_hz_for(self, suite: suites.Suite) -> float:
        return suite.sample_hz if self.sample_hz is None else self.sample_hz
