"""Any table of results as the rows a mixing law is fitted to (``harness mixture --table FILE``): runs made by
another trainer, a published swarm, pretraining domains. A CSV or parquet file with one row per run, a column per
mixture weight, a column per outcome, optionally a seed column; which columns are which, and the objective with its
direction, come from the command line. The table is checked cell by cell before anything is fitted, and a bad
one is an :class:`~analysis.loading.AnalysisError` naming the file, the column and the row (rows counted from 1
without the header; a CSV's line number beside it). The result is a :class:`~analysis.mixture_data.LawData`, so
the table goes through the same forms, cross-validation and support check as a sweep directory.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from analysis.loading import AnalysisError
from analysis.mixture_data import LawData

WEIGHT_TOLERANCE = 1e-3  # how far from 1 a row's weights may sum (published tables round their weights)
REDUCES = ("mean", "min", "max")
_OBJECTIVE = re.compile(r"^\s*(?P<reduce>mean|min|max)\s*\((?P<columns>[^()]*)\)\s*$")
_TRUE = {"1", "true", "yes", "y", "t"}
_FALSE = {"0", "false", "no", "n", "f", ""}


@dataclass
class TableObjective:
    """The objective a table is optimised for: ``reduce`` over the outcome ``columns``, and its direction."""

    reduce: str
    columns: list[str]
    maximize: bool

    @property
    def name(self) -> str:
        return self.columns[0] if len(self.columns) == 1 else f"{self.reduce}({', '.join(self.columns)})"


def read_table(path: Path | str) -> pl.DataFrame:
    """A CSV (every cell read as text, so a bad cell can be named) or parquet file."""
    path = Path(path)
    if not path.is_file():
        raise AnalysisError(f"{path}: no such file")
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            return pl.read_csv(path, infer_schema_length=0)
        if suffix in (".parquet", ".pq"):
            return pl.read_parquet(path)
    except (pl.exceptions.PolarsError, OSError) as e:
        raise AnalysisError(f"{path}: not a readable {suffix[1:]} table: {str(e).splitlines()[0]}") from None
    raise AnalysisError(f"{path}: a table is a .csv or .parquet file")


def _where(path: Path, row: int) -> str:
    """A row as the messages name it: from 1 without the header; a CSV's line beside it."""
    return f"row {row + 1}" + (f" (line {row + 2})" if path.suffix.lower() == ".csv" else "")


def resolve_columns(path: Path, table: pl.DataFrame, names: Sequence[str], what: str) -> list[str]:
    """``names`` (column names or shell-style patterns such as ``w_*``) as the table's columns, in the table's
    order for a pattern; a name that matches nothing is an error naming it and the table's columns."""
    out: list[str] = []
    for name in names:
        name = name.strip()
        found = [c for c in table.columns if fnmatch.fnmatchcase(c, name)] if any(ch in name for ch in "*?[") else []
        if not found and name in table.columns:
            found = [name]
        if not found:
            shown = ", ".join(table.columns[:20]) + (" …" if len(table.columns) > 20 else "")
            raise AnalysisError(f"{path}: column {name}: no such {what} column (columns: {shown})")
        out += [c for c in found if c not in out]
    return out


def numeric_column(path: Path, table: pl.DataFrame, column: str) -> np.ndarray:
    """The column as finite floats; the first empty, non-numeric or non-finite cell is an error naming it."""
    series = table[column]
    text = series.cast(pl.Utf8, strict=False) if series.dtype != pl.Utf8 else series
    values = series.cast(pl.Float64, strict=False) if series.dtype != pl.Boolean else series.cast(pl.Float64)
    bad = (text.is_null() | text.str.strip_chars().eq("")).to_numpy()
    if bad.any():
        raise AnalysisError(f"{path}: column {column}, {_where(path, int(np.argmax(bad)))}: empty")
    array = values.to_numpy().astype(float)
    bad = ~np.isfinite(array)
    if bad.any():
        row = int(np.argmax(bad))
        raise AnalysisError(f"{path}: column {column}, {_where(path, row)}: {text[row]!r} is not a finite number")
    return array


