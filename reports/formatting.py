"""How figures read wherever the reports show them: on pages, in terminal tables, in one-line notes."""

from __future__ import annotations

import numpy as np
import pandas as pd

from reports.page import Section
from decisions.rundata import RunData
from rlperf import peaks
from rlperf.machine import gpu_names


def fmt_sps(value: float) -> str:
    return "–" if value is None or not np.isfinite(value) else f"{value:,.0f}"


def fmt_change(relative: float) -> str:
    return f"{relative * 100:+.1f}%"


def fmt_p(p_value: float) -> str:
    return f"{p_value:.1e}" if p_value < 1e-3 else f"{p_value:.2g}"


def machine_line(fingerprint: dict) -> str:
    cpu = fingerprint.get("cpu") or {}
    gpu_text = ", ".join(gpu_names(fingerprint)) or "no GPU"
    return (f"{cpu.get('model') or 'unknown CPU'} ({cpu.get('cores_logical', '?')} threads) · {gpu_text} · "
            f"torch {fingerprint.get('torch') or '?'} · CUDA {fingerprint.get('cuda') or 'none'}")


def fmt_rate(value: float, unit: str) -> str:
    """A measured rate: `152 GFLOP/s`, `10.4 GB/s`, a tiny op's cost as `1.51 µs/op`."""
    if value is None or not np.isfinite(value) or value <= 0:
        return "–"
    if unit == "op/s":
        return f"{1e6 / value:.3g} µs/op"
    scale, prefix = next(((10**p, name) for p, name in ((12, "T"), (9, "G"), (6, "M"), (3, "k")) if value >= 10**p),
                         (1, ""))
    return f"{value / scale:.3g} {prefix}{unit}"



def fmt_rate_range(samples: list[float], unit: str) -> str:
    """A measured rate's timings, least to most as shown: a rate from slowest to fastest, a tiny op's cost (shown
    per op, the inverse of its rate) from cheapest to dearest."""
    low, high = min(samples), max(samples)
    if unit == "op/s":
        low, high = high, low
    return f"{fmt_rate(low, unit)} – {fmt_rate(high, unit)}"

PEAK_NAMES = {peaks.ROOF: "matrix-product peak", peaks.MEMORY: "memory bandwidth (a copy)",
              peaks.DISPATCH: "one tiny op", "h2d_pinned": "host→device, pinned",
              "h2d_pageable": "host→device, pageable", "d2h_pinned": "device→host, pinned",
              "d2h_pageable": "device→host, pageable"}


def fmt_peak(row: dict) -> str:
    """What a measured peak (a row of the store's `peaks` table) is: `matrix-product peak (fastest of 256³,
    512³)`, `linear 64x128x512`, `memory bandwidth (a copy) of 256 MiB`."""
    op, shape, method = row["op"], row["shape"], row["method"]
    if op in peaks.PRODUCTS:
        return f"{op} {'x'.join(str(size) for size in shape)}"
    if op in peaks.CONVOLUTIONS:
        batch, channels, height, width, out_channels, kernel, stride = shape[:7]
        return f"{op} {batch}x{channels}x{height}x{width} → {out_channels}, {kernel}x{kernel}/{stride}"
    if op == peaks.ROOF:
        return f"{PEAK_NAMES[op]} (fastest of {', '.join(f'{side}³' for side in method['sides'])})"
    return PEAK_NAMES[op] + (f" of {method['bytes'] / 2**20:g} MiB" if method.get("bytes") else "")


def fmt_method(method: dict) -> str:
    graphed = ", as a CUDA graph" if method.get("graphed") else ""
    calls = method["calls_per_timing"]
    spent = f"; {method['seconds']:.2f} s in all" if "seconds" in method else ""  # absent in older stores
    kept = method.get("kept", "median")  # older stores kept the median timing
    return (f"{kept} of {method['timings']} timings of {calls} call{'s' if calls > 1 else ''}, after "
            f"{method['warmup_calls']} warm-up calls{graphed}{spent}")


def fmt_detectable(fraction: float) -> str:
    return "none (too few repeats)" if not np.isfinite(fraction) else f"≥ {fraction:.0%}"


def fingerprint_section(run: RunData) -> Section:
    rows = []

    def flatten(prefix: str, value) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                flatten(f"{prefix}.{key}" if prefix else str(key), inner)
        elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            for index, item in enumerate(value):
                flatten(f"{prefix}[{index}]", item)
        else:
            rows.append({"field": prefix, "value": "–" if value in (None, [], "") else str(value)})

    flatten("", run.fingerprint)
    text = [f"Machine key {run.info['machine_key']}: runs compare only with runs of the same key."]
    return Section("Machine fingerprint", text, [pd.DataFrame(rows)])


def print_table(console, frame: pd.DataFrame, title: str) -> None:
    """A small table on the terminal; cells are text, never markup (labels come from results)."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title)
    for column in frame.columns:
        table.add_column(str(column))
    for row in frame.itertuples(index=False):
        table.add_row(*(Text(str(value)) for value in row))
    console.print(table)


def print_verdicts(console, verdicts) -> None:
    from rich.table import Table
    from rich.text import Text

    from decisions.verdicts import fmt_interval

    colors = {"regressed": "bold red", "improved": "green", "failed": "magenta", "missing": "yellow", "new": "cyan",
              "inconclusive": "yellow"}
    table = Table(title="verdicts against the baseline")
    for column in ("point", "status", "baseline SPS", "SPS", "change (interval)", "detects"):
        table.add_column(column, no_wrap=True)  # point names stay whole in CI logs; the note takes the rest
    table.add_column("phases that grew; note", overflow="fold")
    for verdict in verdicts:
        sps = verdict.sps
        grew = ", ".join(f"{phase} {fmt_change(change.relative)}" for phase, change in verdict.phases_grew)
        # Text cells, not markup: point labels and reasons come from results and may contain brackets.
        table.add_row(
            Text(verdict.point), Text(verdict.status, style=colors.get(verdict.status, "")),
            fmt_sps(sps.baseline) if sps else "–", fmt_sps(sps.candidate) if sps else "–",
            f"{fmt_change(sps.relative)} {fmt_interval(sps)}" if sps else "–",
            fmt_detectable(verdict.detectable) if sps else "–",
            Text("; ".join(text for text in (grew, verdict.reason) if text)),
        )
    console.print(table)


def print_gate(console, found, plan) -> None:
    from rich.table import Table
    from rich.text import Text

    from decisions import screening
    from decisions.verdicts import fmt_interval

    colors = {screening.REGRESSED: "bold red", screening.PASSED: "green", screening.NOT_CONFIRMED: "yellow",
              screening.UNMEASURED: "magenta", screening.UNDECIDED: "magenta", screening.SKIPPED: "dim"}
    table = Table(title="gate: did any point get slower?")
    for column in ("point", "status", "screen (pairs)", "pair noise", "confirmation (pairs)", "detects"):
        table.add_column(column, no_wrap=True)
    table.add_column("note", overflow="fold")
    for verdict in found:
        screen, sps = verdict.screen, verdict.confirmation.sps if verdict.confirmation else None
        table.add_row(
            Text(verdict.point), Text(verdict.status, style=colors.get(verdict.status, "")),
            f"{fmt_change(screen.estimate)} ({screen.quiet}/{screen.pairs})" if screen.quiet else "–",
            f"{screen.spread:.1%}" if screen.quiet > 1 else "–",
            f"{fmt_change(sps.relative)} {fmt_interval(sps)} ({sps.n_candidate})" if sps else "–",
            fmt_detectable(screening.point_detectable(plan, screen)),
            Text(verdict.note or screen.reason))
    console.print(table)
