"""Figures as inline SVG text, drawn with matplotlib's object API (no pyplot state, no display needed).

Text from results (point labels, config values) is drawn with math parsing off, so a `$` in a value is
just a dollar sign, and the SVG writer escapes it as XML text.
"""

from __future__ import annotations

import io
import re

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.figure import Figure

STYLE = {
    "text.parse_math": False,
    "svg.fonttype": "none",
    "svg.hashsalt": "rlperf",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.titleweight": "bold",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e3e6ea",
    "grid.linewidth": 0.8,
    "axes.axisbelow": True,
    "axes.edgecolor": "#9aa3ad",
    "legend.frameon": False,
    "legend.fontsize": 8,
}
PALETTE = ["#3b6fb6", "#e08a2c", "#3f9e5a", "#c8423b", "#8a63b8", "#8c6d4f", "#d16aa8", "#7a7f87",
           "#b5b539", "#2fb3c4"]
PHASE_COLORS = {
    "env": "#7a7f87", "eval_copy": "#9ec1e8", "eval_forward": "#3b6fb6", "eval_misc": "#c7d3e3",
    "train_misc": "#f3d3a8", "train_forward": "#e08a2c", "learn": "#a85a12", "log": "#d9c8e6",
}
REGRESSED_COLOR = "#c8423b"
IMPROVED_COLOR = "#3f9e5a"
_XML_PROLOG = re.compile(r"^.*?(?=<svg)", re.S)
_FIXED_SIZE = re.compile(r'(<svg[^>]*?)\s(width|height)="[^"]*"')


def to_svg(figure: Figure) -> str:
    """The figure as an <svg> element that scales to its container."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    text = _XML_PROLOG.sub("", buffer.getvalue(), count=1)
    for _ in range(2):
        text = _FIXED_SIZE.sub(r"\1", text, count=1)
    return text.strip()


def _new(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), layout="constrained")


def _short(label: str, limit: int = 48) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def sps_per_point(points: pd.DataFrame) -> str:
    """Median SPS per point as a bar, every repeat as a dot, the min-max spread as a whisker.
    `points`: label, sps_median, sps_min, sps_max, sps_repeats (list)."""
    with rc_context(STYLE):
        figure = _new(8, 0.9 + 0.32 * len(points))
        ax = figure.add_subplot()
        y = np.arange(len(points))[::-1]
        ax.barh(y, points["sps_median"], color="#c7d3e3", height=0.6, label="median")
        ax.errorbar(points["sps_median"], y, xerr=[points["sps_median"] - points["sps_min"],
                                                  points["sps_max"] - points["sps_median"]],
                    fmt="none", ecolor="#33414f", elinewidth=1, capsize=3, label="min–max")
        for row_y, repeats in zip(y, points["sps_repeats"]):
            ax.plot(repeats, [row_y] * len(repeats), "o", ms=3.5, color=PALETTE[0], alpha=0.8)
        ax.set_yticks(y, [_short(label) for label in points["label"]])
        ax.set_xlabel("agent steps per second (steady)")
        ax.set_title("SPS per point: median bar, repeats as dots, min–max whisker")
        ax.grid(axis="y", visible=False)
        ax.set_xlim(left=0)
        return to_svg(figure)


def phase_breakdown(per_step_us: pd.DataFrame) -> str:
    """Stacked horizontal bars of microseconds per agent step, one bar per point (index: label)."""
    with rc_context(STYLE):
        figure = _new(8, 1.3 + 0.32 * len(per_step_us))
        ax = figure.add_subplot()
        y = np.arange(len(per_step_us))[::-1]
        left = np.zeros(len(per_step_us))
        for phase in per_step_us.columns:
            values = per_step_us[phase].fillna(0.0).to_numpy()
            ax.barh(y, values, left=left, height=0.6, label=phase, color=PHASE_COLORS.get(phase, "#bbbbbb"),
                    edgecolor="white", linewidth=0.5)
            left += values
        ax.set_yticks(y, [_short(label) for label in per_step_us.index])
        ax.set_xlabel("microseconds per agent step (steady epochs, median of repeats)")
        ax.set_title("Where a step's time goes, per phase")
        ax.grid(axis="y", visible=False)
        ax.legend(ncols=min(4, len(per_step_us.columns)), loc="upper center", bbox_to_anchor=(0.5, -0.18 -
                  0.4 / max(1, len(per_step_us))))
        return to_svg(figure)


def sps_along_axis(axis: str, lines: dict[str, pd.DataFrame]) -> str:
    """SPS against one swept axis; `lines` maps a label of the other axes' values to (x, sps) rows."""
    with rc_context(STYLE):
        figure = _new(5.2, 3.2)
        ax = figure.add_subplot()
        numeric = all(pd.api.types.is_numeric_dtype(frame["x"]) and not pd.api.types.is_bool_dtype(frame["x"])
                      for frame in lines.values())
        categories = sorted({str(x) for frame in lines.values() for x in frame["x"]})
        for index, (label, frame) in enumerate(lines.items()):
            x = frame["x"] if numeric else [categories.index(str(v)) for v in frame["x"]]
            ax.plot(x, frame["sps"], "o-", color=PALETTE[index % len(PALETTE)], label=_short(label, 40), ms=4)
        if numeric and all(frame["x"].min() > 0 for frame in lines.values()):
            values = {x for frame in lines.values() for x in frame["x"]}
            if len(values) > 2 and max(values) / min(values) >= 8:
                ax.set_xscale("log", base=2)
                ax.set_xticks(sorted(values), [f"{v:g}" for v in sorted(values)])
                ax.minorticks_off()
        if not numeric:
            ax.set_xticks(range(len(categories)), categories)
            ax.margins(x=0.15)
        elif ax.get_xscale() == "linear":
            values = sorted({x for frame in lines.values() for x in frame["x"]})
            if len(values) <= 8:
                ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.set_xlabel(axis)
        ax.set_ylabel("agent steps per second")
        ax.set_ylim(bottom=0)
        ax.set_title(f"SPS against {axis}")
        if len(lines) > 1 or next(iter(lines)) != "":
            ax.legend(loc="best")
        return to_svg(figure)


