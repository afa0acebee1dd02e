"""One stored run, read through the store's API, and the per-point figures every report shows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rlperf.memory import DEVICE_KEYS, HOST_KEY
from rlperf.store import Store, open_results, point_label
from reference_trainer.config import EVERY_PHASE
from rlperf.summary import OTHER
from decisions.criteria import DEFAULT_ALPHA, DEFAULT_THRESHOLD
from decisions.verdicts import detectable_alone
from rlperf.errors import BadInput


@dataclass
class RunData:
    store_path: str
    run_id: str
    info: dict
    fingerprint: dict
    points: pd.DataFrame
    samples: pd.DataFrame
    utilization: pd.DataFrame
    collectives: pd.DataFrame
    traces: pd.DataFrame
    peaks: pd.DataFrame = field(default_factory=pd.DataFrame)  # measured on the run's machine (rlperf/peaks.py)

    @property
    def suite(self) -> str:
        return self.info["suite"]

    @property
    def commit(self) -> str:
        commit = (self.info.get("git_commit") or "unknown")[:10]
        return commit + ("+dirty" if self.info.get("git_dirty") else "")


def load(spec: str, field: str = "results") -> RunData:
    """The run a RESULTS argument (`PATH` or `PATH::RUN_ID`) names; the store's latest run by default."""
    try:
        store, run_id = open_results(spec)
    except BadInput as exc:
        raise BadInput(f"{field}: {exc}") from None
    return load_run(store, run_id, field)


def load_run(store: Store, run_id: str, field: str = "results") -> RunData:
    info = store.runs().set_index("run_id").loc[run_id].to_dict()
    points = store.points(run_id)
    collectives = store.collectives(run_id)
    if points.empty and collectives.empty and info["status"] == "running":
        raise BadInput(f"{field}: run {run_id} in {store.path} is still running and has no point stored yet; "
                       "report it once it has finished")
    if points.empty and collectives.empty:
        raise BadInput(f"{field}: run {run_id} in {store.path} is empty (no points were measured)")
    return RunData(str(store.path), run_id, info, store.fingerprint(run_id), points, store.samples(run_id),
                   store.utilization(run_id), collectives, store.traces(run_id), store.peaks(info["machine_key"]))


def point_table(run: RunData, threshold: float = DEFAULT_THRESHOLD, alpha: float = DEFAULT_ALPHA) -> pd.DataFrame:
    return summarize_points(run.points, run.samples, threshold, alpha)


def summarize_points(points: pd.DataFrame, samples: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD,
                     alpha: float = DEFAULT_ALPHA) -> pd.DataFrame:
    """One row per point, in the order of `points`: status, SPS median and spread over repeats, contended
    repeats, the smallest slowdown the repeats would catch when every point of the run is judged with it
    (`detects`), and each phase's share of steady time
    (`share.PHASE`; `share.other`, what no phase claimed in another trainer's run, 0 in the reference trainer's),
    and the bytes copied host->device per agent step and per second (`h2d_bytes_per_step`,
    `h2d_mb_per_s`; NaN for runs from before the trainer reported them), and the largest peak memory over the
    repeats (`host_peak_rss_bytes`, `device_peak_allocated_bytes`, `device_peak_reserved_bytes`; NaN where not
    measured). The bench's table and every report read this one summary."""
    rows = []
    for point in points.itertuples():
        mine = samples[samples["point_key"] == point.point_key]
        sps = mine["sps"].to_numpy(dtype=float)
        summaries = list(mine["summary"])
        contended, detects = detectable_alone(mine, threshold, alpha, family=len(points)) if len(sps) \
            else (0, np.nan)
        median = float(np.median(sps)) if len(sps) else np.nan
        steady = sum(summary.steady_seconds for summary in summaries)
        h2d = _median_or_nan(pd.Series([summary.h2d_bytes_per_step for summary in summaries], dtype=object))
        rows.append({
            "point_key": point.point_key,
            "label": point_label(point.point_key),
            "status": point.status,
            "reason": point.reason or "",
            "repeats": len(mine),
            "sps_repeats": list(sps),
            "sps_median": median,
            "sps_min": float(sps.min()) if len(sps) else np.nan,
            "sps_max": float(sps.max()) if len(sps) else np.nan,
            "spread": (sps.max() - sps.min()) / median if len(sps) and median else np.nan,
            "sps_end_to_end": float(mine["sps_end_to_end"].median()) if len(sps) else np.nan,
            "warmup_seconds": float(mine["warmup_seconds"].median()) if len(sps) else np.nan,
            "mean_episode_return": _median_or_nan(mine["mean_episode_return"]),
            "device": (summaries[0].device_name or point.config.get("device", "")) if summaries else "",
            "dtype_used": (summaries[0].dtype_used or "") if summaries else "",
            "contended": contended,
            "detects": detects,
            "h2d_bytes_per_step": h2d,
            "h2d_mb_per_s": h2d * median / 1e6,
            **{key: _max_or_nan(pd.Series([(summary.memory or {}).get(key) for summary in summaries], dtype=object))
               for key in (HOST_KEY, *DEVICE_KEYS)},
            **{f"share.{phase}": sum(p.get(phase, 0.0) for p in mine["phases"]) / steady if steady else np.nan
               for phase in (*EVERY_PHASE, OTHER)},
        })
    return pd.DataFrame(rows)


