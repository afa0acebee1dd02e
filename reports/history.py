"""`rlperf report --history STORE`: the nightly trend. Runs are grouped by suite and machine (only those
compare), ordered by start time, and each is judged against the run before it, so a marked point is
where a point got slower. Change points (decisions/changepoints.py) then look at the whole series at once: the
runs where a point's SPS or a phase's time per step moved to a new level and stayed there."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from reference_trainer.config import PHASES
from rlperf.store import Store
from reports import figures
from decisions import changepoints
from decisions.changepoints import ChangePoint
from reports.page import Report, Section
from decisions.criteria import check_criteria
from reports.formatting import fmt_change, fmt_p, fmt_sps
from reports.page import write_report
from decisions.rundata import RunData, load_run, point_table
from decisions.sequential import PAIRING, paired_design
from decisions.verdicts import fmt_interval, judge, judge_pair_point, phase_per_step, quiet
from rlperf.errors import BadInput

FINISHED = ("complete", "interrupted")


def render_history(store_path: str, out_dir: str, threshold: float,
                   alpha: float) -> tuple[tuple[str, str], pd.DataFrame, pd.DataFrame]:
    """Writes the history report; returns its paths, a summary (one row per suite and machine) and the table
    of change points."""
    check_criteria(threshold, alpha)
    try:
        store = Store.open(store_path, readonly=True)
    except BadInput as exc:
        raise BadInput(f"history: {exc}") from None
    every = store.runs()
    runs = every[every["status"].isin(FINISHED) & every["fingerprint"].map(measures_its_moment)]
    if runs.empty:
        raise BadInput(f"history: {store_path} holds no finished runs")
    confirmations = every[every["fingerprint"].map(lambda fingerprint: changepoints.CONFIRMS in fingerprint)]
    sections, summary, change_tables = [], [], []
    for (suite, machine_key), group in runs.groupby(["suite", "machine_key"], sort=False):
        loaded = [load_run(store, run_id, "history") for run_id in group["run_id"]]
        section, rows, changes = trend_section(suite, machine_key, loaded, threshold, alpha,
                                               lambda change: confirmation(store, confirmations, change))
        sections.append(section)
        machine = section.title.partition(" · ")[2]
        latest = rows[-1]
        summary.append({"suite": suite, "machine": machine, "runs": len(rows),
                        "latest run": latest["run"], "commit": latest["commit"],
                        "regressed in it": latest["regressed"], "change points": len(changes)})
        if changes:
            change_tables.append(change_table(changes, loaded).assign(suite=suite, machine=machine))
    report = Report(f"rlperf history · {store_path}",
                    f"{len(runs)} finished runs; each judged against the previous run of the same suite on the "
                    f"same machine (threshold {threshold:.0%}, alpha {alpha:g}), and change points found over "
                    "each whole series", sections)
    changes = pd.concat(change_tables, ignore_index=True) if change_tables else pd.DataFrame()
    if not changes.empty:
        changes = changes[["suite", "machine"] + [c for c in changes.columns if c not in ("suite", "machine")]]
    return write_report(report, out_dir), pd.DataFrame(summary), changes


def measures_its_moment(fingerprint: dict) -> bool:
    """Whether a run belongs in the trend: a measurement of the code of its own moment, once a night. Left out:
    the baseline side of runs made in pairs (an older commit), a gate's refinement and confirmation (a few of the
    screen's points again, the same night), and the runs of a bisection or of a change point's confirmation
    (commits measured out of order)."""
    pairing, gate = fingerprint.get(PAIRING) or {}, fingerprint.get("gate") or {}
    return pairing.get("side") != "ref" and gate.get("side") != "ref" and gate.get("stage", "screen") == "screen" \
        and "bisect" not in fingerprint and changepoints.CONFIRMS not in fingerprint


def confirmation(store: Store, confirmations: pd.DataFrame, change: ChangePoint) -> str:
    """How `rlperf confirm` re-measured this change point, judged from its stored pair of runs; empty when it
    has not been confirmed."""
    sides = {}
    for row in confirmations.itertuples():
        entry = row.fingerprint[changepoints.CONFIRMS]
        if entry["run"] == change.run_id and entry["point"] == change.key and row.status == "complete":
            sides[(row.fingerprint.get(PAIRING) or {}).get("side")] = row
    if set(sides) != {"ref", "new"}:
        return ""
    new, ref = (load_run(store, sides[side].run_id, "history") for side in ("new", "ref"))
    design = paired_design(new.fingerprint, ref.run_id)
    point_key = sides["new"].fingerprint[changepoints.CONFIRMS]["point_key"]
    status = new.points.set_index("point_key")["status"].get(point_key)
    if design is None or status != "ok":
        return f"undecided: {status or 'not measured'}"
    verdict = judge_pair_point(new.samples[new.samples["point_key"] == point_key],
                               ref.samples[ref.samples["point_key"] == point_key], design, ended=True)
    return changepoints.confirmation_text(change, verdict)


def run_tick(run: RunData) -> str:
    """A run's x label: its commit and start time, so two runs of one commit stay apart."""
    started = str(run.info["started_at"])
    return f"{run.commit[:7]} {started[5:10]} {started[11:19]}"


