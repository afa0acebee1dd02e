"""How far each phase is from the machine's limits: its achieved rate against the peaks measured on the
machine, a roofline per point, and a short reading of what bounds each phase and which knob to try next.

Work per agent step comes from the trainer's summary (`work`, counted from the policy's shapes by
reference_trainer/work.py) and peaks from the store's `peaks` table (rlperf/peaks.py), for the run's machine.
A model phase's ceiling is the lower of two: its kernels' time at their measured rates at the model's own
shapes (as if nothing else took time), and memory bandwidth times its arithmetic intensity (FLOPs over the
least bytes it must move). Both are upper bounds on what the phase can reach, so achieved over ceiling is
at most 100% unless counts or peaks are wrong; such a ratio is named as a bug, never shown as a success.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from reference_trainer.config import BUILTIN_ENVS
from reports import figures
from reports.formatting import fmt_method, fmt_peak, fmt_rate, fmt_rate_range, fmt_sps
from reports.page import Section
from decisions.rundata import RunData
from rlperf import peaks as peak_rows
from rlperf.peaks import Peaks
from rlperf.store import point_label
from rlperf.summary import GRAPH_PHASES, RunSummary

MODEL_PHASES = ("eval_forward", "train_forward", "learn")
# At this share of its ceiling or more a phase is near it; below it, most of its time is spent outside its
# kernels. A ceiling at model shapes under SMALL_SHAPES of the roof means the shapes, not the code, limit it.
NEAR_CEILING = 0.6
SMALL_SHAPES = 0.5
HOST_PHASES = {"env": "stepping the environments", "eval_copy": "copying observations in",
               "eval_misc": "rollout bookkeeping", "train_misc": "advantages and minibatch gathering",
               "log": "the epoch's one statistics read"}


@dataclass
class PhaseFigures:
    """One model phase of one point, per agent step of one rank (medians over repeats)."""

    phase: str
    flops: float
    min_bytes: float
    seconds: float
    calls: float
    kernel_seconds: float  # the phase's kernels at their measured rates; NaN when one is unmeasured
    bandwidth: float
    roof: float

    @property
    def achieved(self) -> float:
        return self.flops / self.seconds if self.seconds > 0 else math.nan

    @property
    def intensity(self) -> float:
        return self.flops / self.min_bytes

    @property
    def shape_ceiling(self) -> float:
        return self.flops / self.kernel_seconds

    @property
    def memory_ceiling(self) -> float:
        return self.bandwidth * self.intensity

    @property
    def ceiling(self) -> float:
        """The kernels' ceiling, lowered by memory bandwidth where that binds; NaN while a kernel's rate is
        unmeasured."""
        if not np.isfinite(self.shape_ceiling):
            return math.nan
        return float(np.fmin(self.shape_ceiling, self.memory_ceiling))

    @property
    def memory_bound(self) -> bool:
        return self.memory_ceiling < self.shape_ceiling

    @property
    def of_ceiling(self) -> float:
        return self.achieved / self.ceiling

    @property
    def of_roof(self) -> float:
        return self.achieved / self.roof

    @property
    def outside_per_call(self) -> float:
        """Seconds per call spent outside the phase's kernels (at their measured rates)."""
        return (self.seconds - self.kernel_seconds) / self.calls


@dataclass
class PointRoofline:
    label: str
    config: dict
    device_name: str
    threads: int
    dtype: str
    roof: float
    fp32_roof: float
    bandwidth: float
    op_seconds: float  # one tiny op (dispatch or launch)
    step_seconds: float
    shares: dict[str, float]
    phases: list[PhaseFigures]
    copy_rate: float
    copy_ceiling: float
    env_rate: float
    env_cores: int | None  # cores the environments step on, where known (in-process envs: one)
    busy_peaks: int  # the peaks read here only ever measured beside other work
    reading: list[str] = field(default_factory=list)

    @property
    def model_rate(self) -> float:
        """Model FLOP/s over the whole step: every phase's time, the counted work of the model phases."""
        return sum(p.flops for p in self.phases) / self.step_seconds

    @property
    def of_roof(self) -> float:
        return self.model_rate / self.roof

    def over_ceiling(self) -> list[tuple[str, float]]:
        """Every ratio above 100%: counts or peaks are wrong (module docstring)."""
        ratios = [(f"{p.phase} of its ceiling", p.of_ceiling) for p in self.phases]
        ratios += [(f"{p.phase} of the matrix-product peak", p.of_roof) for p in self.phases]
        ratios.append(("host->device copy of its peak", self.copy_rate / self.copy_ceiling))
        return [(what, ratio) for what, ratio in ratios if ratio > peak_rows.CEILING_TOLERANCE]


