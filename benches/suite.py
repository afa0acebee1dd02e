"""Suite files: TOML descriptions of a sweep, expanded into points and checked before anything runs.

A suite has fixed settings, axes whose cartesian product gives the points, optional `[[sweep]]` blocks
(each one's axes are crossed with the top-level axes, and the points of all blocks are pooled) and
`[[exclude]]` rules. Every point is checked with the trainer's own config rules, so a suite that would
fail half-way is refused up front with the file, the key and what is allowed.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, published as tomli
    import tomli as tomllib

from rlperf.arguments import MAX_SAMPLE_HZ, MAX_TIMEOUT_S
from rlperf.store import canonical_json, plain, point_label
from reference_trainer.config import FIELD_TYPES, PROFILER, ConfigError, coerce, fields_with, from_dict
from rlperf.errors import BadInput

SUITES_DIR = Path(__file__).parent / "suites"
# Points before exclusions: checking each costs tens of microseconds and measuring each minutes, so a suite
# whose axes multiply past this is a mistake to refuse at once, not a sweep to start (the largest shipped suite,
# the nightly, has 19).
MAX_POINTS = 10_000
# A traced run pays the profiler's overhead, so it is never a measurement: tracing belongs to `rlperf profile`.
SETTINGS = tuple(name for name in FIELD_TYPES if name not in fields_with(PROFILER))
TOP_LEVEL = {
    "description": "a sentence saying what the suite teaches",
    "repeats": "how many times each point runs, each in a fresh process (an integer, 1 or more)",
    "timeout_s": f"seconds one repeat may take before it is killed (a number above 0 and at most {MAX_TIMEOUT_S:g})",
    "sample_hz": f"utilization samples per second while a point runs (a number from 0, which turns sampling off, "
                 f"to {MAX_SAMPLE_HZ:g})",
    "profile": "true gives every point one extra traced run (`rlperf profile`), stored in traces, never used for SPS "
               "(a command's: its first steady epoch, traced through rlperf.phases)",
    "fixed": "a table of trainer settings shared by every point",
    "axes": "a table of setting = [values] swept as a cartesian product",
    "sweep": "blocks of axes, each crossed with the top-level axes",
    "exclude": "rules (setting = value or [values]) removing the points that match all of them",
    "command": "a trainer's command as a list of strings, `{name}` standing for a setting's value (a suite of "
               "commands: its settings are the command's own, `device` the one it uses)",
    "attach": "true (the default) attaches to the command (`rlperf attach`); false runs one that marks its own "
              "phases through rlperf.phases",
    "warmup_epochs": "epochs of each command run left out as warm-up (a whole number, default 1)",
    "against": "a table of settings (fixed or swept) and the value the reference side takes: each point is "
               "measured in pairs, as the suite sets it against as [against] does (a suite of commands)",
}
# keys a suite of commands alone may have
COMMAND_KEYS = ("command", "attach", "warmup_epochs", "against")
# what a command point's settings may be; `device` says where it computes (the GPUs it is watched on)
COMMAND_VALUE = "a string, a whole number, a number or true/false"
DEVICE_TEXT = "cpu, cuda or cuda:N"
DEFAULTS = {"description": "", "repeats": 3, "timeout_s": 600.0, "sample_hz": 5.0, "profile": False}
# What `nox -s bench` runs by default: the CPU smoke sizes (16-64 envs) ran slower on an H100 than on 2 CPU cores
# and taught nothing about the GPU, so a machine whose first device is a GPU gets sizes where a GPU means something.
SMOKE_SUITES = {"cpu": "smoke", "cuda": "gpu-smoke"}


@dataclass(frozen=True)
class Point:
    key: str  # canonical JSON of the swept values: the point's identity in the store
    axes: dict[str, Any]
    config: dict[str, Any]  # every TrainConfig field, resolved
    against: dict[str, Any] | None = None  # the reference side's config, in a suite with [against]

    @property
    def label(self) -> str:
        return point_label(self.axes)

    def config_for(self, side: str | None) -> dict[str, Any]:
        """The config one side of a pair runs: [against]'s for the reference ("ref") where the suite has it, the
        point's own otherwise (and for every side of a comparison of two commits)."""
        return self.against if side == "ref" and self.against is not None else self.config