def trend_section(suite: str, machine_key: str, runs: list[RunData], threshold: float, alpha: float,
                  confirmed=lambda change: "") -> tuple[Section, list[dict], list[ChangePoint]]:
    trend, rows = [], []
    previous = None
    for order, run in enumerate(runs):
        verdicts = judge(run.points, run.samples, previous.points, previous.samples, threshold, alpha) \
            if previous is not None else []
        regressed = {v.point: v for v in verdicts if v.status == "regressed"}
        for point in point_table(run).itertuples():
            if np.isfinite(point.sps_median):
                trend.append({"label": point.label, "order": order, "commit": run_tick(run),
                              "sps": point.sps_median, "regressed": point.label in regressed})
        rows.append({
            "run": run.run_id, "commit": run.commit, "started": run.info["started_at"],
            "regressed": "; ".join(f"{label} {fmt_change(v.sps.relative)}"
                                   + (f" ({', '.join(p for p, _ in v.phases_grew)})" if v.phases_grew else "")
                                   for label, v in regressed.items()) or "–",
            "improved": sum(v.status == "improved" for v in verdicts),
        })
        previous = run
    changes = changepoints.find(runs, threshold, alpha)
    for change in changes:
        change.confirmation = confirmed(change) if change.metric == changepoints.SPS else ""
    ticks = [run_tick(run) for run in runs]
    offset, counted = run_offset(runs)
    text = [f"Suite {suite} on machine {machine_key}: {len(runs)} runs. A red triangle marks a run in which the "
            "point regressed against the run before it; a dashed line marks a change point, with the level of "
            "the runs either side shaded (their middle half of repeats).", change_rule_text(threshold, alpha)]
    if counted >= MIN_OFFSET_RUNS:
        text.append(offset_text(offset, counted))
    text += [f"{change.point}: {change.sentence()} (run {change.run_id}, {ticks[change.order]}; "
             f"{fmt_change(change.shift.estimate)} {fmt_interval(change.shift)}, p={fmt_p(change.p_value)})"
             for change in changes] or ["No change points: no point's SPS or phase time moved to a new level."]
    trend_frame = pd.DataFrame(trend)
    svgs = []
    if not trend_frame.empty:
        svgs.append(figures.history(trend_frame, sps_levels(changes), change_marks(changes)))
    phases = phase_trend(runs)
    if not phases.empty:
        svgs.append(figures.phase_history(phases, change_marks(changes)))
    tables = [pd.DataFrame(rows)] + ([change_table(changes, runs)] if changes else [])
    section = Section(f"{suite} · {runs[-1].fingerprint.get('hostname') or machine_key}", text, tables, svgs)
    return section, rows, changes


def print_changes(console, changes: pd.DataFrame) -> None:
    """The change points on the terminal: names, runs and intervals never wrap (CI logs are grepped for them);
    the phases take the rest. Cells are text, not markup: labels come from results."""
    from rich.table import Table
    from rich.text import Text

    if changes.empty:
        console.print("change points: none (no point's SPS or phase time moved to a new level)")
        return
    table = Table(title="change points: where a level shifted and stayed")
    columns = ["suite", "point", "metric", "status", "run", "change (interval)", "p", "confirmed"]
    if changes["machine"].nunique() > 1:
        columns.insert(1, "machine")
    for column in columns:
        table.add_column(column, no_wrap=True)
    table.add_column("phases that moved", overflow="fold")
    styles = {"regressed": "bold red", "improved": "green"}
    for row in changes.to_dict("records"):
        cells = [Text(str(row[column]), style=styles.get(row[column], "") if column == "status" else "")
                 for column in columns]
        table.add_row(*cells, Text(row["phases that moved"]))
    console.print(table)


def change_rule_text(threshold: float, alpha: float) -> str:
    return ("Change points: runs are the unit (a night's processes share its offset). For each point's SPS and "
            "each phase's time per step, the stretch of runs (a split, or a level that came and went) whose "
            "medians differ most from the other runs' (Mann–Whitney), kept when shuffling whole runs rarely gives "
            "as large a difference for any stretch (p below Benjamini–Hochberg's level over every series at "
            f"{alpha:g}) and when the shift is beyond ±{threshold:.0%}; each piece is then searched again against "
            "the same critical value. A change's shift is corrected for picking the stretch, with the exact "
            f"Mann–Whitney interval of the runs between neighbouring change points at {1 - alpha:.0%}; phases that "
            f"moved are those whose time per step changed beyond ±{threshold:.0%} at the same runs. `rlperf "
            "confirm` measures the commits either side of each change point again, in pairs, in one job.")


MIN_OFFSET_RUNS = 3