def memory_against_envs(lines: dict[str, pd.DataFrame], what: str) -> str:
    """Peak memory against num_envs; `lines` maps a label of the other axes' values to (num_envs, bytes) rows,
    `what` names the figure drawn (device reserved, host RSS)."""
    with rc_context(STYLE):
        figure = _new(5.2, 3.2)
        ax = figure.add_subplot()
        for index, (label, frame) in enumerate(lines.items()):
            ax.plot(frame["num_envs"], frame["bytes"] / 2 ** 20, "o-", color=PALETTE[index % len(PALETTE)],
                    label=_short(label, 40) or "measured", ms=4)
        values = sorted({n for frame in lines.values() for n in frame["num_envs"]})
        if len(values) > 2 and values[0] > 0 and values[-1] / values[0] >= 8:
            ax.set_xscale("log", base=2)
            ax.minorticks_off()
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.set_xlabel("num_envs")
        ax.set_ylabel(f"peak {what} (MiB)")
        ax.set_ylim(0, 1.1 * max(frame["bytes"].max() for frame in lines.values()) / 2 ** 20)
        ax.set_title(f"Peak {what} against num_envs")
        if len(lines) > 1 or next(iter(lines)) != "":
            ax.legend(loc="best")
        return to_svg(figure)


def scaling(lines: dict[str, pd.DataFrame]) -> str:
    """Aggregate SPS against world size with the ideal line from one rank; `lines`: world_size, sps."""
    with rc_context(STYLE):
        figure = _new(5.2, 3.2)
        ax = figure.add_subplot()
        for index, (label, frame) in enumerate(lines.items()):
            color = PALETTE[index % len(PALETTE)]
            ax.plot(frame["world_size"], frame["sps"], "o-", color=color, label=_short(label, 40) or "measured")
            one_rank = frame.loc[frame["world_size"] == 1, "sps"]
            if not one_rank.empty:
                ax.plot(frame["world_size"], frame["world_size"] * one_rank.iloc[0], ":", color=color, alpha=0.7)
        ax.set_xticks(sorted({n for frame in lines.values() for n in frame["world_size"]}))
        ax.set_xlabel("world size (ranks)")
        ax.set_ylabel("aggregate agent steps per second")
        ax.set_ylim(bottom=0)
        ax.set_title("SPS against world size (dotted: ideal)")
        ax.legend(loc="best")
        return to_svg(figure)


