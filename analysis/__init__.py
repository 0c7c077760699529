"""Analysis of run directories with polars: load stores, compare runs, find seesaw events."""

from __future__ import annotations

from pathlib import Path

import polars as pl


def load_run(run_dir: str | Path) -> pl.DataFrame:
    """The metrics store of one run (finished or in progress)."""
    from harness.store import read_metrics

    return read_metrics(run_dir)