def parse_objective(spec: str, direction: str | None) -> tuple[str, list[str], bool]:
    """``COLUMN`` or ``mean|min|max(COLUMN, …)`` (names or patterns) and ``maximize``/``minimize``."""
    if direction not in ("maximize", "minimize"):
        raise AnalysisError("--direction: give maximize or minimize (a table's outcome has no known direction)")
    m = _OBJECTIVE.match(spec)
    reduce, names = (m["reduce"], m["columns"].split(",")) if m else ("mean", [spec])
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise AnalysisError(f"--objective {spec!r}: name a column, or {'|'.join(REDUCES)}(column, …)")
    return reduce, names, direction == "maximize"


def table_weights(path: Path, table: pl.DataFrame, weights: list[str], tolerance: float) -> np.ndarray:
    """The weight columns as a matrix: every cell a non-negative number, every row summing to 1 within
    ``tolerance`` (then normalised)."""
    W = np.column_stack([numeric_column(path, table, c) for c in weights])
    negative = np.argwhere(W < 0)
    if len(negative):
        row, col = negative[0]
        raise AnalysisError(f"{path}: column {weights[col]}, {_where(path, int(row))}: negative weight {W[row, col]:g}")
    sums = W.sum(axis=1)
    off = np.abs(sums - 1.0) > tolerance
    if off.any():
        row = int(np.argmax(off))
        raise AnalysisError(
            f"{path}: columns {weights[0]}…{weights[-1]}, {_where(path, row)}: the weights sum to {sums[row]:.6g}, "
            f"not 1 (tolerance {tolerance:g})"
        )
    return W / sums[:, None]


def _holdout_mask(path: Path, table: pl.DataFrame, column: str | None) -> np.ndarray:
    """Which rows the ``column`` marks as held out (1/0, true/false, yes/no)."""
    if column is None:
        return np.zeros(table.height, dtype=bool)
    resolve_columns(path, table, [column], "held-out")
    text = table[column].cast(pl.Utf8, strict=False).fill_null("").str.strip_chars().str.to_lowercase()
    unknown = ~(text.is_in(list(_TRUE)) | text.is_in(list(_FALSE))).to_numpy()
    if unknown.any():
        row = int(np.argmax(unknown))
        raise AnalysisError(f"{path}: column {column}, {_where(path, row)}: {text[row]!r} is not 1/0 or true/false")
    return text.is_in(list(_TRUE)).to_numpy()


def table_law_data(
    path: Path | str,
    *,
    weights: Sequence[str],
    objective: str,
    direction: str | None,
    seed_column: str | None = None,
    proportion: bool = False,
    tolerance: float = WEIGHT_TOLERANCE,
    holdout_column: str | None = None,
) -> tuple[LawData, LawData | None]:
    """The table at ``path`` as :class:`LawData` to fit, and the rows ``holdout_column`` marks as held out (None
    without it). ``weights``: column names or patterns (at least two columns); ``objective``: ``COLUMN`` or
    ``mean|min|max(COLUMN, …)``, whose columns are the targets; ``seed_column``: default ``seed`` where the table
    has one; ``proportion``: the outcomes are rates in [0, 1] (the log-linear law fits their logit)."""
    path = Path(path)
    table = read_table(path)
    reduce, names, maximize = parse_objective(objective, direction)
    weight_cols = resolve_columns(path, table, weights, "weight")
    if len(weight_cols) < 2:
        raise AnalysisError(f"{path}: --weights names {len(weight_cols)} column: a mixture needs two or more")
    targets = resolve_columns(path, table, names, "outcome")
    overlap = [c for c in targets if c in weight_cols]
    if overlap:
        raise AnalysisError(f"{path}: column {overlap[0]}: both a weight and an outcome")
    W = table_weights(path, table, weight_cols, tolerance)
    Y = np.column_stack([numeric_column(path, table, c) for c in targets])
    if proportion:
        outside = np.argwhere((Y < 0) | (Y > 1))
        if len(outside):
            row, col = outside[0]
            raise AnalysisError(
                f"{path}: column {targets[col]}, {_where(path, int(row))}: {Y[row, col]:g} is not a proportion"
            )
    if seed_column is None and "seed" in table.columns and "seed" not in weight_cols + targets:
        seed_column = "seed"
    if seed_column is not None:
        resolve_columns(path, table, [seed_column], "seed")
        if table[seed_column].null_count():
            row = int(np.argmax(table[seed_column].is_null().to_numpy()))
            raise AnalysisError(f"{path}: column {seed_column}, {_where(path, row)}: empty")
    held = _holdout_mask(path, table, holdout_column)
    fit = _law_data(path, table, ~held, W, Y, weight_cols, targets, reduce, maximize, seed_column, proportion)
    out = _law_data(path, table, held, W, Y, weight_cols, targets, reduce, maximize, seed_column, proportion)
    return fit, (out if holdout_column is not None else None)