def utilization(series: pd.DataFrame, metrics: list[str]) -> str:
    """One panel per metric; one line per point and source. `series`: label, source, metric, t_s, value."""
    with rc_context(STYLE):
        figure = _new(8, 2.0 * len(metrics) + 0.6)
        axes = figure.subplots(len(metrics), 1, squeeze=False, sharex=True)[:, 0]
        labels = list(dict.fromkeys(series["label"]))
        for ax, metric in zip(axes, metrics):
            for (label, source), frame in series[series["metric"] == metric].groupby(["label", "source"], sort=False):
                color = PALETTE[labels.index(label) % len(PALETTE)]
                ax.plot(frame["t_s"], frame["value"], color=color, lw=1.2,
                        label=_short(f"{label} · {source}", 60))
            ax.set_ylabel(metric, fontsize=8)
            ax.set_ylim(bottom=0)
        axes[0].set_title("Utilization over time (first repeat of each point)")
        axes[-1].set_xlabel("seconds since the point started")
        axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
        return to_svg(figure)


def collectives(rows: pd.DataFrame) -> str:
    """Bus bandwidth against message size, one line per (op, backend, world size)."""
    with rc_context(STYLE):
        figure = _new(5.2, 3.2)
        ax = figure.add_subplot()
        groups = rows.groupby(["op", "backend", "world_size"], sort=True)
        for index, ((op, backend, world_size), frame) in enumerate(groups):
            best = frame.groupby("bytes")["busbw_gbps"].median()
            ax.plot(best.index, best.values, "o-", ms=3.5, color=PALETTE[index % len(PALETTE)],
                    label=f"{op} ({backend}, {world_size} ranks)")
        ax.set_xscale("log", base=2)
        sizes = sorted(rows["bytes"].unique())
        step = max(1, len(sizes) // 8)
        ax.set_xticks(sizes[::step], [_bytes(size) for size in sizes[::step]])
        ax.minorticks_off()
        ax.set_xlabel("message size")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_ylim(bottom=0)
        ax.set_title("Collectives: bus bandwidth against message size")
        ax.legend(loc="best")
        return to_svg(figure)


def _bytes(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:g} {unit}"
        size /= 1024
    return f"{size:g} TiB"


def history(trend: pd.DataFrame, levels: pd.DataFrame, marks: pd.DataFrame, columns: int = 2) -> str:
    """SPS over runs, one panel per point; regressed runs marked; change points as dashed lines with the level
    of each stretch between them shaded. `trend`: label, order, commit, sps, regressed (bool); `levels`: label,
    first, last (orders), level, low, high; `marks`: label, order, metric, worse, note."""
    with rc_context(STYLE):
        figure, panels = _panels_over_runs(trend, columns, 2.6)
        for ax, label in panels:
            frame = trend[trend["label"] == label].sort_values("order")
            for stretch in levels[levels["label"] == label].itertuples():
                span = [stretch.first - 0.4, stretch.last + 0.4]
                ax.fill_between(span, stretch.low, stretch.high, color=PALETTE[0], alpha=0.12, lw=0)
                ax.plot(span, [stretch.level] * 2, color=PALETTE[0], lw=1.2, alpha=0.6)
            ax.plot(frame["order"], frame["sps"], "o-", ms=3.5, color=PALETTE[0])
            bad = frame[frame["regressed"]]
            ax.plot(bad["order"], bad["sps"], "v", ms=9, color=REGRESSED_COLOR, label="regressed")
            _change_lines(ax, marks[(marks["label"] == label) & (marks["metric"] == "SPS")])
            _finish_panel(ax, label, trend, "SPS")
            if not bad.empty:
                ax.legend(loc="lower left")
        return to_svg(figure)


def _panels_over_runs(trend: pd.DataFrame, columns: int, panel_height: float) -> tuple[Figure, list]:
    """A grid of panels, one per point of `trend` (label, order, commit, ...), as (axes, label) pairs; spare
    panels of the last row are hidden."""
    labels = list(dict.fromkeys(trend["label"]))
    rows = -(-len(labels) // columns)
    figure = _new(4.2 * columns, panel_height * rows)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax in axes[len(labels):]:
        ax.set_visible(False)
    return figure, list(zip(axes, labels))


def _finish_panel(ax, label: str, trend: pd.DataFrame, ylabel: str) -> None:
    """The point's name above, the axis from zero, and each run named by its commit below."""
    ticks = trend.drop_duplicates("order").sort_values("order")
    ax.set_title(_short(label, 44), fontsize=9)
    ax.set_ylim(bottom=0)
    ax.set_xticks(ticks["order"], ticks["commit"], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)


def _change_lines(ax, marks: pd.DataFrame, note: str = "note") -> None:
    """A dashed line just before each run where a change began, named at the top of the panel."""
    for mark in marks.itertuples():
        color = REGRESSED_COLOR if mark.worse else IMPROVED_COLOR
        ax.axvline(mark.order - 0.5, color=color, ls="--", lw=1.2)
        ax.annotate(getattr(mark, note), (mark.order - 0.5, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -2),
                    textcoords="offset points", va="top", fontsize=7, color=color)


def phase_history(trend: pd.DataFrame, marks: pd.DataFrame, columns: int = 2) -> str:
    """Time per agent step of each phase over runs, one panel per point, change points marked as in the SPS
    panels. `trend`: label, order, commit, phase, us_per_step; `marks`: label, order, metric, worse, phase_note."""
    with rc_context(STYLE):
        figure, panels = _panels_over_runs(trend, columns, 2.9)
        for ax, label in panels:
            frame = trend[trend["label"] == label]
            for phase, line in frame.groupby("phase", sort=False):
                line = line.sort_values("order")
                ax.plot(line["order"], line["us_per_step"], "o-", ms=2.5, lw=1.2, label=phase,
                        color=PHASE_COLORS.get(phase, "#bbbbbb"))
            _change_lines(ax, marks[marks["label"] == label], "phase_note")
            _finish_panel(ax, label, trend, "µs per agent step")
        if panels:
            panels[0][0].legend(ncols=4, loc="lower left", bbox_to_anchor=(0.0, 1.12), fontsize=7)
        return to_svg(figure)


def roofline(title: str, roofs: dict[str, float], bandwidth: float, phases: pd.DataFrame) -> str:
    """Arithmetic intensity against achieved FLOP/s, one dot per phase with a dash at its own ceiling, under
    the measured roofs (flat) and memory bandwidth (the slope). `phases`: phase, intensity, achieved, ceiling."""
    with rc_context(STYLE):
        figure = _new(5.2, 3.4)
        ax = figure.add_subplot()
        top = max(roofs.values())
        ridge = top / bandwidth if np.isfinite(bandwidth) else np.nan
        low = np.nanmin([phases["intensity"].min(), ridge]) / 4
        high = np.nanmax([phases["intensity"].max(), ridge]) * 4
        x = np.geomspace(low, high, 200)
        for index, (label, roof) in enumerate(roofs.items()):
            line = np.minimum(roof, bandwidth * x) if np.isfinite(bandwidth) else np.full_like(x, roof)
            ax.plot(x, line, color="#33414f", lw=1.6 if index == 0 else 1.0, ls="-" if index == 0 else "--",
                    label=label)
        for row in phases.itertuples():
            color = PHASE_COLORS.get(row.phase, "#bbbbbb")
            ax.plot([row.intensity], [row.achieved], "o", ms=7, color=color, label=row.phase, zorder=3)
            if np.isfinite(row.ceiling):
                ax.plot([row.intensity] * 2, [row.achieved, row.ceiling], ":", color=color, lw=1.2)
                ax.plot([row.intensity], [row.ceiling], "_", ms=16, mew=2.2, color=color, zorder=3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlim(low, high)
        ax.set_ylim(min(phases["achieved"].min(), top) / 4, top * 2.5)
        ax.yaxis.set_major_formatter(lambda value, _: _engineering(value, "FLOP/s"))
        ax.xaxis.set_major_formatter(lambda value, _: f"{value:g}")
        ax.xaxis.set_minor_formatter(lambda value, _: "")
        ax.set_xlabel("arithmetic intensity (FLOP per byte it must move)")
        ax.set_title(_short(title, 56))
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=4, fontsize=7)
        return to_svg(figure)


def _engineering(value: float, unit: str) -> str:
    for power, prefix in ((12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if value >= 10**power:
            return f"{value / 10**power:g} {prefix}{unit}"
    return f"{value:g} {unit}"


def side_by_side(frame: pd.DataFrame, a: str, b: str) -> str:
    """Paired horizontal bars of median SPS per point for two machines. `frame`: label, A, B."""
    with rc_context(STYLE):
        figure = _new(8, 1.0 + 0.45 * len(frame))
        ax = figure.add_subplot()
        y = np.arange(len(frame))[::-1]
        ax.barh(y + 0.2, frame["A"], height=0.38, color=PALETTE[0], label=_short(a, 40))
        ax.barh(y - 0.2, frame["B"], height=0.38, color=PALETTE[1], label=_short(b, 40))
        ax.set_yticks(y, [_short(label) for label in frame["label"]])
        ax.set_xlabel("agent steps per second (steady, median of repeats)")
        ax.set_title("SPS per point on each machine")
        ax.grid(axis="y", visible=False)
        ax.legend(loc="lower right")
        return to_svg(figure)


def pareto(points: pd.DataFrame, costs: dict[str, str]) -> str:
    """Final score against the cost of solving, one panel per cost, over a run's points. `points`: label,
    final_return and, per cost column c of `costs` (c: axis label), c (the median: inf when not reached), c_low,
    c_high (inf when unbounded) and c_budget (the longest repeat). Each point has its colour, named in the
    legend; a median that was not reached is drawn at the budget as a right-pointing triangle (the cost lies
    beyond it). The Pareto front (no other point both cheaper and better) is ringed and joined, cheapest first."""
    with rc_context(STYLE):
        figure = _new(4.6 * len(costs), 3.2 + 0.22 * -(-len(points) // 3))
        axes = figure.subplots(1, len(costs), squeeze=False)[0]
        y = points["final_return"].to_numpy(float)
        handles = []
        for ax, (cost, axis_label) in zip(axes, costs.items()):
            reached = np.isfinite(points[cost]).to_numpy()
            x = np.where(reached, points[cost], points[f"{cost}_budget"])
            high = points[f"{cost}_high"].to_numpy(float)
            edge = float(np.nanmax(np.where(np.isfinite(high), high, x))) * 1.08
            front = sorted(_pareto_front(x, y), key=lambda i: x[i])
            ax.plot(x[front], y[front], "-", color="#33414f", lw=1, alpha=0.5, zorder=1)
            ring = ax.plot(x[front], y[front], "o", ms=12, mfc="none", mec="#33414f", zorder=1, label="Pareto front")
            drawn = []
            for i, label in enumerate(points["label"]):
                color = PALETTE[i % len(PALETTE)]
                if reached[i]:
                    drawn.append(ax.errorbar(x[i], y[i], xerr=[[x[i] - points[f"{cost}_low"].iloc[i]],
                                                               [(high[i] if np.isfinite(high[i]) else edge) - x[i]]],
                                             fmt="o", ms=6, color=color, elinewidth=1, capsize=2, alpha=0.9,
                                             label=_short(label, 40)))
                else:
                    drawn += ax.plot(x[i], y[i], ">", ms=8, color=color, label=_short(label, 40) + " (not reached)")
            handles = handles or drawn + ring
            ax.set_xlim(0, edge)
            ax.set_xlabel(axis_label)
            ax.set_ylabel("final episode return (median)")
            ax.set_title(f"score against {axis_label}")
        figure.legend(handles=handles, loc="outside lower center", ncols=3)
        return to_svg(figure)


def _pareto_front(cost: np.ndarray, score: np.ndarray) -> list[int]:
    """Indices of the points no other point beats on both counts (cost no higher, score no lower, one strictly)."""
    def beaten(i: int) -> bool:
        return any(cost[j] <= cost[i] and score[j] >= score[i] and (cost[j] < cost[i] or score[j] > score[i])
                   for j in range(len(cost)) if j != i)
    return [i for i in range(len(cost)) if np.isfinite(score[i]) and not beaten(i)]
