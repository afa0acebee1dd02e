"""Two machines side by side: SPS per point, SPS per GPU, phase shares, how near each machine's own peaks
each phase runs, and agent steps per dollar when hourly prices are given. Points are matched by swept values
and configuration, as verdicts match them, except for the device."""

from __future__ import annotations

import numpy as np
import pandas as pd

from reference_trainer.config import MACHINE, fields_with
from reports import figures, memory, roofline
from reports.page import Report, Section
from reports.formatting import fingerprint_section, fmt_sps, machine_line
from decisions.rundata import RunData, phase_us_per_step, point_table
from decisions.verdicts import match_key

SECONDS_PER_HOUR = 3600


def sps_per_gpu(sps: float, config: dict) -> float:
    """A GPU run uses one GPU per rank; a CPU run has no per-GPU figure."""
    return sps / config["world_size"] if config["device"].startswith("cuda") else np.nan


def across_machines(point_key: str, config: dict) -> str:
    """A point's identity on two machines: as verdicts match points, less the device, which each machine runs a
    suite on its own, and less a command point's command, which its settings make (the device among them)."""
    return match_key(point_key, config, (*fields_with(MACHINE), "command"))


def side_points(run: RunData) -> dict[str, dict]:
    """The run's measured points by configuration: label, config, median SPS and phase shares."""
    table = point_table(run).set_index("point_key")
    per_step = phase_us_per_step(run) if not run.samples.empty else pd.DataFrame()
    shares = per_step.div(per_step.sum(axis=1), axis=0)
    points = {}
    for point in run.points.itertuples():
        label = table.at[point.point_key, "label"]
        if point.status == "ok" and label in shares.index:
            key = across_machines(point.point_key, point.config)
            points[key] = {"label": label, "point_key": point.point_key, "config": point.config,
                           "sps": table.at[point.point_key, "sps_median"],
                           "shares": shares.loc[label], "memory": memory.peak_of(table.loc[point.point_key]),
                           "memory_kind": memory.peak_kind(table.loc[point.point_key])}
    return points


def summary(runs: dict[str, RunData], labels: dict[str, str]) -> pd.DataFrame:
    """The terminal's view: median SPS and peak memory on each machine for every configuration measured on both."""
    a_points, b_points = side_points(runs["A"]), side_points(runs["B"])
    a, b = labels["A"], labels["B"]
    return pd.DataFrame([{"point": left["label"], f"SPS {a}": fmt_sps(left["sps"]),
                          f"SPS {b}": fmt_sps(right["sps"]), f"{b} / {a}": f"{right['sps'] / left['sps']:.2f}×",
                          f"peak mem {a}": memory.fmt_bytes(left["memory"]),
                          f"peak mem {b}": memory.fmt_bytes(right["memory"]),
                          "mem change": memory_change(left, right)}
                         for key, left in a_points.items() if (right := b_points.get(key)) is not None])


def build(runs: dict[str, RunData], labels: dict[str, str], prices: dict[str, float]) -> Report:
    a_points, b_points = side_points(runs["A"]), side_points(runs["B"])
    matched = [(a_points[key], b_points[key]) for key in a_points if key in b_points]
    a, b = labels["A"], labels["B"]
    sections = []
    if not matched:
        sections.append(Section("Steps per second", ["No configuration was measured successfully on both "
                                                     "machines: nothing to compare."]))
    else:
        sections += [sps_section(matched, a, b, prices), memory_section(matched, a, b),
                     phase_share_section(matched, a, b),
                     roofline.comparison_section(matched, runs, labels)]
    for side, label in (("A", a), ("B", b)):
        section = fingerprint_section(runs[side])
        section.title = f"Machine {label}"
        sections.append(section)
    subtitle = f"{a}: {machine_line(runs['A'].fingerprint)} — {b}: {machine_line(runs['B'].fingerprint)}"
    return Report(f"rlperf comparison · {a} vs {b}", subtitle, sections)


def sps_section(matched: list[tuple[dict, dict]], a: str, b: str, prices: dict[str, float]) -> Section:
    rows = []
    for left, right in matched:
        row = {"point": left["label"], f"SPS {a}": fmt_sps(left["sps"]), f"SPS {b}": fmt_sps(right["sps"]),
               f"{b} / {a}": f"{right['sps'] / left['sps']:.2f}×",
               f"SPS per GPU {a}": fmt_sps(sps_per_gpu(left["sps"], left["config"])),
               f"SPS per GPU {b}": fmt_sps(sps_per_gpu(right["sps"], right["config"]))}
        for side, label, point in (("A", a, left), ("B", b, right)):
            if side in prices:
                row[f"M steps per $ {label}"] = f"{point['sps'] * SECONDS_PER_HOUR / prices[side] / 1e6:,.1f}"
        rows.append(row)
    text = ["Median steady SPS over repeats for every configuration measured on both machines; SPS per GPU "
            "divides a GPU run's SPS by its ranks."]
    if prices:
        text.append(f"Steps per dollar: steady SPS × 3600 / the machine's hourly price ({a}: "
                    f"{prices.get('A', 'not given')}, {b}: {prices.get('B', 'not given')}), in millions.")
    frame = pd.DataFrame({"label": [left["label"] for left, _ in matched],
                          "A": [left["sps"] for left, _ in matched], "B": [right["sps"] for _, right in matched]})
    return Section("Steps per second", text, [pd.DataFrame(rows)], [figures.side_by_side(frame, a, b)])


def phase_share_section(matched: list[tuple[dict, dict]], a: str, b: str) -> Section:
    rows = []
    for left, right in matched:
        for phase in left["shares"].index.union(right["shares"].index, sort=False):
            rows.append({"point": left["label"], "phase": phase,
                         f"share {a}": f"{left['shares'].get(phase, 0.0):.0%}",
                         f"share {b}": f"{right['shares'].get(phase, 0.0):.0%}"})
    text = ["Each phase's share of the steady step time on each machine: a phase whose share grows on one "
            "machine is what that machine is slow at."]
    return Section("Phase shares", text, [pd.DataFrame(rows)])


def memory_section(matched: list[tuple[dict, dict]], a: str, b: str) -> Section:
    rows = [{"point": left["label"], f"peak memory {a}": memory.fmt_bytes(left["memory"]),
             f"peak memory {b}": memory.fmt_bytes(right["memory"]),
             "change": memory_change(left, right)} for left, right in matched]
    text = ["Peak memory per configuration, the largest over each machine's repeats: the device's peak reserved "
            "bytes on CUDA, else the trainer process's peak RSS (no change is shown between a device's figure and "
            "a host's). The change is information, not a verdict."]
    return Section("Peak memory", text, [pd.DataFrame(rows)])


def memory_change(left: dict, right: dict) -> str:
    return memory.fmt_growth(left["memory"], right["memory"]) if left["memory_kind"] == right["memory_kind"] else "–"