def _scorer(reduce: str):
    def score(Y: np.ndarray) -> np.ndarray:
        return {"mean": np.mean, "min": np.min, "max": np.max}[reduce](Y, axis=-1)

    return score


def _law_data(path, table, rows, W, Y, weights, targets, reduce, maximize, seed_column, proportion) -> LawData:
    """The ``rows`` (a mask) of the checked table as :class:`LawData`."""
    score = _scorer(reduce)
    index = np.flatnonzero(rows)
    seeds = table[seed_column].to_numpy()[index] if seed_column else None
    return LawData(
        source=str(path),
        path="table",
        weights=list(weights),
        targets=list(targets),
        W=W[index],
        Y=Y[index],
        seeds=seeds if seeds is not None and len(np.unique(seeds)) >= 2 else None,
        proportion=[proportion] * len(targets),
        score=score,
        objective=TableObjective(reduce, list(targets), maximize).name,
        maximize=maximize,
        observed=score(Y[index]),
        labels=[f"row {i + 1}" for i in index],
        kind="table",
    )


def read_mixtures(path: Path | str, weights: Sequence[str], tolerance: float = WEIGHT_TOLERANCE) -> pl.DataFrame:
    """The mixtures ``--predict`` is asked about: a CSV or parquet file with a column per weight (the fitted
    table's names, or the sweep's tasks), checked as the table's weights are; other columns are kept."""
    path = Path(path)
    table = read_table(path)
    missing = [w for w in weights if w not in table.columns]
    if missing:
        raise AnalysisError(
            f"{path}: column {missing[0]}: no such weight column (the law's weights: {', '.join(weights)})"
        )
    if table.height == 0:
        raise AnalysisError(f"{path}: no rows")
    W = table_weights(path, table, list(weights), tolerance)
    return table.with_columns(pl.Series(w, W[:, i]) for i, w in enumerate(weights))


def predictions_frame(mixtures: pl.DataFrame, targets: Sequence[str], predictions: dict) -> pl.DataFrame:
    """``mixtures`` with the law's prediction beside each: ``predicted`` (the objective) with ``low`` / ``high``
    (95 % prediction interval of one run there) and ``mean_low`` / ``mean_high`` (of the law's mean), and each
    target's ``pred/<target>`` with its prediction interval."""
    columns = {
        "predicted": predictions["objective"],
        "low": predictions["low"],
        "high": predictions["high"],
        "mean_low": predictions["mean_low"],
        "mean_high": predictions["mean_high"],
    }
    for j, t in enumerate(targets):
        columns[f"pred/{t}"] = predictions["targets"][:, j]
        columns[f"pred/{t}/low"] = predictions["targets_low"][:, j]
        columns[f"pred/{t}/high"] = predictions["targets_high"][:, j]
    return mixtures.with_columns(pl.Series(name, np.asarray(v, dtype=float)) for name, v in columns.items())
