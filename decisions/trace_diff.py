"""The traced diff's rule: two sides' traced processes compared phase by phase, then operator by operator inside the
phases that changed, a change claimed only beyond the spread of each side's own processes
(docs/decision-rules.md#traced-diffs). It renders nothing; reports/trace_diff.py draws what it returns.

Every figure is per agent step (time in ns, counts, bytes), one value a process: a process's luck is the noise.
"""

from __future__ import annotations

import json
import math
from statistics import fmean

from scipy import stats

from profilers.profile_sets import TracedProcess
from reference_trainer.config import MACHINE, OBSERVER, TrainConfig, fields_with

DEFAULT_ALPHA = 0.05
# A change smaller than this share of its phase (of itself, for a phase or a count) is not claimed, however steady:
# an operator that moves a phase by less is not where its change went.
MIN_SHARE = 0.01
TOP_N = 10
# Settings that change how long a run is or how it is observed, not the work of one of its steps.
RUN_LENGTH = ("seed", "total_steps", "warmup_epochs", "steady_seconds", "rank_timeout", "target_return",
              "target_window")
MEASURES = ("host", "device")
COUNTS = (("launches", "launches"), ("syncs", "syncs"), ("copy_bytes", "bytes copied"))
MEMORY = ("host_peak_rss_bytes", "device_peak_allocated_bytes", "device_peak_reserved_bytes")