def run_offset(runs: list[RunData]) -> tuple[float, int]:
    """How much whole runs of one suite differ from each other beyond their points' own levels: each point's
    median log SPS per run, less that point's median over runs; a run's offset is the median of those over its
    points; the robust SD of the offsets (scaled MAD), and the runs counted."""
    medians: dict[str, dict[int, float]] = {}
    for order, run in enumerate(runs):
        for point in point_table(run).itertuples():
            if point.status == "ok" and np.isfinite(point.sps_median):
                medians.setdefault(point.point_key, {})[order] = float(np.log(point.sps_median))
    deviations: dict[int, list[float]] = {}
    for by_run in medians.values():
        center = float(np.median(list(by_run.values())))
        for order, value in by_run.items():
            deviations.setdefault(order, []).append(value - center)
    offsets = np.array([np.median(values) for values in deviations.values()])
    if len(offsets) < MIN_OFFSET_RUNS:
        return np.nan, len(offsets)
    return float(stats.median_abs_deviation(offsets, scale="normal")), len(offsets)


def suite_offset(store_path: str, suite: str, machine_key: str) -> tuple[float, int]:
    """run_offset over a store's finished runs of one suite on one machine that measure their own moment."""
    with Store.open(store_path, readonly=True) as store:
        runs = store.runs()
        chosen = runs[(runs["suite"] == suite) & (runs["machine_key"] == machine_key)
                      & runs["status"].isin(FINISHED) & runs["fingerprint"].map(measures_its_moment)]
        return run_offset([load_run(store, run_id, "history") for run_id in chosen["run_id"]])


def offset_text(offset: float, counted: int) -> str:
    return (f"Whole runs of this suite differ by a run-wide offset of about {offset:.1%} (robust SD over {counted} "
            f"runs, beyond each point's own level): two runs measured apart cannot tell a change of less than "
            f"about {2.8 * offset:.1%} from a night's offset.")


def fmt_level(metric: str, value: float) -> str:
    return fmt_sps(value) if metric == changepoints.SPS else f"{value * 1e6:.3g} µs/step"


def change_table(changes: list[ChangePoint], runs: list[RunData]) -> pd.DataFrame:
    """One row per change point: where it began, its size with interval and p, and the phases that moved."""
    return pd.DataFrame([{
        "point": change.point, "metric": change.metric, "status": "regressed" if change.worse else "improved",
        "began at": run_tick(runs[change.order]), "run": change.run_id,
        "before → after": f"{fmt_level(change.metric, change.before)} → {fmt_level(change.metric, change.after)}",
        "change (interval)": f"{fmt_change(change.shift.estimate)} {fmt_interval(change.shift)}",
        "p": fmt_p(change.p_value),
        "runs before/after": f"{change.runs_before}/{change.runs_after}",
        "confirmed": change.confirmation or "not yet (`rlperf confirm`)",
        "phases that moved": ", ".join(f"{phase} {fmt_change(moved.estimate)}" for phase, moved in change.phases_moved)
        or ("–" if change.metric != changepoints.SPS else "no single phase beyond the threshold"),
    } for change in changes])


def sps_levels(changes: list[ChangePoint]) -> pd.DataFrame:
    """The level (median and middle half of the repeats) of each stretch of runs between SPS change points."""
    levels = []
    for label in dict.fromkeys(c.point for c in changes if c.metric == changepoints.SPS):
        ordered = [c for c in changes if c.metric == changepoints.SPS and c.point == label]
        for index, change in enumerate(ordered):
            if index == 0:
                levels.append({"label": label, "first": change.span[0], "last": change.order - 1,
                               "level": change.before, "low": change.before_band[0], "high": change.before_band[1]})
            last = ordered[index + 1].order - 1 if index + 1 < len(ordered) else change.span[1]
            levels.append({"label": label, "first": change.order, "last": last, "level": change.after,
                           "low": change.after_band[0], "high": change.after_band[1]})
    return pd.DataFrame(levels, columns=["label", "first", "last", "level", "low", "high"])


def change_marks(changes: list[ChangePoint]) -> pd.DataFrame:
    """Where each change began, named on the SPS panels by its size and on the phase panels by the phases
    that moved."""
    return pd.DataFrame([{"label": c.point, "order": c.order, "metric": c.metric, "worse": c.worse,
                          "note": f"{c.metric} {fmt_change(c.shift.estimate)}",
                          "phase_note": ", ".join(f"{phase} {fmt_change(moved.estimate)}"
                                                  for phase, moved in c.phases_moved[:2])
                          or f"{c.metric} {fmt_change(c.shift.estimate)}"} for c in changes],
                        columns=["label", "order", "metric", "worse", "note", "phase_note"])


def phase_trend(runs: list[RunData]) -> pd.DataFrame:
    """Microseconds per agent step in each phase, median of each run's quiet repeats, per point."""
    rows = []
    for order, run in enumerate(runs):
        for point in point_table(run).itertuples():
            samples = quiet(run.samples[run.samples["point_key"] == point.point_key])
            if point.status != "ok" or samples.empty:
                continue
            for phase in PHASES:
                per_step = phase_per_step(samples, phase)
                if (per_step > 0).any():
                    rows.append({"label": point.label, "order": order, "commit": run_tick(run), "phase": phase,
                                 "us_per_step": float(np.median(per_step[per_step > 0])) * 1e6})
    return pd.DataFrame(rows)
