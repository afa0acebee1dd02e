"""Terminal view of one profile (profile.json): trace summary, utilization and where the files are."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table



def trace_tables(trace_summary: dict) -> Group:
    """Tables for one trace summary (profilers/trace_summary.py); also used where reports show traces."""
    parts = []
    steps = trace_summary["env_steps"]
    head = Table(title=f"trace: {trace_summary['traced_epochs']} epoch(s), {steps:,} env steps, "
                       f"{trace_summary['bytes'] / 1e6:.2f} MB", show_header=False)
    head.add_column("figure")
    head.add_column("value", justify="right")
    gpu = trace_summary.get("gpu")
    if gpu:
        head.add_row("GPU busy / idle (ms)", f"{gpu['busy_us'] / 1e3:.2f} / {gpu['idle_us'] / 1e3:.2f}")
        head.add_row("GPU busy share", f"{100 * gpu['busy_fraction']:.1f}%" if gpu["busy_fraction"] is not None else "-")
    else:
        head.add_row("GPU", trace_summary.get("gpu_unavailable", "-"))
    for key, label in (("launches_per_env_step", "kernel launches per env step"),
                       ("kernels_per_env_step", "kernels run per env step"),
                       ("host_syncs_per_epoch", "host synchronisations per epoch"),
                       ("cpu_ops_per_env_step", "CPU operators per env step")):
        if trace_summary.get(key) is not None:
            head.add_row(label, f"{trace_summary[key]:.2f}")
    for direction, copy in (trace_summary.get("copies") or {}).items():
        rate = "-" if copy["gb_per_s"] is None else f"{copy['gb_per_s']:.2f} GB/s"
        head.add_row(f"copies {direction}", f"{copy['count']} x, {copy['bytes'] / 1e6:.2f} MB, {rate}")
    parts.append(head)

    phases = Table(title="phases in the trace (ms)")
    phases.add_column("phase")
    phases.add_column("host", justify="right")
    device = trace_summary.get("phases_device_us")
    if device:
        phases.add_column("GPU", justify="right")
    for phase in trace_summary["phases_host_us"]:  # the reference trainer's PHASES; a command's, and `other`
        row = [phase, f"{trace_summary['phases_host_us'][phase] / 1e3:.2f}"]
        if device:
            row.append(f"{device[phase] / 1e3:.2f}")
        phases.add_row(*row)
    parts.append(phases)

    for key, title in (("top_operators", "top CPU operators by self time"), ("top_kernels", "top GPU kernels by time")):
        rows = trace_summary.get(key)
        if not rows:
            continue
        table = Table(title=title)
        table.add_column("name", overflow="ellipsis", max_width=70)
        table.add_column("calls", justify="right")
        table.add_column("ms", justify="right")
        for row in rows:
            table.add_row(row["name"], str(row["calls"]), f"{row.get('self_us', row.get('total_us')) / 1e3:.2f}")
        parts.append(table)
    return Group(*parts)


def print_profile(profile: dict) -> None:
    console = Console()
    console.print(trace_tables(profile["trace_summary"]))
    utilization = profile["utilization"]
    if utilization["traced_epochs"]:
        table = Table(title="utilization over the traced epochs")
        for column in ("source", "samples", "mean util %", "util-s / M steps", "J / M steps"):
            table.add_column(column, justify="left" if column == "source" else "right")
        for source, figures in utilization["traced_epochs"].items():
            table.add_row(source, str(figures["samples"]), _num(figures["mean_util_percent"], ".1f"),
                          _num(figures["util_seconds_per_m_steps"], ".1f"),
                          _num(figures["energy_j_per_m_steps"], ".0f"))
        console.print(table)
    else:
        console.print(f"utilization: no sample fell within the traced epochs, which were shorter than the "
                      f"{1000 * utilization['interval_s']:g} ms between samples: raise --sample-hz or trace more "
                      f"steps (utilization.csv holds the whole run's)", soft_wrap=True)
    if utilization["unavailable"]:
        console.print(f"[yellow]{utilization['unavailable']}[/yellow]")
    clock = profile["clock_check"]
    if clock["matched_ranges"]:
        console.print(f"clock check: {clock['matched_ranges']} phase ranges, median offset "
                      f"{clock['median_offset_us']:.1f} us" + (" (corrected)" if clock["corrected"] else ""))
    console.print(f"trace (open in ui.perfetto.dev): {profile['trace']}")
    pyspy = profile.get("pyspy") or {}
    for key in ("speedscope", "flamegraph_svg"):
        if key in pyspy:
            console.print(f"py-spy {key}: {pyspy[key]}")
    console.print(f"[dim]{profile['note']}[/dim]")


def _num(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)