def refusal(sides: dict[str, list[TracedProcess]]) -> str | None:
    """Why the two sides cannot be compared (other phases, other settings), naming which; None when they can."""
    (first, ref), (second, new) = sides.items()
    for name, processes in sides.items():
        if len({_work_settings(p) for p in processes}) > 1 or len({_phases(p) for p in processes}) > 1:
            return f"{name}: its processes ran different settings or phases; a side is one configuration"
    phases = {name: _phases(processes[0]) for name, processes in sides.items()}
    if phases[first] != phases[second]:
        return (f"phases: {first} has {', '.join(phases[first])}; {second} has {', '.join(phases[second])} "
                "(other phases cannot be compared)")
    a, b = dict(_work_settings(ref[0])), dict(_work_settings(new[0]))
    differing = [key for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
    if differing:
        shown = "; ".join(f"{key} {a.get(key, 'unset')} against {b.get(key, 'unset')}" for key in differing[:4])
        return f"settings: {shown} ({first} against {second}): other settings do other work a step"
    return None


def _phases(process: TracedProcess) -> tuple[str, ...]:
    return tuple(process.by_phase)


def _work_settings(process: TracedProcess) -> tuple:
    """The settings that decide a step's work: the reference trainer's config less how long it ran, how it was
    observed and which machine it ran on; a command's none (two commands are compared as two programs)."""
    if process.writer != "reference":
        return ()
    defaults = TrainConfig().to_dict()
    left_out = set(RUN_LENGTH) | set(fields_with(OBSERVER)) | set(fields_with(MACHINE))
    resolved = {**defaults, **process.settings}
    return tuple(sorted((key, json.dumps(value, sort_keys=True)) for key, value in resolved.items()
                        if key not in left_out))


def judged(ref: list[float], new: list[float], alpha: float, floor: float) -> dict:
    """One figure on both sides: means, the change (new less ref) and its 1 - alpha interval from the pooled spread
    of each side's processes (Student's t, n_ref + n_new - 2 degrees of freedom); `grown` or `shrunk` only where the
    interval excludes no change and the change is at least `floor`. With one process a side there is no spread,
    hence no interval and no claim."""
    ref_mean = fmean(ref) if ref else 0.0
    new_mean = fmean(new) if new else 0.0
    change = new_mean - ref_mean
    row = {"ref": ref_mean, "new": new_mean, "change": change,
           "relative": change / ref_mean if ref_mean else None, "low": None, "high": None, "verdict": "no spread",
           "ref_values": list(ref), "new_values": list(new)}
    dof = len(ref) + len(new) - 2
    if len(ref) < 2 or len(new) < 2:
        return row
    squares = sum((v - ref_mean) ** 2 for v in ref) + sum((v - new_mean) ** 2 for v in new)
    error = math.sqrt(squares / dof) * math.sqrt(1 / len(ref) + 1 / len(new))
    half = float(stats.t.ppf(1 - alpha / 2, dof)) * error
    row.update(low=change - half, high=change + half)
    if row["low"] > 0 and change >= floor:
        row["verdict"] = "grown"
    elif row["high"] < 0 and -change >= floor:
        row["verdict"] = "shrunk"
    else:
        row["verdict"] = "unchanged"
    return row


def per_step(processes: list[TracedProcess], value) -> list[float]:
    """`value(process)` per agent step of each process."""
    return [value(p) / p.env_steps for p in processes]


def diff(ref: list[TracedProcess], new: list[TracedProcess], alpha: float = DEFAULT_ALPHA) -> dict:
    """The diff of `new` against `ref` (comparable sides: see `refusal`). Phase rows (host, and device where both
    sides have it) share alpha (Bonferroni over the rows judged); inside a phase that changed, each operator and
    kernel is judged at alpha, as an account of a change already established."""
    measures = [m for m in MEASURES if all(p.by_phase[next(iter(p.by_phase))][f"{m}_us"] is not None
                                           for p in (*ref, *new))]
    rows = []
    for phase in ref[0].by_phase:
        for measure in measures:
            ref_values = per_step(ref, lambda p: 1e3 * p.by_phase[phase][f"{measure}_us"])
            new_values = per_step(new, lambda p: 1e3 * p.by_phase[phase][f"{measure}_us"])
            if any(ref_values) or any(new_values):
                rows.append({"phase": phase, "measure": measure, "ref_values": ref_values, "new_values": new_values})
    family_alpha = alpha / max(1, len(rows))
    phases = [{"phase": row["phase"], "measure": row["measure"],
               **judged(row["ref_values"], row["new_values"], family_alpha, MIN_SHARE * fmean(row["ref_values"]))}
              for row in rows]
    changed = []
    for phase in dict.fromkeys(row["phase"] for row in phases if row["verdict"] in ("grown", "shrunk")):
        own = {row["measure"]: row for row in phases if row["phase"] == phase}
        host, device = own.get("host") or own["device"], own.get("device") or own["host"]
        direction = next(row["verdict"] for row in own.values() if row["verdict"] in ("grown", "shrunk"))
        changed.append({"phase": phase, "verdict": direction,
                        "operators": _inside(ref, new, phase, "operators", alpha, host["ref"], direction),
                        "kernels": _inside(ref, new, phase, "kernels", alpha, device["ref"], direction)})
    counts, memory = _counts(ref, new, alpha), _memory(ref, new, alpha)
    return {"schema": 1, "unit": "per agent step (time in ns)", "alpha": alpha, "phase_alpha": family_alpha,
            "min_share": MIN_SHARE, "processes": {"ref": [p.name for p in ref], "new": [p.name for p in new]},
            "kind": {"ref": ref[0].kind, "new": new[0].kind}, "phases": phases, "changed": changed,
            "counts": counts, "memory": memory, "claims": claims(phases, changed, [*counts, *(memory or [])])}


def _inside(ref: list[TracedProcess], new: list[TracedProcess], phase: str, table: str, alpha: float,
            phase_ref: float, direction: str) -> list[dict]:
    """The phase's operators (or kernels), each judged, ranked by change in the phase's direction: per step ns,
    calls per step on both sides, and whether it is new or gone."""
    names = sorted({name for p in (*ref, *new) for name in p.by_phase[phase][table]})
    found = []
    for name in names:
        def figure(index: int):
            return lambda p: (1e3 if index == 0 else 1) * p.by_phase[phase][table].get(name, [0.0, 0])[index]
        row = {"name": name, **judged(per_step(ref, figure(0)), per_step(new, figure(0)), alpha, MIN_SHARE * phase_ref),
               "ref_calls": fmean(per_step(ref, figure(1))), "new_calls": fmean(per_step(new, figure(1)))}
        row["presence"] = "new" if not row["ref_calls"] else "gone" if not row["new_calls"] else ""
        found.append(row)
    sign = -1 if direction == "grown" else 1
    return sorted(found, key=lambda row: sign * row["change"])


def _counts(ref: list[TracedProcess], new: list[TracedProcess], alpha: float) -> list[dict]:
    """Launches, synchronisations and bytes copied per agent step over the whole traced step."""
    rows = []
    for key, label in COUNTS:
        def total(p):
            return sum(phase[key] for phase in p.by_phase.values())
        ref_values, new_values = per_step(ref, total), per_step(new, total)
        rows.append({"name": label, **judged(ref_values, new_values, alpha, MIN_SHARE * fmean(ref_values))})
    return rows


def _memory(ref: list[TracedProcess], new: list[TracedProcess], alpha: float) -> list[dict] | None:
    """Peak memory of each process (bytes, not per step), where every process of both sides measured it."""
    if not all(p.memory for p in (*ref, *new)):
        return None
    names = [key for key in MEMORY if all(p.memory.get(key) is not None for p in (*ref, *new))]
    phase_peaks = [(phase, key) for phase in ref[0].by_phase
                   for key in ("device_peak_allocated_bytes", "device_peak_reserved_bytes")
                   if all(((p.memory.get("phases") or {}).get(phase) or {}).get(key) is not None for p in (*ref, *new))]
    rows = []
    for key in names:
        ref_values, new_values = [p.memory[key] for p in ref], [p.memory[key] for p in new]
        rows.append({"name": key, **judged(ref_values, new_values, alpha, MIN_SHARE * fmean(ref_values))})
    for phase, key in phase_peaks:
        ref_values = [p.memory["phases"][phase][key] for p in ref]
        new_values = [p.memory["phases"][phase][key] for p in new]
        rows.append({"name": f"{phase} {key}", **judged(ref_values, new_values, alpha, MIN_SHARE * fmean(ref_values))})
    return rows


def claims(phases: list[dict], changed: list[dict], figures: list[dict]) -> list[str]:
    """The diff's claims in words: each phase that changed, the operators and kernels that changed inside, and the
    counts and memory figures that changed."""
    lines = []
    for row in phases:
        if row["verdict"] in ("grown", "shrunk"):
            lines.append(f"{row['phase']} ({row['measure']}) {row['verdict']} {row['change']:+,.0f} ns a step")
    for phase in changed:
        for table in ("operators", "kernels"):
            named = [row["name"] for row in phase[table] if row["verdict"] == phase["verdict"]]
            if named:
                lines.append(f"inside {phase['phase']}, {table} {phase['verdict']}: {', '.join(named[:5])}")
    return lines + [f"{row['name']} {row['verdict']} {row['change']:+,.6g}" for row in figures
                    if row["verdict"] in ("grown", "shrunk")]

