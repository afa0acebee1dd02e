"""Per-point figures from a utilization time series: mean utilization, energy and utilization-seconds per
million agent steps, over a chosen window (the steady epochs, when the caller knows them)."""

from __future__ import annotations

import pandas as pd

from profilers.sampler import Row

COLUMNS = ["t_ns", "source", "metric", "value"]
UTILIZATION_METRIC = {"cpu": "cpu_util_percent"}
GPU_UTILIZATION_METRIC = "gpu_util_percent"


def as_frame(rows: list[Row] | pd.DataFrame) -> pd.DataFrame:
    return rows[COLUMNS] if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows, columns=COLUMNS)


def summarize_utilization(rows: list[Row] | pd.DataFrame, steps: int, start_ns: int | None = None,
                          end_ns: int | None = None) -> dict[str, dict]:
    """source -> {mean_util_percent, util_seconds_per_m_steps, energy_j_per_m_steps, mean_power_w,
    max_mem_used_bytes, samples} over [start_ns, end_ns] (default: everything), for `steps` agent steps.

    Energy comes from NVML's energy counter (the difference across the window) and falls back to mean
    power times duration on GPUs without one. Utilization-seconds: mean utilization (as a fraction) times
    the window's seconds, i.e. seconds of a fully busy device.
    """
    frame = as_frame(rows)
    if start_ns is not None:
        frame = frame[frame.t_ns >= start_ns]
    if end_ns is not None:
        frame = frame[frame.t_ns <= end_ns]
    per_million = 1e6 / steps if steps else None
    result = {}
    for source, group in frame.groupby("source"):
        by_metric = {metric: g.sort_values("t_ns") for metric, g in group.groupby("metric")}
        seconds = (group.t_ns.max() - group.t_ns.min()) / 1e9
        util_metric = UTILIZATION_METRIC.get(source, GPU_UTILIZATION_METRIC)
        mean_util = by_metric[util_metric].value.mean() if util_metric in by_metric else None
        energy_j = None
        if "energy_j" in by_metric and len(by_metric["energy_j"]) > 1:
            energy_j = by_metric["energy_j"].value.iloc[-1] - by_metric["energy_j"].value.iloc[0]
        elif "power_w" in by_metric:
            energy_j = by_metric["power_w"].value.mean() * seconds
        result[source] = {
            "samples": int(group.t_ns.nunique()),
            "seconds": seconds,
            "mean_util_percent": _plain(mean_util),
            "util_seconds_per_m_steps": _plain(None if mean_util is None or per_million is None
                                               else mean_util / 100.0 * seconds * per_million),
            "energy_j_per_m_steps": _plain(None if energy_j is None or per_million is None else energy_j * per_million),
            "mean_power_w": _plain(by_metric["power_w"].value.mean() if "power_w" in by_metric else None),
            "max_mem_used_bytes": _plain(by_metric["mem_used_bytes"].value.max() if "mem_used_bytes" in by_metric
                                         else by_metric["ram_used_bytes"].value.max() if "ram_used_bytes" in by_metric
                                         else None),
        }
    return result


def _plain(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)