def analyze(run: RunData) -> tuple[dict[str, PointRoofline], list[str]]:
    """Each measured point's figures, by point key, and notes on what could not be read (no counts, no peaks)."""
    known = Peaks(run.peaks)
    result, without_work, without_peaks, commands, whole_calls = {}, [], set(), [], []
    for point in run.points[run.points["status"] == "ok"].itertuples():
        samples = run.samples[run.samples["point_key"] == point.point_key]
        if samples.empty:
            continue
        summaries = [s for s in samples["summary"] if s.work]
        if any(set(s.phases) & set(GRAPH_PHASES) for s in summaries):
            whole_calls.append(point_label(point.point_key))
            continue
        if not summaries:
            if samples["summary"].iloc[0].writer != "reference":
                commands.append(point_label(point.point_key))
            else:
                without_work.append(point_label(point.point_key))
            continue
        figure = point_figures(point_label(point.point_key), summaries, known)
        if not np.isfinite(figure.roof):
            without_peaks.add(figure.device_name if figure.device_name != "cpu" else f"cpu, {figure.threads} threads")
            continue
        figure.reading = reading(figure)
        result[point.point_key] = figure
    notes = []
    if commands:
        notes.append(f"No roofline for {', '.join(commands)}: a command's trainer records no work counts (the "
                     "roofline needs the policy's shapes, which only the reference trainer's summary carries), so "
                     "its phases are shown without a ceiling.")
    if whole_calls:
        notes.append(f"No roofline for {', '.join(whole_calls)}: a whole rollout or update (graph_scope) is one "
                     "call, whose time no timer splits between the model phases a ceiling is set for; the phase "
                     "breakdown shows where each call's time goes.")
    if without_work:
        notes.append(f"No work counts for {', '.join(without_work)}: the trainer that ran them did not record "
                     "`work` in its summary.")
    if without_peaks:
        notes.append(f"No peaks stored for this machine ({'; '.join(sorted(without_peaks))}, machine key "
                     f"{run.info['machine_key']}): on that machine, `rlperf probe --store {run.store_path}` "
                     "measures them.")
    return result, notes


def point_figures(label: str, summaries: list[RunSummary], known: Peaks) -> PointRoofline:
    first = summaries[0]
    work, config = first.work, first.config
    device_name, threads, dtype = first.device_name, work["threads"], work["dtype"]
    per_step = pd.DataFrame([{phase: seconds / (s.steady_steps / s.world_size)
                              for phase, seconds in s.phases.items()} for s in summaries]).median()
    bandwidth = known.value(device_name, threads, peak_rows.MEMORY)
    roof = known.matmul_peak(device_name, threads, dtype)
    phases = []
    for phase in MODEL_PHASES:
        counted = work["phases"][phase]
        phases.append(PhaseFigures(phase, counted["flops"], counted["min_bytes"], float(per_step.get(phase, math.nan)),
                                   counted["calls"],
                                   known.kernel_seconds(device_name, threads, dtype, counted["kernels"]),
                                   bandwidth, roof))
    if device_name == "cpu":
        copy_ceiling = bandwidth / 2  # a memory copy reads and writes each byte it copies
    else:
        copy_ceiling = known.value(device_name, threads, "h2d_pinned" if config.get("pinned") else "h2d_pageable")
    step = float(per_step.sum())
    return PointRoofline(
        label=label, config=config, device_name=device_name, threads=threads, dtype=dtype, roof=roof,
        fp32_roof=known.matmul_peak(device_name, threads, "float32"), bandwidth=bandwidth,
        op_seconds=1 / known.value(device_name, threads, peak_rows.DISPATCH), step_seconds=step,
        shares={phase: seconds / step for phase, seconds in per_step.items()}, phases=phases,
        copy_rate=(math.nan if first.h2d_bytes_per_step is None else first.h2d_bytes_per_step)
        / per_step.get("eval_copy", math.nan),
        copy_ceiling=copy_ceiling, env_rate=1 / per_step.get("env", math.nan),
        env_cores=1 if config["env"] in BUILTIN_ENVS or config.get("vectorization") == "sync" else None,
        busy_peaks=known.unsettled(device_name, threads),
    )


