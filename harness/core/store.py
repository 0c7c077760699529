"""The local metrics store: one long-format parquet file per run, written with polars.

Columns (the metric contract of docs/design.md): ``run_id, stage, step, task, split, metric, value, time``, plus
``text`` for values that are tables (``ft_top1`` as JSON), ``n, ci_low, ci_high`` for proportions (the item
count and the 95 % Wilson interval of ``greedy``, ``mode_ok``, ``tf_first``…; null for every other metric), and
``cached_from`` (the id of the run that computed a row this run copied from the stage cache,
:mod:`harness.runs.execution.stage_cache`; null otherwise). Run-level metrics have ``task = null``. Stores written
before a column existed load with it null (:func:`with_schema_columns`).

The file is rewritten atomically (temporary file, then rename) at every flush, so a reader — a notebook polling
a run in progress — always sees a complete file, and a crash never leaves a half-written one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Set
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from harness.core.metrics import MetricView

SCHEMA = {
    "run_id": pl.Utf8,
    "stage": pl.Utf8,
    "step": pl.Int64,
    "task": pl.Utf8,
    "split": pl.Utf8,
    "metric": pl.Utf8,
    "value": pl.Float64,
    "time": pl.Float64,
    "text": pl.Utf8,
    "n": pl.Int64,
    "ci_low": pl.Float64,
    "ci_high": pl.Float64,
    "cached_from": pl.Utf8,
}
FILENAME = "metrics.parquet"
# Metrics where a smaller value is better (every other one: larger is better, or neither), as their components declare
# them (:mod:`harness.core.metrics`); a live view, read at each use. Sweeps take their default objective direction
# from it, the analysis its plot and ranking directions.
LOWER_IS_BETTER: Set[str] = MetricView(lambda m: m.higher_is_better is False)


@dataclass(frozen=True)
class Row:
    stage: str
    step: int
    task: str | None
    split: str
    metric: str
    value: float
    text: str | None = None
    n: int | None = None  # items behind a proportion, and its 95 % Wilson interval (None otherwise)
    ci_low: float | None = None
    ci_high: float | None = None


def with_schema_columns(frame: pl.DataFrame) -> pl.DataFrame:
    """``frame`` with a null column for every :data:`SCHEMA` column it lacks (a store from before it existed:
    ``n, ci_low, ci_high``, ``cached_from``)."""
    missing = [pl.lit(None, dtype=dtype).alias(name) for name, dtype in SCHEMA.items() if name not in frame.columns]
    return frame.with_columns(missing) if missing else frame


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)  # a full disk must not leave half a file behind
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


class MetricsStore:
    """Buffers rows in memory and rewrites ``metrics.parquet`` at each :meth:`flush`."""

    def __init__(self, run_dir: Path, run_id: str, flush_seconds: float = 30.0):
        self.path = Path(run_dir) / FILENAME
        self.run_id = run_id
        self.flush_seconds = flush_seconds
        self._columns: dict[str, list] = {name: [] for name in SCHEMA}
        self._dirty = False
        self._last_flush = time.monotonic()

    def log(self, rows: Iterable[Row], cached_from: str | None = None) -> None:
        now = time.time()
        cols = self._columns
        for r in rows:
            cols["run_id"].append(self.run_id)
            cols["stage"].append(r.stage)
            cols["step"].append(int(r.step))
            cols["task"].append(r.task)
            cols["split"].append(r.split)
            cols["metric"].append(r.metric)
            cols["value"].append(float(r.value))
            cols["time"].append(now)
            cols["text"].append(r.text)
            cols["n"].append(r.n)
            cols["ci_low"].append(r.ci_low)
            cols["ci_high"].append(r.ci_high)
            cols["cached_from"].append(cached_from)
            self._dirty = True
        if self._dirty and time.monotonic() - self._last_flush > self.flush_seconds:
            self.flush()

    def load_existing(self, keep) -> None:
        """Start from the rows already on disk that ``keep(stage, step, metric)`` accepts (resuming a run)."""
        if not self.path.exists():
            return
        frame = with_schema_columns(pl.read_parquet(self.path))
        for row in frame.iter_rows(named=True):
            if keep(row["stage"], row["step"], row["metric"]):
                for name in SCHEMA:
                    self._columns[name].append(row[name])
        self._dirty = True
        self.flush()

    def rows(self) -> list[Row]:
        c = self._columns
        return [
            Row(*values)
            for values in zip(
                c["stage"],
                c["step"],
                c["task"],
                c["split"],
                c["metric"],
                c["value"],
                c["text"],
                c["n"],
                c["ci_low"],
                c["ci_high"],
            )
        ]

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame(self._columns, schema=SCHEMA)

    def flush(self) -> None:
        if not self._dirty and self.path.exists():
            return
        tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
        try:
            self.frame().write_parquet(tmp)
            os.replace(tmp, self.path)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        self._dirty = False
        self._last_flush = time.monotonic()


def read_metrics(run_dir: str | Path) -> pl.DataFrame:
    """The store of a run (finished or in progress); a column added to :data:`SCHEMA` since it was written reads as
    null."""
    return with_schema_columns(pl.read_parquet(Path(run_dir) / FILENAME))