@dataclass(frozen=True)
class Suite:
    name: str
    path: Path
    suite_hash: str
    description: str
    repeats: int
    timeout_s: float
    sample_hz: float
    profile: bool
    axis_names: tuple[str, ...]
    points: tuple[Point, ...]
    against: dict[str, Any] | None = None  # [against]'s settings: the reference side of its pairs

    @property
    def is_command_suite(self) -> bool:
        return "command" in self.points[0].config

    def refuse_against(self, command: str) -> None:
        """A suite whose points are pairs of two settings is measured by `rlperf bench` alone, at one commit:
        `command` measures one side of each point, or compares commits."""
        if self.against is not None:
            where = display_path(self.path)
            raise BadInput(f"{where}: against: the suite measures each point in pairs against its [against] "
                           f"settings, which `rlperf bench --suite {where}` does, not {command} (allowed: a suite "
                           "without [against])")


def available_suites() -> list[str]:
    return sorted(path.stem for path in SUITES_DIR.glob("*.toml"))


def smoke_suite(device: str) -> str:
    """The smoke suite for a machine whose `--device auto` resolves to `device` (cpu, cuda or cuda:N)."""
    return SMOKE_SUITES["cuda" if device.startswith("cuda") else "cpu"]


def machine_smoke_suite() -> str:
    """The smoke suite for this machine, as its torch sees it (`nox -s bench` asks this)."""
    from rlperf.machine import probe

    return smoke_suite(probe().resolve_device("auto"))


def resolve_path(name_or_path: str) -> Path:
    """A suite name from benches/suites/, or a path to a TOML file."""
    candidate = Path(name_or_path)
    if candidate.suffix == ".toml" or candidate.parent != Path("."):
        if candidate.is_file():
            return candidate
        raise BadInput(f"suite: {name_or_path} is not a file")
    named = SUITES_DIR / f"{name_or_path}.toml"
    if named.is_file():
        return named
    raise BadInput(f"suite: unknown suite {name_or_path!r} (allowed: {', '.join(available_suites())}, "
                   "or a path to a .toml file)")


def load(name_or_path: str, overrides: dict[str, Any] | None = None) -> Suite:
    """Reads, expands and checks a suite. `overrides` replace fixed settings (e.g. the device from the
    command line) and are part of the suite hash, so a resumed run never mixes two devices."""
    path = resolve_path(name_or_path)
    raw = path.read_bytes()
    where = display_path(path)
    try:
        document = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise BadInput(f"{where}: not valid TOML ({exc})") from None
    suite = SuiteReader(where, document).read(path, raw, overrides or {})
    if suite.is_command_suite:
        measure_repository_of(path)
    return suite


def measure_repository_of(path: Path) -> None:
    """A suite of commands measures the commits of the git repository it lives in (the user's), from its root:
    the gate, bisect, --against and confirm check those out, and the runs' fingerprints name them. A suite outside
    any repository measures the working tree only."""
    import os
    import subprocess

    from rlperf.machine import REPOSITORY_VARIABLE

    try:
        root = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=path.resolve().parent, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return
    os.environ[REPOSITORY_VARIABLE] = root