def reading(point: PointRoofline) -> list[str]:
    """A few sentences: which phases are near a ceiling, which spend their time outside their kernels (on
    elementwise work and per-op costs) or on the host, and the knob the numbers point to."""
    overhead = ("elementwise kernels, launches and Python" if point.device_name != "cpu"
                else "elementwise ops, Python and per-op dispatch")
    lines = []
    over = point.over_ceiling()
    if over:
        why = (f" {point.busy_peaks} of these peaks were only measured while other processes were busy: measure them "
               "again on a quiet machine (`rlperf probe --store`)." if point.busy_peaks else
               " On a shared host a slow moment reads peaks low unseen: `rlperf probe --store` measures them again "
               "and the fastest is kept, so a ratio still above 100% after it is a wrong count.")
        lines.append("BUG: " + ", ".join(f"{what} reads {ratio:.0%}" for what, ratio in over)
                     + ", above what the measured peaks allow: the counted work or the peaks are wrong." + why)
    for p in point.phases:
        figures_text = f"{p.of_ceiling:.0%} of its ceiling, {p.of_roof:.0%} of the peak"
        if any(what.startswith(p.phase) for what, _ in over):
            continue
        if not np.isfinite(p.of_ceiling):
            lines.append(f"{p.phase}: {p.of_roof:.0%} of the peak (its kernels' rates are not measured).")
        elif p.of_ceiling >= NEAR_CEILING:
            limit = "memory bandwidth" if p.memory_bound else "its kernels at these shapes"
            lines.append(f"{p.phase} is near its ceiling, set by {limit} ({figures_text}).")
        else:
            ops = p.outside_per_call / point.op_seconds
            cost = f", as long as {ops:,.0f} tiny ops" if np.isfinite(ops) else ""
            lines.append(f"{p.phase} spends {1 - p.kernel_seconds / p.seconds:.0%} of its time outside its matrix "
                         f"products ({figures_text}): {p.outside_per_call * 1e6:,.0f} µs per call go to {overhead}"
                         f"{cost}.")
    host = sum(share for phase, share in point.shares.items() if phase in HOST_PHASES)
    per_core = " on one core" if point.env_cores == 1 else ""
    lines.append(f"Host phases take {host:.0%} of the step; the environments step {fmt_sps(point.env_rate)} agent "
                 f"steps per second of env time{per_core}.")
    lines.append("Next: " + next_knob(point))
    return lines


def next_knob(point: PointRoofline) -> str:
    """The knob the largest phase of the step points to."""
    cfg, cuda = point.config, point.device_name != "cpu"
    phase, share = max(point.shares.items(), key=lambda item: item[1])
    lead = f"{phase} takes {share:.0%} of the step: "
    if phase == "env":
        return lead + ("a faster environment; --env-groups overlaps its steps with the GPU's work." if cuda
                       else "a faster environment (the trainer waits on it).")
    if phase == "eval_copy":
        if cuda and not cfg.get("pinned"):
            return lead + "--pinned --non-blocking (page-locked, asynchronous copies)."
        if cuda and not cfg.get("copy_stream"):
            return lead + "--copy-stream, to overlap the copies with compute."
        return lead + "fewer bytes per step (uint8 observations stay bytes until the device)."
    if phase in HOST_PHASES:
        return lead + f"{HOST_PHASES[phase]} costs about the same per step whatever the batch: more environments " \
                      "(--num-envs) spread it over more agent steps."
    figures_of = next(p for p in point.phases if p.phase == phase)
    if point.dtype != "float32" and point.roof < point.fp32_roof:
        return lead + (f"--dtype fp32: this device's {point.dtype} products peak at {fmt_rate(point.roof, 'FLOP/s')}, "
                       f"its float32 ones at {fmt_rate(point.fp32_roof, 'FLOP/s')}.")
    bigger = "--num-envs" if phase == "eval_forward" else "--minibatch-size"
    if not np.isfinite(figures_of.of_ceiling) or figures_of.of_ceiling < NEAR_CEILING:
        if cuda and not cfg.get("cuda_graphs"):
            return lead + "--cuda-graphs, which removes the launches between its kernels."
        if not cfg.get("compile"):
            return lead + "--compile, which fuses the small ops between its kernels."
        return lead + f"a larger batch ({bigger}), to spread the per-call cost over more agent steps."
    if figures_of.shape_ceiling < SMALL_SHAPES * figures_of.roof:
        return lead + (f"a larger batch ({bigger}): at these shapes its kernels reach at most "
                       f"{figures_of.shape_ceiling / figures_of.roof:.0%} of the peak.")
    return lead + "it is near the peak: only less work per step helps (--hidden-size, --update-epochs)."


