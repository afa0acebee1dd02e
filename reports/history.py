"""`rlperf report --history STORE`: the nightly trend. Runs are grouped by suite and machine (only those
compare), ordered by start time, and each is judged against the run before it, so a marked point is
where a point got slower."""

from __future__ import annotations

import numpy as np
import pandas as pd

from benches.store import Store
from reports import figures
from reports.page import Report, Section
from reports.criteria import check_criteria
from reports.render import fmt_change, write_report
from reports.results import RunData, load_run, point_table
from reports.verdicts import judge
from rlperf.errors import BadInput

FINISHED = ("complete", "interrupted")


def render_history(store_path: str, out_dir: str, threshold: float,
                   alpha: float) -> tuple[tuple[str, str], pd.DataFrame]:
    """Writes the history report; returns its paths and a summary (one row per suite and machine)."""
    check_criteria(threshold, alpha)
    try:
        store = Store.open(store_path, readonly=True)
    except BadInput as exc:
        raise BadInput(f"history: {exc}") from None
    runs = store.runs()
    runs = runs[runs["status"].isin(FINISHED)]
    if runs.empty:
        raise BadInput(f"history: {store_path} holds no finished runs")
    sections, summary = [], []
    for (suite, machine_key), group in runs.groupby(["suite", "machine_key"], sort=False):
        loaded = [load_run(store, run_id, "history") for run_id in group["run_id"]]
        section, rows = trend_section(suite, machine_key, loaded, threshold, alpha)
        sections.append(section)
        latest = rows[-1]
        summary.append({"suite": suite, "machine": section.title.partition(" · ")[2], "runs": len(rows),
                        "latest run": latest["run"], "commit": latest["commit"],
                        "regressed in it": latest["regressed"]})
    report = Report(f"rlperf history · {store_path}",
                    f"{len(runs)} finished runs; each judged against the previous run of the same suite on the "
                    f"same machine (threshold {threshold:.0%}, alpha {alpha:g})", sections)
    return write_report(report, out_dir), pd.DataFrame(summary)


def run_tick(run: RunData) -> str:
    """A run's x label: its commit and start time, so two runs of one commit stay apart."""
    started = str(run.info["started_at"])
    return f"{run.commit[:7]} {started[5:10]} {started[11:19]}"


def trend_section(suite: str, machine_key: str, runs: list[RunData], threshold: float,
                  alpha: float) -> tuple[Section, list[dict]]:
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
    text = [f"Suite {suite} on machine {machine_key}: {len(runs)} runs. A red triangle marks a run in which the "
            "point regressed against the run before it."]
    trend_frame = pd.DataFrame(trend)
    svgs = [figures.history(trend_frame)] if not trend_frame.empty else []
    section = Section(f"{suite} · {runs[-1].fingerprint.get('hostname') or machine_key}", text, [pd.DataFrame(rows)],
                      svgs)
    return section, rows
