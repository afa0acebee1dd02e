"""A report as sections of text, tables and figures, written twice: Markdown for CI logs and job
summaries, and one self-contained HTML file (inline CSS and SVG, no scripts, nothing fetched).

Every string that came from results is escaped here, in one place, for both formats.
"""

from __future__ import annotations

import html
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from rlperf.errors import fault, output_dir

STATUS_COLUMN = "status"


@dataclass
class Section:
    title: str
    text: list[str] = field(default_factory=list)
    tables: list[pd.DataFrame] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    in_markdown: bool = True
    side_by_side: bool = False


@dataclass
class Report:
    title: str
    subtitle: str
    sections: list[Section]
    badges: dict[str, int] = field(default_factory=dict)


def write(report: Report, out_dir: str) -> tuple[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    md_path, html_path = os.path.join(out_dir, "report.md"), os.path.join(out_dir, "report.html")
    with open(md_path, "w", encoding="utf-8") as out:
        out.write(to_markdown(report))
    with open(html_path, "w", encoding="utf-8") as out:
        out.write(to_html(report))
    return md_path, html_path


def cell_text(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return str(value)


def _md_cell(value) -> str:
    text = html.escape(cell_text(value), quote=False)
    return text.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def markdown_table(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(_md_cell(c) for c in frame.columns) + " |"
    rule = "| " + " | ".join("---" for _ in frame.columns) + " |"
    rows = ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def to_markdown(report: Report) -> str:
    parts = [f"# {_md_cell(report.title)}", "", _md_cell(report.subtitle), ""]
    if report.badges:
        parts += [" · ".join(f"**{count} {status}**" for status, count in report.badges.items()), ""]
    for section in report.sections:
        if not section.in_markdown:
            continue
        parts += [f"## {_md_cell(section.title)}", ""]
        for paragraph in section.text:
            parts += [_md_cell(paragraph), ""]
        for table in section.tables:
            parts += [markdown_table(table), ""]
    return "\n".join(parts)


CSS = """
:root { --ink:#1f2933; --muted:#5f6b7a; --line:#e3e6ea; --panel:#f7f8fa; }
* { box-sizing:border-box; }
body { margin:0; font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
       color:var(--ink); background:#fff; }
main { max-width:1120px; margin:0 auto; padding:28px 32px 64px; }
header h1 { font-size:24px; margin:0 0 4px; }
header p { color:var(--muted); margin:0 0 14px; }
nav { display:flex; flex-wrap:wrap; gap:6px 14px; padding:10px 0 14px; border-bottom:1px solid var(--line);
      font-size:13px; }
nav a { color:#3b6fb6; text-decoration:none; }
section { padding:18px 0 8px; border-bottom:1px solid var(--line); }
h2 { font-size:18px; margin:0 0 8px; }
section p { margin:6px 0; color:#38434f; max-width:900px; }
.badges { display:flex; flex-wrap:wrap; gap:8px; margin:4px 0 10px; }
.badge, .status { display:inline-block; border-radius:10px; padding:1px 9px; font-size:12px; font-weight:600;
                  background:#eef1f4; color:#38434f; white-space:nowrap; }
.s-regressed { background:#fbe3e1; color:#a02a22; }
.s-improved { background:#e0f2e6; color:#24703e; }
.s-unchanged { background:#eef1f4; color:#4b5663; }
.s-new { background:#e3ecf8; color:#2b5793; }
.s-missing, .s-skipped { background:#fdf0dc; color:#8a5a0f; }
.s-failed, .s-timeout { background:#f4d6f0; color:#8b1f7c; }
.s-ok { background:#e0f2e6; color:#24703e; }
.table-wrap { overflow-x:auto; margin:10px 0 14px; }
table { border-collapse:collapse; font-size:13px; font-variant-numeric:tabular-nums; }
th, td { text-align:left; padding:5px 14px 5px 0; border-bottom:1px solid var(--line); vertical-align:top; }
td { white-space:nowrap; }
td:first-child { white-space:normal; min-width:170px; }
td:last-child { white-space:normal; min-width:200px; overflow-wrap:anywhere; }
th { color:var(--muted); font-weight:600; font-size:12px; border-bottom:2px solid var(--line); }
tbody tr:hover { background:var(--panel); }
figure.plot { margin:12px 0 18px; padding:10px; background:#fff; border:1px solid var(--line);
              border-radius:8px; }
.grid { display:grid; grid-template-columns:repeat(auto-fill, minmax(420px, 1fr)); gap:0 16px; }
figure.plot svg { display:block; width:100%; height:auto; max-width:100%; }
footer { color:var(--muted); font-size:12px; padding-top:16px; }
"""


def _html_table(frame: pd.DataFrame) -> str:
    head = "".join(f"<th>{html.escape(cell_text(c))}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False):
        cells = []
        for column, value in zip(frame.columns, row):
            text = html.escape(cell_text(value))
            if column == STATUS_COLUMN:
                text = f'<span class="status s-{html.escape(cell_text(value), quote=True)}">{text}</span>'
            cells.append(f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def _anchor(index: int) -> str:
    return f"section-{index}"


def to_html(report: Report) -> str:
    nav = "".join(f'<a href="#{_anchor(i)}">{html.escape(s.title)}</a>' for i, s in enumerate(report.sections))
    badges = "".join(f'<span class="badge s-{html.escape(status)}">{count} {html.escape(status)}</span>'
                     for status, count in report.badges.items())
    sections = []
    for index, section in enumerate(report.sections):
        parts = [f'<section id="{_anchor(index)}"><h2>{html.escape(section.title)}</h2>']
        parts += [f"<p>{html.escape(paragraph)}</p>" for paragraph in section.text]
        plots = "".join(f'<figure class="plot">{svg}</figure>' for svg in section.figures)
        parts.append(f'<div class="grid">{plots}</div>' if section.side_by_side else plots)
        parts += [_html_table(table) for table in section.tables]
        parts.append("</section>")
        sections.append("".join(parts))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>{html.escape(report.title)}</title><style>{CSS}</style></head><body><main>"
        f"<header><h1>{html.escape(report.title)}</h1><p>{html.escape(report.subtitle)}</p>"
        f'<div class="badges">{badges}</div></header><nav>{nav}</nav>'
        + "".join(sections)
        + "<footer>rlperf report · self-contained: opens offline, fetches nothing.</footer></main></body></html>\n"
    )


def write_report(report: Report, out_dir: str) -> tuple[str, str]:
    """Writes report.md and report.html into `out_dir` (the --out of every report command). A file there is
    bad input; a directory the machine cannot write to is a fault, after which no half-written report and
    no directory created for it remain."""
    existed = Path(out_dir).is_dir()
    output_dir(out_dir, "out")
    try:
        return write(report, out_dir)
    except OSError as exc:
        for name in ("report.md", "report.html"):
            (Path(out_dir) / name).unlink(missing_ok=True)
        if not existed:
            Path(out_dir).rmdir()
        raise fault(out_dir, exc) from None