# ---- report sections -------------------------------------------------------------------------------------------

EXPLAINED = (
    "Peaks are measured on this machine (`rlperf probe`, and every sweep for the shapes its points used): each "
    "the fastest of repeated timings after a warm-up, and of every measurement stored (other work only ever "
    "slows one). The matrix-product peak is the fastest square product measured (or the model's own, if "
    "faster); memory bandwidth counts a large copy's reads and writes. "
    "Work per agent step is counted from the policy's shapes (checked against torch's FlopCounterMode): "
    "matrix products and convolutions, two FLOPs per multiply-add. A model phase's ceiling is the lower of "
    "its kernels' time at their own measured rates and shapes, and memory bandwidth times its arithmetic "
    "intensity (FLOPs over the least bytes it must read and write, intermediates not counted). 'Outside its "
    "kernels' is the phase's time per call less its kernels' time: Python, per-op dispatch or launches, and "
    f"the small ops between the products. Near a ceiling: {NEAR_CEILING:.0%} of it or more.")


def section(run: RunData) -> Section | None:
    """The run report's roofline section; None for a run without points."""
    if run.points.empty:
        return None
    found, notes = analyze(run)
    title = "How far from the machine's limits"
    if not found:
        return Section(title, notes or ["No point was measured."])
    text = [EXPLAINED, *notes]
    return Section(title, text, [peaks_table(run, found.values()), phase_table(found.values()),
                                 reading_table(found.values())],
                   [roofline_figure(point) for point in found.values()], side_by_side=True)


def peaks_table(run: RunData, points) -> pd.DataFrame:
    """The roofs each device the points ran on was held against, and how each was measured."""
    known = Peaks(run.peaks)
    rows = []
    for device_name, threads in dict.fromkeys((point.device_name, point.threads) for point in points):
        where = f"cpu, {threads} threads" if device_name == "cpu" else device_name
        measured = known.of_device(device_name, threads)
        for row in measured:
            if row["op"] in peak_rows.KERNELS:
                continue
            rows.append({"device": where, "peak": fmt_peak(row), "dtype": row["dtype"] or "–",
                         "rate": fmt_rate(row["value"], row["unit"]),
                         "timings (min – max)": fmt_rate_range(row["samples"], row["unit"]),
                         "how": fmt_method(row["method"]), "measured": row["measured_at"],
                         "busy": (row["method"].get("interference") or {}).get("why") or "–"})
            used = known.matmul_peak(device_name, threads, row["dtype"])
            if row["op"] == peak_rows.ROOF and used > row["value"]:
                rows.append({**rows[-1], "peak": "the peak the ratios use: one of the model's kernels, faster",
                             "rate": fmt_rate(used, "FLOP/s"), "timings (min – max)": "–", "how": "–"})
        kernels = sum(row["op"] in peak_rows.KERNELS for row in measured)
        rows.append({"device": where, "peak": f"{kernels} kernels at the model's shapes", "dtype": "–",
                     "rate": "–", "timings (min – max)": "–", "how": "the same way, timed in rounds",
                     "measured": "–", "busy": "–"})
    return pd.DataFrame(rows)


