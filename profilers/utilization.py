"""Per-point figures from a utilization time series: mean utilization, energy and utilization-seconds per
million agent steps, over a chosen window (the steady epochs, when the caller knows them)."""

from __future__ import annotations

import numpy as np
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
    max_mem_used_bytes, samples} over [start_ns, end_ns] (default: from the first sample to the last), for
    `steps` agent steps.

    A window's own duration is its length, however its samples fall. Energy comes from NVML's energy counter,
    interpolated linearly at the window's edges from the samples either side (the counter only rises, so the
    samples inside alone would miss up to an interval at each edge), and falls back to mean power times the
    duration on GPUs without one. Utilization-seconds: mean utilization of the samples inside (as a fraction)
    times the duration, i.e. seconds of a fully busy device.
    """
    frame = as_frame(rows)
    start = frame.t_ns.min() if start_ns is None else start_ns
    end = frame.t_ns.max() if end_ns is None else end_ns
    inside = frame[(frame.t_ns >= start) & (frame.t_ns <= end)]
    seconds = (end - start) / 1e9
    per_million = 1e6 / steps if steps else None
    result = {}
    for source, group in inside.groupby("source"):
        by_metric = {metric: g for metric, g in group.groupby("metric")}
        util_metric = UTILIZATION_METRIC.get(source, GPU_UTILIZATION_METRIC)
        mean_util = by_metric[util_metric].value.mean() if util_metric in by_metric else None
        mean_power = by_metric["power_w"].value.mean() if "power_w" in by_metric else None
        counter = frame[(frame.source == source) & (frame.metric == "energy_j")].sort_values("t_ns")
        energy_j = None
        if len(counter) > 1:
            at_start, at_end = np.interp([0, end - start], counter.t_ns - start, counter.value)
            energy_j = at_end - at_start
        elif mean_power is not None:
            energy_j = mean_power * seconds
        result[source] = {
            "samples": int(group.t_ns.nunique()),
            "seconds": seconds,
            "mean_util_percent": _plain(mean_util),
            "util_seconds_per_m_steps": _plain(None if mean_util is None or per_million is None
                                               else mean_util / 100.0 * seconds * per_million),
            "energy_j_per_m_steps": _plain(None if energy_j is None or per_million is None else energy_j * per_million),
            "mean_power_w": _plain(mean_power),
            "max_mem_used_bytes": _plain(by_metric["mem_used_bytes"].value.max() if "mem_used_bytes" in by_metric
                                         else by_metric["ram_used_bytes"].value.max() if "ram_used_bytes" in by_metric
                                         else None),
        }
    return result


def _plain(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)
