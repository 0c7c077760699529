"""The HTML page of a report: :class:`Page` (sections, figures saved as PNGs and embedded, a table of contents),
its CSS, and the helpers that format values and frames as HTML (:func:`fmt`, :func:`fmt_rank`, :func:`table`)."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from analysis import plots as P
from analysis.loading import AnalysisError

REPORT_FILE = "report.html"

CSS = (
    "\n"
    'body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:#222;\n'
    "     max-width:1180px;margin:24px auto;padding:0 20px;line-height:1.45;font-size:14px}\n"
    "h1{font-size:22px;margin-bottom:2px} "
    "h2{font-size:18px;margin-top:34px;border-bottom:1px solid #ddd;padding-bottom:4px}\n"
    "h3{font-size:15px;margin:18px 0 6px} .sub{color:#666;margin-top:0} "
    "code,pre{font-family:Menlo,Consolas,monospace;font-size:12px}\n"
    "pre{background:#f7f7f7;padding:10px;overflow-x:auto;border-radius:4px}\n"
    "table{border-collapse:collapse;margin:8px 0 14px;font-size:12.5px} "
    "th,td{padding:3px 9px;border-bottom:1px solid #e6e6e6;\n"
    "     text-align:left;vertical-align:top} th{background:#fafafa;font-weight:600} "
    "td.num{text-align:right;font-variant-numeric:tabular-nums}\n"
    "td.wrap{max-width:340px;white-space:pre-wrap;word-break:break-word} "
    ".d{font-size:10.5px;color:#666;margin-left:4px}\n"
    ".down{color:#c62828;font-weight:600} .up{color:#2e7d32} figure{margin:10px 0 22px} figure img{max-width:100%}\n"
    "figcaption{color:#555;font-size:12.5px;margin-top:4px} .findings li{margin:3px 0} "
    ".note{color:#666;font-size:12.5px}\n"
    "nav{background:#fafafa;border:1px solid #eee;padding:6px 12px;border-radius:4px;font-size:13px}\n"
    "nav a{margin-right:12px;color:#1565c0;text-decoration:none} "
    "details summary{cursor:pointer;color:#1565c0;margin:6px 0}\n"
    ".ok{color:#2e7d32}.bad{color:#c62828} .ci{font-size:10.5px;color:#777}\n"
)


class Page:
    """An HTML page under construction; figures are saved as PNG files in ``out`` and embedded as base64."""

    def __init__(self, out: Path, title: str):
        self.out = out
        self.title = title
        self.body: list[str] = []
        self.toc: list[tuple[str, str]] = []
        self.pngs: list[Path] = []

    def section(self, title: str, anchor: str) -> None:
        self.toc.append((anchor, title))
        self.body.append(f'<h2 id="{anchor}">{html.escape(title)}</h2>')

    def h3(self, title: str) -> None:
        self.body.append(f"<h3>{html.escape(title)}</h3>")

    def p(self, text: str, cls: str | None = None) -> None:
        self.body.append(f"<p{f' class={cls!r}' if cls else ''}>{text}</p>")

    def raw(self, markup: str) -> None:
        self.body.append(markup)

    def findings(self, items: Sequence[str]) -> None:
        """The findings as a bullet list (each item is markup already)."""
        self.raw("<ul class='findings'>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>")

    def file_details(self, path: Path) -> None:
        """A text file (a resolved config) folded away under its name; nothing when the file is not there."""
        if path.is_file():
            self.raw(f"<details><summary>{path.name}</summary><pre>{html.escape(path.read_text())}</pre></details>")

    def figure(self, make: Callable[[], Any], name: str, caption: str) -> None:
        """Draw with ``make()`` (a Figure), save ``name`` and embed it; a figure that cannot be drawn (no data)
        becomes a note instead."""
        try:
            fig = make()
        except AnalysisError as e:
            self.p(f"({html.escape(name)} not drawn: {html.escape(str(e))})", "note")
            return
        path = P.save(fig, self.out / name)
        self.pngs.append(path)
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        self.body.append(
            f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(name)}">'
            f'<figcaption>{caption} <a href="{html.escape(name)}">{html.escape(name)}</a>'
            "</figcaption></figure>"
        )

    def render(self, subtitle: str) -> str:
        nav = " ".join(f'<a href="#{a}">{html.escape(t)}</a>' for a, t in self.toc)
        return (
            "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{html.escape(self.title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{html.escape(self.title)}</h1><p class='sub'>{subtitle}</p><nav>{nav}</nav>"
            + "\n".join(self.body)
            + "</body></html>"
        )

    def write(self, subtitle: str) -> Path:
        path = self.out / REPORT_FILE
        path.write_text(self.render(subtitle), encoding="utf-8")
        return path


# ----------------------------------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------------------------------


def fmt(value: Any, digits: int = 3) -> str:
    """A cell's text: ``digits`` decimals, thousands separators from 100 up, scientific below ``10**-digits``,
    ✓/✗ for booleans, – for missing values; anything else escaped."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "✓" if value else "✗"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if value != 0 and abs(value) < 10**-digits:
            return f"{value:.1e}"
        return f"{value:.{digits}f}"
    return html.escape(str(value))


def table(
    frame: pl.DataFrame,
    *,
    wrap: Sequence[str] = (),
    cell: Callable[[str, Any, dict], str] | None = None,
    digits: int = 3,
) -> str:
    """A frame as an HTML table (``cell(column, value, row)`` may return the markup of a cell's content)."""
    if frame.is_empty():
        return "<p class='note'>(none)</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in frame.columns)
    rows = []
    for r in frame.iter_rows(named=True):
        tds = []
        for c, v in r.items():
            content = cell(c, v, r) if cell else None
            cls = "num" if isinstance(v, (int, float)) and not isinstance(v, bool) else ("wrap" if c in wrap else "")
            tds.append(f"<td class='{cls}'>{content if content is not None else fmt(v, digits)}</td>")
        rows.append("<tr>" + "".join(tds) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def fmt_rank(value: float | None) -> str:
    """A token rank: whole numbers without decimals, medians between two ranks with one."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:,.0f}" if abs(value - round(value)) < 1e-9 else f"{value:,.1f}"


def facts_table(facts: Mapping[str, str]) -> str:
    """A two-column table of named facts (the run's or sweep's paths, sizes and the command that made the page)."""
    return table(pl.DataFrame({"": list(facts), "value": list(facts.values())}))