def phase_table(points) -> pd.DataFrame:
    rows = []
    for point in points:
        for p in point.phases:
            rows.append({"point": point.label, "phase": p.phase, "share of step": f"{point.shares.get(p.phase, 0):.0%}",
                         "achieved": fmt_rate(p.achieved, "FLOP/s"), "ceiling": fmt_rate(p.ceiling, "FLOP/s"),
                         "of ceiling": fmt_percent(p.of_ceiling), "of matrix peak": fmt_percent(p.of_roof),
                         "bound by": "memory" if p.memory_bound else "kernel shapes",
                         "FLOP/byte": f"{p.intensity:.3g}",
                         "outside kernels per call": f"{p.outside_per_call * 1e6:,.1f} µs"
                         if np.isfinite(p.outside_per_call) else "–"})
        rows.append({"point": point.label, "phase": "eval_copy", "share of step":
                     f"{point.shares.get('eval_copy', 0):.0%}", "achieved": fmt_rate(point.copy_rate, "B/s"),
                     "ceiling": fmt_rate(point.copy_ceiling, "B/s"),
                     "of ceiling": fmt_percent(point.copy_rate / point.copy_ceiling), "of matrix peak": "–",
                     "bound by": "copy bandwidth", "FLOP/byte": "–", "outside kernels per call": "–"})
        rows.append({"point": point.label, "phase": "whole step", "share of step": "100%",
                     "achieved": fmt_rate(point.model_rate, "FLOP/s"), "ceiling": "–", "of ceiling": "–",
                     "of matrix peak": fmt_percent(point.of_roof), "bound by": "–", "FLOP/byte": "–",
                     "outside kernels per call": "–"})
    return pd.DataFrame(rows)


def reading_table(points) -> pd.DataFrame:
    return pd.DataFrame([{"point": point.label, "reading": " ".join(point.reading)} for point in points])


def fmt_percent(ratio: float) -> str:
    if not np.isfinite(ratio):
        return "–"
    return f"{ratio:.1%}" + (" (above: a bug)" if ratio > peak_rows.CEILING_TOLERANCE else "")


def roofline_figure(point: PointRoofline, title: str | None = None) -> str:
    roofs = {f"{point.dtype} matrix peak": point.roof}
    if point.dtype != "float32" and np.isfinite(point.fp32_roof):
        roofs["float32 matrix peak"] = point.fp32_roof
    frame = pd.DataFrame([{"phase": p.phase, "intensity": p.intensity, "achieved": p.achieved, "ceiling": p.ceiling}
                          for p in point.phases])
    return figures.roofline(title or point.label, roofs, point.bandwidth, frame)


def comparison_section(matched: list[tuple[dict, dict]], runs: dict[str, RunData], labels: dict[str, str]) -> Section:
    """Each machine's figures for the configurations both measured: how much faster, and how near each
    machine's own peaks."""
    a, b = labels["A"], labels["B"]
    found = {side: analyze(runs[side]) for side in ("A", "B")}
    text, rows, svgs = [EXPLAINED], [], []
    for side, label in (("A", a), ("B", b)):
        text += [f"{label}: {note}" for note in found[side][1]]
    for left, right in matched:
        pa, pb = found["A"][0].get(left["point_key"]), found["B"][0].get(right["point_key"])
        if pa is None or pb is None:
            continue
        text.append(f"{pa.label}: {b} runs {right['sps'] / left['sps']:.2f}× as fast as {a}; over the whole step "
                    f"{a}'s model FLOP/s reach {fmt_percent(pa.of_roof)} of its {pa.dtype} matrix-product peak "
                    f"({fmt_rate(pa.model_rate, 'FLOP/s')} of {fmt_rate(pa.roof, 'FLOP/s')}), {b}'s "
                    f"{fmt_percent(pb.of_roof)} ({fmt_rate(pb.model_rate, 'FLOP/s')} of "
                    f"{fmt_rate(pb.roof, 'FLOP/s')}).")
        for phase_a, phase_b in zip(pa.phases, pb.phases):
            rows.append({"point": pa.label, "phase": phase_a.phase,
                         f"achieved {a}": fmt_rate(phase_a.achieved, "FLOP/s"),
                         f"achieved {b}": fmt_rate(phase_b.achieved, "FLOP/s"),
                         f"of ceiling {a}": fmt_percent(phase_a.of_ceiling),
                         f"of ceiling {b}": fmt_percent(phase_b.of_ceiling),
                         f"of matrix peak {a}": fmt_percent(phase_a.of_roof),
                         f"of matrix peak {b}": fmt_percent(phase_b.of_roof)})
        for side_point, label in ((pa, a), (pb, b)):
            text.append(f"{label}, {side_point.label}: {' '.join(side_point.reading)}")
            svgs.append(roofline_figure(side_point, f"{label}: {side_point.label}"))
    if not rows:
        text.append("No configuration measured on both machines has work counts and peaks on both.")
    return Section("How far from each machine's limits", text, [pd.DataFrame(rows)] if rows else [], svgs,
                   side_by_side=True)
