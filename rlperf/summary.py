"""The run summary every trainer writes and every reader reads: one typed record (docs/results-format.md).

Schema 2 is shared by the reference trainer, the phase API a user's loop calls (`rlperf.phases`) and
`rlperf attach`: a few fields every trainer knows (steps, seconds, phases, epochs), and what only the reference
trainer knows (its config's fields, `work`, `h2d_bytes_per_step`, `parameters`, `env_overlap`, ...) optional.
`RunSummary.read` reads schema 1 and 2 as stored, leaving absent fields empty; `RunSummary.check` is what a
harness asks of a summary a process has just written.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from rlperf.errors import BadInput
from rlperf.memory import memory_problem

SCHEMA = 2
READABLE_SCHEMAS = (1, 2)
# Who wrote a summary: the reference trainer, a user's loop through rlperf.phases, or `rlperf attach`.
WRITERS = ("reference", "phases", "attach")
# The reference trainer's phases, in the order of an epoch; an outside trainer uses these names where they mean
# the same, so reports, "Which side waits" and the history read its runs unchanged.
PHASES = ("env", "eval_copy", "eval_forward", "eval_misc", "train_misc", "train_forward", "learn", "log")
# A whole rollout's or update's one call (the reference trainer's graph_scope): the phases inside it are not split.
GRAPH_PHASES = ("rollout_graph", "update_graph")
# What no phase claims: shown beside the named phases, never folded into them.
OTHER = "other"
# The keys an outside trainer must write (docs/results-format.md); every other field may be absent.
REQUIRED = ("schema", "sps", "steps", "steady_steps", "steady_seconds", "wall_seconds", "phases", "epochs")
EPOCH_REQUIRED = ("steps", "seconds", "warmup", "phases")
# Written only when they hold something (a traced run, several ranks, an attached or measured run).
PRESENT_ONLY = ("trace", "timeline", "ranks", "attached", "interference", "pair", "memory")


@dataclass
class RunSummary:
    """What one run measured; the fields are the summary's keys, in their order (docs/results-format.md says
    what each means). `extra` keeps keys this reader does not know, so a summary read and written again loses
    nothing."""

    schema: int
    sps: float
    steps: int
    steady_steps: int
    steady_seconds: float
    wall_seconds: float
    phases: dict[str, float]
    epochs: list[dict]
    writer: str = "reference"
    config: dict[str, Any] = field(default_factory=dict)
    sps_end_to_end: float | None = None
    warmup_seconds: float | None = None
    compile_seconds: float | None = None
    env_start_seconds: float | None = None
    env_build_seconds: float | None = None
    setup_seconds: dict[str, float] | None = None
    phase_coverage: float | None = None
    env_overlap: dict[str, Any] | None = None
    mean_episode_return: float | None = None
    episodes: int | None = None
    losses: dict[str, float] | None = None
    dtype_used: str | None = None
    world_size: int = 1
    device_name: str | None = None
    device_uuid: str | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    trace: str | None = None
    timeline: list[list] | None = None
    steady_window_unix_ns: list[int] | None = None
    h2d_bytes_per_step: int | None = None
    work: dict[str, Any] | None = None
    parameters: int | None = None
    time_to_solve: dict | None = None
    ranks: list[dict] | None = None
    attached: dict[str, Any] | None = None
    interference: dict[str, Any] | None = None
    pair: dict[str, Any] | None = None
    # peak host and device memory (rlperf/memory.py); None when not measured, as in summaries written before it
    memory: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def read(cls, data: dict[str, Any] | RunSummary) -> RunSummary:
        """The record of a stored summary of schema 1 or 2; a field it lacks is empty (None), a key this reader
        does not know is kept in `extra`. A schema other than 1 or 2 is refused in one line."""
        if isinstance(data, RunSummary):
            return data
        if not isinstance(data, dict):
            raise BadInput(f"summary: must be a JSON object, not {type(data).__name__}")
        schema = data.get("schema", 1)
        if schema not in READABLE_SCHEMAS:
            raise BadInput(f"summary: schema {schema!r} is not one this rlperf reads (allowed: 1, 2)")
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        values = {name: value for name, value in data.items() if name in known}
        values.setdefault("schema", 1)
        for name in REQUIRED:
            values.setdefault(name, None)
        if values.get("world_size") is None:
            values["world_size"] = 1
        for name in ("config", "versions"):
            if values.get(name) is None:
                values[name] = {}
        if schema == 1:
            values["writer"] = "reference"  # only the reference trainer wrote schema 1
        values["phases"] = values["phases"] or {}
        values["epochs"] = values["epochs"] or []
        return cls(**values, extra={name: value for name, value in data.items() if name not in known})

    @classmethod
    def check(cls, data: Any, sps_required: bool = True) -> RunSummary:
        """A summary a trainer has just written, refused in one line naming the first field that is missing or
        of the wrong kind: the fields of REQUIRED, and each epoch's EPOCH_REQUIRED. Without `sps_required`, an
        attached run that saw no env step (its `attached.missing` says so) passes without SPS."""
        if not isinstance(data, dict):
            raise BadInput(f"summary: must be a JSON object, not {type(data).__name__}")
        missing = [name for name in REQUIRED if data.get(name) is None]
        why = (data.get("attached") or {}).get("missing")
        if missing == ["sps"] and why and not sps_required:
            missing = []
        elif missing == ["sps"] and why:
            raise BadInput(f"summary: sps is missing: {why}")
        if missing:
            raise BadInput(f"summary: {missing[0]} is missing (a trainer must write {', '.join(REQUIRED)})")
        summary = cls.read(data)
        for name in ("sps", "steady_seconds", "wall_seconds"):
            if name == "sps" and summary.sps is None:
                continue
            if not is_number(getattr(summary, name)):
                raise BadInput(f"summary: {name} must be a number, not {getattr(summary, name)!r}")
        for name in ("steps", "steady_steps"):
            if not isinstance(getattr(summary, name), int) or getattr(summary, name) < 0:
                raise BadInput(f"summary: {name} must be a whole number of 0 or more")
        if not isinstance(summary.phases, dict) or not all(
                isinstance(k, str) and is_number(v) for k, v in summary.phases.items()):
            raise BadInput("summary: phases must map phase names to seconds")
        if not isinstance(summary.epochs, list) or not summary.epochs:
            raise BadInput("summary: epochs must be a list of at least one epoch")
        for index, epoch in enumerate(summary.epochs):
            lacking = [name for name in EPOCH_REQUIRED if not isinstance(epoch, dict) or name not in epoch]
            if lacking:
                raise BadInput(f"summary: epochs[{index}] lacks {lacking[0]} (each epoch has "
                               f"{', '.join(EPOCH_REQUIRED)})")
        problem = memory_problem(summary.memory)
        if problem:
            raise BadInput(f"summary: memory: {problem}")
        if summary.writer not in WRITERS:
            raise BadInput(f"summary: writer {summary.writer!r} is not one of {', '.join(WRITERS)}")
        return summary

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of docs/results-format.md."""
        summary = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        for name in PRESENT_ONLY:
            if summary[name] is None:
                del summary[name]
        return {**summary, **self.extra}

    @property
    def steady_epochs(self) -> list[dict]:
        return [epoch for epoch in self.epochs if not epoch.get("warmup")]

    @property
    def named_seconds(self) -> float:
        """The steady seconds the named phases claimed: every phase but `other`."""
        return sum(seconds for phase, seconds in self.phases.items() if phase != OTHER)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
