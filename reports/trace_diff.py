"""A traced diff drawn (decisions/trace_diff.py decides it): the same tables in the terminal, in Markdown and in an
HTML page, and the diff itself as JSON, written into one directory."""

from __future__ import annotations

import html
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from decisions import trace_diff as rules
from profilers.profile_sets import TracedProcess
from rlperf.errors import BadInput, written_whole

DIFF_JSON, DIFF_MD, DIFF_HTML = "diff.json", "diff.md", "diff.html"
Section = tuple[str, list[str], list[list[str]]]  # title, headers, rows


def compared(sides: dict[str, list[TracedProcess]], alpha: float) -> dict:
    """The diff of the second side against the first, labelled by their names; bad input where they cannot be
    compared, saying why in one line."""
    why = rules.refusal(sides)
    if why is not None:
        raise BadInput(why)
    (ref_label, ref), (new_label, new) = sides.items()
    found = rules.diff(ref, new, alpha)
    found["labels"] = {"ref": ref_label, "new": new_label}
    found["traces"] = {"ref": [str(p.trace) for p in ref], "new": [str(p.trace) for p in new]}
    return found


def write_diff(found: dict, out_dir: Path) -> list[Path]:
    """diff.json, diff.md and diff.html in `out_dir`; their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / DIFF_JSON, out_dir / DIFF_MD, out_dir / DIFF_HTML]
    for path, text in zip(paths, (json.dumps(found, indent=1), markdown(found), page(found))):
        with written_whole(path) as partial:
            partial.write_text(text)
    return paths


def print_diff(console: Console, found: dict) -> None:
    for title, headers, rows in sections(found):
        table = Table(title=title, title_justify="left")
        for index, header in enumerate(headers):
            table.add_column(header, justify="left" if index == 0 else "right",
                             overflow="ellipsis", max_width=48 if index == 0 else None)
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for line in conclusion(found):
        console.print(line, markup=False, soft_wrap=True)


def conclusion(found: dict) -> list[str]:
    labels, processes = found["labels"], found["processes"]
    head = (f"{labels['new']} against {labels['ref']}: {len(processes['new'])} against {len(processes['ref'])} "
            f"traced processes")
    if min(len(processes["new"]), len(processes["ref"])) < 2:
        return [f"{head}; one process a side has no spread to judge a change by: nothing is claimed "
                "(trace two or more a side)"]
    if not found["claims"]:
        return [f"{head}; no phase changed beyond the spread of each side's processes"]
    return [f"{head}; claimed beyond each side's spread:", *(f"  {line}" for line in found["claims"])]


def sections(found: dict) -> list[Section]:
    """The diff's tables: phases, then the operators and kernels inside each phase that changed, the counts, and
    memory where both sides measured it."""
    labels = found["labels"]
    level = f"{100 * (1 - found['phase_alpha']):.1f}%"
    parts: list[Section] = [(
        f"phases, ns per agent step: {labels['new']} against {labels['ref']} (interval {level}, each side's "
        "processes' spread)",
        ["phase", "on", labels["ref"], labels["new"], "change", "%", "interval", "verdict"],
        [[row["phase"], row["measure"], _num(row["ref"]), _num(row["new"]), _signed(row["change"]),
          _percent(row["relative"]), _interval(row), row["verdict"]] for row in found["phases"]])]
    for phase in found["changed"]:
        for table in ("operators", "kernels"):
            rows = _shown(phase[table])
            if rows:
                parts.append((
                    f"inside {phase['phase']} ({phase['verdict']}): {table} by change, ns per agent step",
                    ["name", labels["ref"], labels["new"], "change", "interval", "calls/step", "verdict"],
                    [[row["name"], _num(row["ref"]), _num(row["new"]), _signed(row["change"]), _interval(row),
                      f"{row['ref_calls']:.3g} -> {row['new_calls']:.3g}", row["presence"] or row["verdict"]]
                     for row in rows]))
    parts.append(("per agent step over the whole step", ["figure", labels["ref"], labels["new"], "change",
                                                          "interval", "verdict"],
                  [[row["name"], _num(row["ref"]), _num(row["new"]), _signed(row["change"]), _interval(row),
                    row["verdict"]] for row in found["counts"]]))
    if found.get("memory"):
        parts.append(("peak memory, MB a process", ["figure", labels["ref"], labels["new"], "change", "interval",
                                                     "verdict"],
                      [[row["name"], _num(row["ref"] / 1e6), _num(row["new"] / 1e6), _signed(row["change"] / 1e6),
                        _interval(row, 1e-6), row["verdict"]] for row in found["memory"]]))
    return parts


def _shown(rows: list[dict]) -> list[dict]:
    """The first rows by change, and every operator new or gone after them."""
    return rows[:rules.TOP_N] + [row for row in rows[rules.TOP_N:] if row["presence"]]


def markdown(found: dict) -> str:
    lines = ["# Traced diff", ""]
    for title, headers, rows in sections(found):
        lines += [f"**{title}**", "", "| " + " | ".join(headers) + " |",
                  "| " + " | ".join("---" for _ in headers) + " |"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        lines.append("")
    lines += conclusion(found) + ["", "Traces (open in ui.perfetto.dev):", ""]
    lines += [f"- {side}: `{path}`" for side in ("ref", "new") for path in found["traces"][side]]
    return "\n".join(lines) + "\n"


def page(found: dict) -> str:
    body = ["<h1>Traced diff</h1>"]
    for title, headers, rows in sections(found):
        body.append(f"<h3>{html.escape(title)}</h3><table><tr>"
                    + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr>")
        body += ["<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows]
        body.append("</table>")
    body += [f"<p>{html.escape(line)}</p>" for line in conclusion(found)]
    body.append("<ul>" + "".join(f"<li>{side}: <code>{html.escape(path)}</code></li>"
                                 for side in ("ref", "new") for path in found["traces"][side]) + "</ul>")
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:1em}"
             "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}td:first-child,th:first-child"
             "{text-align:left}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>Traced diff</title><style>{style}</style>"
            f"</head><body>{''.join(body)}</body></html>\n")


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    magnitude = abs(value)
    return f"{value:,.0f}" if magnitude >= 100 else f"{value:.1f}" if magnitude >= 1 else f"{value:.3f}"


def _signed(value: float) -> str:
    text = _num(value)
    return text if text.startswith("-") else f"+{text}"


def _percent(relative: float | None) -> str:
    return "-" if relative is None else f"{100 * relative:+.1f}%"


def _interval(row: dict, scale: float = 1.0) -> str:
    if row["low"] is None:
        return "-"
    return f"{_signed(row['low'] * scale)} .. {_signed(row['high'] * scale)}"
