"""``harness report``: one self-contained HTML page (PNGs embedded, and written next to it) for a run or a sweep.

- :mod:`analysis.report.page`: the page (sections, embedded figures, CSS) and the HTML table helpers;
- :mod:`analysis.report.run`: the run report (:func:`run_report`), reading :mod:`analysis.report.run_data` and
  writing its findings with :mod:`analysis.report.run_findings`;
- :mod:`analysis.report.sweep`: the sweep report (:func:`sweep_report`);
- :mod:`analysis.report.group`: the report of a seed group (:func:`group_report`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis.group import is_group_dir
from analysis.loading import AnalysisError, PathLike, is_run_dir, is_sweep_dir
from analysis.report.group import group_report
from analysis.report.page import CSS, REPORT_FILE, Page, fmt, fmt_rank, table
from analysis.report.run import run_report, stage_table_html
from analysis.report.sweep import sweep_report

__all__ = [
    "CSS",
    "REPORT_FILE",
    "Page",
    "fmt",
    "fmt_rank",
    "group_report",
    "run_report",
    "stage_table_html",
    "sweep_report",
    "table",
    "write_report",
]


def write_report(path: PathLike, out: PathLike | None = None, **options: Any) -> Path:
    """The report of a run, sweep or seed-group directory (whichever ``path`` is); returns ``report.html``."""
    path = Path(path)
    if is_group_dir(path):
        return group_report(path, out, **options)
    if is_sweep_dir(path):
        return sweep_report(path, out, **options)
    if is_run_dir(path):
        return run_report(path, out, **options)
    raise AnalysisError(
        f"{path}: neither a run directory (metrics.parquet), a sweep directory (trials.parquet) "
        "nor a seed group (group.json)"
    )