def display_path(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


class SuiteReader:
    """Checks one parsed suite document; every error names the file and the key."""

    def __init__(self, where: str, document: dict[str, Any]):
        self.where = where
        self.document = document

    def fail(self, key: str, what: str) -> BadInput:
        return BadInput(f"{self.where}: {key}: {what}")

    def read(self, path: Path, raw: bytes, overrides: dict[str, Any]) -> Suite:
        for key in self.document:
            if key not in TOP_LEVEL:
                raise self.fail(key, f"unknown key (allowed: {', '.join(TOP_LEVEL)})")
        options = {**DEFAULTS, **{k: self.document[k] for k in DEFAULTS if k in self.document}}
        self.check_options(options)
        self.command = self.command_options() if "command" in self.document else None
        for key in COMMAND_KEYS:
            if key in self.document and self.command is None:
                raise self.fail(key, "belongs to a suite of commands: set `command` too")

        fixed = self.settings_table("fixed", self.document.get("fixed", {}))
        top_axes = self.axes_table("axes", self.document.get("axes", {}))
        sweeps = self.document.get("sweep", [{}])
        if not isinstance(sweeps, list) or not sweeps:
            raise self.fail("sweep", "must be one or more [[sweep]] blocks")
        blocks = []
        for index, block in enumerate(sweeps):
            axes = self.axes_table(f"sweep[{index}]", block)
            for name in axes:
                if name in top_axes:
                    raise self.fail(f"sweep[{index}].{name}", "is already a top-level axis; sweep it in one place")
            blocks.append({**top_axes, **axes})
        axis_names = tuple(dict.fromkeys(name for block in blocks for name in block))
        for name in axis_names:
            if name in fixed:
                raise self.fail(f"fixed.{name}", "is also swept as an axis; set it in one place")
        for name, value in overrides.items():
            if name in axis_names:
                raise self.fail(name, f"is swept as an axis here, so it cannot be overridden (to {value!r})")
        fixed.update(overrides)
        self.against = self.against_table(fixed, axis_names) if self.command is not None else None
        excludes = self.exclude_rules(axis_names)
        products = [math.prod(len(values) for values in block.values()) for block in blocks]
        if sum(products) > MAX_POINTS:
            by_block = f", {' + '.join(f'{n:,}' for n in products)} by [[sweep]] block" if len(products) > 1 else ""
            raise self.fail("axes", f"cross into {sum(products):,} points{by_block} (allowed: at most {MAX_POINTS:,})")

        points: dict[str, Point] = {}
        for block in blocks:
            for values in itertools.product(*block.values()):
                axes = dict(zip(block, values))
                point = self.make_point(fixed, axes)
                if not any(matches(rule, point.config) for rule in excludes):
                    points.setdefault(point.key, point)
        if not points:
            raise self.fail("exclude", "removes every point of the suite")

        digest = hashlib.sha256(raw)
        if overrides:
            digest.update(json.dumps(overrides, sort_keys=True).encode())
        return Suite(name=path.stem, path=path, suite_hash=digest.hexdigest()[:16],
                     description=str(options["description"]), repeats=options["repeats"],
                     timeout_s=float(options["timeout_s"]), sample_hz=float(options["sample_hz"]),
                     profile=options["profile"], axis_names=axis_names, points=tuple(points.values()),
                     against=self.against)

    def check_options(self, options: dict[str, Any]) -> None:
        def is_number(value: Any) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool)

        checks = {
            "description": isinstance(options["description"], str),
            "repeats": isinstance(options["repeats"], int) and not isinstance(options["repeats"], bool)
            and options["repeats"] >= 1,
            "timeout_s": is_number(options["timeout_s"]) and 0 < options["timeout_s"] <= MAX_TIMEOUT_S,
            "sample_hz": is_number(options["sample_hz"]) and 0 <= options["sample_hz"] <= MAX_SAMPLE_HZ,
            "profile": isinstance(options["profile"], bool),
        }
        for key, ok in checks.items():
            if not ok:
                raise self.fail(key, f"must be {TOP_LEVEL[key]} (got {options[key]!r})")

    def command_options(self) -> dict[str, Any]:
        command = self.document["command"]
        if not isinstance(command, list) or not command or not all(isinstance(part, str) for part in command):
            raise self.fail("command", f"must be {TOP_LEVEL['command']} (got {command!r})")
        attach = self.document.get("attach", True)
        if not isinstance(attach, bool):
            raise self.fail("attach", f"must be {TOP_LEVEL['attach']} (got {attach!r})")
        warmup = self.document.get("warmup_epochs", 1)
        if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 0:
            raise self.fail("warmup_epochs", f"must be {TOP_LEVEL['warmup_epochs']} (got {warmup!r})")
        return {"command": command, "attach": attach, "warmup_epochs": warmup}

    def against_table(self, fixed: dict[str, Any], axis_names: tuple[str, ...]) -> dict[str, Any] | None:
        """[against]: settings of the suite, fixed or swept, and the value the reference side of every point takes
        (None without the table)."""
        table = self.document.get("against")
        if table is None:
            return None
        if not isinstance(table, dict) or not table:
            raise self.fail("against", f"must be {TOP_LEVEL['against']}")
        for name, value in table.items():
            key = f"against.{name}"
            if name == "device":
                raise self.fail(key, "both sides of a pair compute on one device (allowed: a setting other than "
                                     "device)")
            if name not in fixed and name not in axis_names:
                settings = [setting for setting in (*fixed, *axis_names) if setting != "device"]
                raise self.fail(key, f"names no setting of the suite (allowed: {', '.join(settings) or 'none'})")
            self.check_command_setting(key, name, value)
        return dict(table)

    def check_setting(self, key: str, name: str, value: Any) -> Any:
        if self.command is not None:
            return self.check_command_setting(key, name, value)
        if name not in SETTINGS:
            hint = " (tracing belongs to `rlperf profile`)" if name in fields_with(PROFILER) else ""
            raise self.fail(key, f"unknown setting{hint} (allowed: {', '.join(SETTINGS)})")
        try:
            return coerce(name, value)
        except ConfigError as exc:
            raise self.fail(key, config_error_text(exc, name)) from None

    def check_command_setting(self, key: str, name: str, value: Any) -> Any:
        """A setting of a command point: any name a placeholder can use, a scalar value; `device` a device."""
        if not name.isidentifier():
            raise self.fail(key, "a setting's name must be a Python identifier, as `{name}` in the command uses it")
        if value is None and name not in COMMAND_KEYS:
            return None  # an axis's name, checked before its values
        if name in (*COMMAND_KEYS, "world_size"):
            raise self.fail(key, "is the suite's own key, not a setting of its points")
        if not isinstance(value, (str, int, float, bool)):
            raise self.fail(key, f"must be {COMMAND_VALUE} (got {value!r})")
        if name == "device" and not (value == "cpu" or re.fullmatch(r"cuda(:\d+)?", str(value))):
            raise self.fail(key, f"must be a device: {DEVICE_TEXT} (got {value!r})")
        return value

    def settings_table(self, key: str, table: Any) -> dict[str, Any]:
        if not isinstance(table, dict):
            raise self.fail(key, f"must be {TOP_LEVEL[key]}")
        return {name: self.check_setting(f"{key}.{name}", name, value) for name, value in table.items()}

    def axes_table(self, key: str, table: Any) -> dict[str, list[Any]]:
        if not isinstance(table, dict):
            raise self.fail(key, "must be a table of setting = [values]")
        axes = {}
        for name, values in table.items():
            if name not in SETTINGS:
                self.check_setting(f"{key}.{name}", name, None)
            if not isinstance(values, list) or not values:
                raise self.fail(f"{key}.{name}", f"must be a non-empty list of values (got {values!r})")
            axes[name] = [self.check_setting(f"{key}.{name}[{i}]", name, value) for i, value in enumerate(values)]
            for i, value in enumerate(axes[name]):
                if value in axes[name][:i]:
                    # A repeated value would silently collapse into one point.
                    raise self.fail(f"{key}.{name}[{i}]", f"repeats the value {plain(value)}; list each value "
                                                          "once")
        return axes

    def exclude_rules(self, axis_names: tuple[str, ...]) -> list[dict[str, list[Any]]]:
        rules = self.document.get("exclude", [])
        if not isinstance(rules, list):
            raise self.fail("exclude", "must be [[exclude]] blocks of setting = value or [values]")
        checked = []
        for index, rule in enumerate(rules):
            if not isinstance(rule, dict) or not rule:
                raise self.fail(f"exclude[{index}]", "must be a non-empty table of setting = value or [values]")
            checked_rule = {}
            for name, values in rule.items():
                key = f"exclude[{index}].{name}"
                if name not in axis_names:
                    raise self.fail(key, f"is not an axis of this suite (axes: {', '.join(axis_names) or 'none'})")
                values = values if isinstance(values, list) else [values]
                checked_rule[name] = [self.check_setting(key, name, value) for value in values]
            checked.append(checked_rule)
        return checked

    def make_point(self, fixed: dict[str, Any], axes: dict[str, Any]) -> Point:
        if self.command is not None:
            # the reference side: [against]'s values in place of the suite's, fixed or swept
            against = self.command_point(fixed, {**axes, **self.against}) if self.against else None
            return Point(key=canonical_json(axes), axes=axes, config=self.command_point(fixed, axes), against=against)
        try:
            config = from_dict({**fixed, **axes}).to_dict()
        except ConfigError as exc:
            raise self.fail(f"point [{point_label(axes)}]", str(exc)) from None
        return Point(key=canonical_json(axes), axes=axes, config=config)

    def command_point(self, fixed: dict[str, Any], axes: dict[str, Any]) -> dict[str, Any]:
        """A command point's config: its settings, the command with them substituted, how it is run, its device."""
        settings = {"device": "cpu", **fixed, **axes}
        command = []
        for index, part in enumerate(self.command["command"]):
            try:
                command.append(part.format_map({name: plain(value) for name, value in settings.items()}))
            except KeyError as missing:
                raise self.fail(f"command[{index}]", f"{{{missing.args[0]}}} names no setting of the suite "
                                                     f"(settings: {', '.join(settings)})") from None
            except (ValueError, IndexError) as exc:
                raise self.fail(f"command[{index}]", f"is not a command part with {{name}} placeholders ({exc})") \
                    from None
        # both sides of an [against] pair carry its settings: they name what the sides differ by (decisions/verdicts.py
        # matches the two sides' points across it)
        against = {"against": self.against} if self.against else {}
        return {**settings, **self.command, "command": command, "world_size": 1, **against}


def matches(rule: dict[str, list[Any]], config: dict[str, Any]) -> bool:
    return all(config[name] in values for name, values in rule.items())


def config_error_text(exc: ConfigError, setting: str) -> str:
    """The config's message without its field name when the key in front of it already says it."""
    prefix = f"{exc.field_name}: "
    text = str(exc)
    return text[len(prefix):] if exc.field_name == setting and text.startswith(prefix) else text
