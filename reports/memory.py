"""Peak memory as the reports show it: beside each point's SPS, by phase on CUDA, against num_envs in a sweep, and
against a baseline or another machine. Memory is information, never a verdict: no rule judges it."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from decisions.rundata import RunData, swept_axes
from reports import figures
from reports.page import Section
from rlperf.memory import DEVICE_KEYS, HOST_KEY
from rlperf.store import point_label

RSS_COLUMN = "peak RSS"
DEVICE_COLUMN = "peak device alloc / reserved"


def fmt_bytes(value: float | None) -> str:
    if value is None or not np.isfinite(value):
        return "–"
    if value >= 2 ** 30:
        return f"{value / 2 ** 30:,.2f} GiB"
    return f"{value / 2 ** 20:,.0f} MiB"


def fmt_growth(before: float, after: float) -> str:
    return f"{after / before - 1:+.1%}" if np.isfinite(before) and np.isfinite(after) and before else "–"


def has_device(table: pd.DataFrame) -> bool:
    return DEVICE_KEYS[1] in table and table[DEVICE_KEYS[1]].notna().any()


def peak_of(row) -> float:
    """The one figure that says whether a point fits: the device's peak reserved bytes on CUDA, else the host's
    peak resident set (NaN when not measured)."""
    device = row.get(DEVICE_KEYS[1], np.nan)
    return float(device) if pd.notna(device) else float(row.get(HOST_KEY, np.nan))


def peak_kind(row) -> str:
    """Which figure `peak_of` gives: `device` (reserved bytes) or `host` (RSS)."""
    return "device" if pd.notna(row.get(DEVICE_KEYS[1], np.nan)) else "host"


def table_columns(table: pd.DataFrame) -> dict[str, list[str]]:
    """The points table's memory columns: the host's peak RSS, and the device's peaks where any point has them."""
    columns = {RSS_COLUMN: [fmt_bytes(v) for v in table.get(HOST_KEY, pd.Series(np.nan, index=table.index))]}
    if has_device(table):
        columns[DEVICE_COLUMN] = [f"{fmt_bytes(a)} / {fmt_bytes(r)}" if np.isfinite(r) else "–"
                                  for a, r in zip(table[DEVICE_KEYS[0]], table[DEVICE_KEYS[1]])]
    return columns


def section(run: RunData, table: pd.DataFrame) -> Section | None:
    """Each phase's device peaks (CUDA), and peak memory against num_envs where the sweep varies it."""
    phases = phase_table(run)
    figure = envs_figure(run, table)
    if phases.empty and figure is None:
        return None
    text = ["Peak memory per point is the largest over its repeats: the host's peak resident set of the trainer "
            "process (not its env workers'), and on CUDA the caching allocator's peak allocated and reserved bytes "
            "over the steady epochs. Reserved is what the process holds from the GPU, the figure that says whether "
            "it fits. By phase: the allocator's peaks while each phase ran, reset at every phase boundary."]
    return Section("Peak memory", text, [phases] if not phases.empty else [],
                   [figure] if figure is not None else [], side_by_side=True)


def phase_table(run: RunData) -> pd.DataFrame:
    peaks: dict[tuple[str, str], list[int]] = {}
    for point_key, memory in zip(run.samples.get("point_key", []), run.samples.get("memory", [])):
        for phase, found in ((memory or {}).get("phases") or {}).items():
            held = peaks.setdefault((point_key, phase), [0, 0])
            held[0], held[1] = max(held[0], found[DEVICE_KEYS[0]]), max(held[1], found[DEVICE_KEYS[1]])
    return pd.DataFrame([{"point": point_label(point_key), "phase": phase, "peak allocated": fmt_bytes(a),
                          "peak reserved": fmt_bytes(r)} for (point_key, phase), (a, r) in peaks.items()])


def envs_figure(run: RunData, table: pd.DataFrame) -> str | None:
    if "num_envs" not in swept_axes(run) or table.empty:
        return None
    axes = swept_axes(run)
    lines: dict[str, list] = {}
    for row in table.to_dict("records"):
        values, peak = json.loads(row["point_key"]), peak_of(row)
        if "num_envs" in values and np.isfinite(peak):
            others = point_label({k: v for k, v in values.items() if k != "num_envs" and k in axes})
            lines.setdefault(others, []).append({"num_envs": values["num_envs"], "bytes": peak})
    if not lines:
        return None
    what = "device memory (reserved)" if has_device(table) else "host RSS"
    return figures.memory_against_envs({label: pd.DataFrame(rows).sort_values("num_envs")
                                        for label, rows in lines.items()}, what)


def changes(before: pd.DataFrame, after: pd.DataFrame) -> list[dict]:
    """Per point measured in both point tables (by point key): each side's peak memory and the growth, a row a
    point; what the gate's summary and a report against a baseline show beside their verdicts."""
    earlier = before.set_index("point_key")
    rows = []
    for row in after.to_dict("records"):
        if row["point_key"] not in earlier.index:
            continue
        base = earlier.loc[row["point_key"]].to_dict()
        then, now = peak_of(base), peak_of(row)
        if not (np.isfinite(then) and np.isfinite(now)):
            continue
        if peak_kind(base) != peak_kind(row):
            continue
        rows.append({"point": row["label"], "measure": DEVICE_KEYS[1] if peak_kind(row) == "device" else
                     HOST_KEY, "baseline_bytes": int(then), "candidate_bytes": int(now),
                     "growth": now / then - 1 if then else None})
    return rows


def growth_line(rows: list[dict]) -> str:
    """One line for a terminal: the point whose peak memory grew most against the baseline."""
    most = max(rows, key=lambda row: row["growth"] if row["growth"] is not None else -np.inf)
    before, after = most["baseline_bytes"], most["candidate_bytes"]
    return (f"peak memory (information, not a verdict): largest change {fmt_growth(before, after)} at "
            f"{most['point']} ({fmt_bytes(before)} -> {fmt_bytes(after)}, {most['measure']})")


def baseline_section(baseline_table: pd.DataFrame, table: pd.DataFrame) -> Section | None:
    rows = changes(baseline_table, table)
    if not rows:
        return None
    shown = pd.DataFrame([{"point": row["point"], "measure": row["measure"],
                           "baseline": fmt_bytes(row["baseline_bytes"]), "this run": fmt_bytes(row["candidate_bytes"]),
                           "change": fmt_growth(row["baseline_bytes"], row["candidate_bytes"])} for row in rows])
    return Section("Peak memory against the baseline", [
        "Information, not a verdict: peak memory is shown beside the SPS verdicts and never fails a run. The device's "
        "peak reserved bytes on CUDA, else the trainer process's peak RSS; the largest over each side's repeats."],
        [shown])