def _max_or_nan(values: pd.Series) -> float:
    values = pd.to_numeric(values, errors="coerce").dropna()
    return float(values.max()) if len(values) else np.nan


def _median_or_nan(values: pd.Series) -> float:
    values = pd.to_numeric(values, errors="coerce").dropna()
    return float(values.median()) if len(values) else np.nan


def phase_us_per_step(run: RunData) -> pd.DataFrame:
    """Microseconds per agent step in each phase (median over repeats); index: point label."""
    rows = {}
    for point_key, samples in run.samples.groupby("point_key", sort=False):
        per_repeat = pd.DataFrame([{phase: seconds / row.summary.steady_steps * 1e6
                                    for phase, seconds in row.phases.items()}
                                   for row in samples.itertuples()])
        rows[point_label(point_key)] = per_repeat.median()
    table = pd.DataFrame(rows).T
    ordered = [phase for phase in EVERY_PHASE if phase in table.columns]
    return table[ordered + [c for c in table.columns if c not in ordered]]


def env_overlap_per_step(run: RunData) -> pd.DataFrame:
    """Per point, microseconds per agent step (median over repeats) of the env's own time (`env`), the
    trainer's time spent on it (`waited`), the policy's time (`policy`) and the whole steady step (`step`),
    from the summaries' `env_overlap`, with the point's `env_groups`, and the seconds of the envs' start-up
    (`start`) and of their building within it (`build`); NaN where it was not measured (runs stored before the
    fields, envs stepped on the device, `policy` without timers). Index: point label."""
    rows = {}
    for point_key, samples in run.samples.groupby("point_key", sort=False):
        per_repeat = []
        for summary in samples["summary"]:
            overlap = summary.env_overlap or {}
            per_step = 1e6 / summary.steady_steps
            seconds = [overlap.get(key) for key in ("env_busy_seconds", "env_wait_seconds", "policy_seconds")]
            per_repeat.append([np.nan if s is None else s * per_step for s in seconds]
                              + [summary.steady_seconds * per_step]
                              + [np.nan if getattr(summary, key) is None else getattr(summary, key)
                                 for key in ("env_start_seconds", "env_build_seconds")])
        medians = pd.DataFrame(per_repeat, columns=["env", "waited", "policy", "step", "start", "build"]).median()
        first = samples["summary"].iloc[0]
        rows[point_label(point_key)] = {**medians, "env_groups": first.config.get("env_groups", 1),
                                        "reference": first.writer == "reference"}
    return pd.DataFrame(rows).T


def reference_point(point_key: str, candidates: list[str]) -> str | None:
    """The point that sets the fewest of this point's swept values, and nothing else: for a knob swept on
    its own, the plain baseline at the same batch size."""
    values = json.loads(point_key)

    def sets_less(key: str) -> bool:
        other = json.loads(key)
        return len(other) < len(values) and all(name in values and values[name] == v for name, v in other.items())

    return min(filter(sets_less, candidates), key=lambda key: len(json.loads(key)), default=None)


def knob_pairs(run: RunData) -> Iterator[tuple[str, str, pd.DataFrame, pd.DataFrame]]:
    """Each measured point that has a reference point in the run: (the label of the values it adds, the
    reference's key, its samples, the reference's samples)."""
    ok = run.points[run.points["status"] == "ok"]
    measured = [key for key in ok["point_key"] if (run.samples["point_key"] == key).any()]
    for point_key in measured:
        reference = reference_point(point_key, measured)
        if reference is not None:
            added = {k: v for k, v in json.loads(point_key).items() if k not in json.loads(reference)}
            yield (point_label(json.dumps(added)), reference, run.samples[run.samples["point_key"] == point_key],
                   run.samples[run.samples["point_key"] == reference])


def swept_axes(run: RunData) -> dict[str, list]:
    """Each axis that takes more than one value across the run's points, with its values."""
    values: dict[str, list] = {}
    for point_key in run.points["point_key"]:
        for name, value in json.loads(point_key).items():
            values.setdefault(name, [])
            if value not in values[name]:
                values[name].append(value)
    return {name: vals for name, vals in values.items() if len(vals) > 1}
