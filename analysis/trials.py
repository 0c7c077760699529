"""Reading the columns of a sweep's trials frame (:func:`analysis.load_sweep`): which trials completed, which
``param/`` columns form a mixture simplex, what the ``metric/`` and objective columns hold.

Trials columns used here: ``state``, ``param/<path>.<task>`` (normalised simplex weights, e.g.
``param/stages[2].mixture.yesno``), ``metric/<stage>/<split>/<task>/<metric>`` (final per-task metrics per stage),
``objective`` or ``objective_0, objective_1, …``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl

# How far from 1 one trial's weights may sum and still count as a simplex.
SIMPLEX_TOLERANCE = 1e-3

_METRIC_COLUMN = re.compile(r"^metric/(?P<stage>[^/]+)/(?P<split>[^/]+)/(?P<task>[^/]+)/(?P<metric>[^/]+)$")


def complete(trials: pl.DataFrame) -> pl.DataFrame:
    """Only the trials that finished (``state == COMPLETE``; every trial when there is no state column)."""
    return trials.filter(pl.col("state") == "COMPLETE") if "state" in trials.columns else trials


def simplex_groups(trials: pl.DataFrame, space: Mapping[str, Any] | None = None) -> dict[str, list[str]]:
    """The simplex parameters of a sweep: ``{path: [task, …]}``, e.g. ``{"stages[2].mixture": ["yesno", …]}``.

    From the sweep file's ``space`` (entries ``{simplex: [tasks]}``) when given; otherwise every group of
    ``param/<path>.<name>`` columns (two or more) whose values sum to 1 on every complete trial.
    """
    params = [c for c in trials.columns if c.startswith("param/")]
    groups: dict[str, list[str]] = {}
    if space:
        for path, spec in space.items():
            if isinstance(spec, Mapping) and "simplex" in spec:
                tasks = [t for t in spec["simplex"] if f"param/{path}.{t}" in params]
                if tasks:
                    groups[path] = tasks
        if groups:
            return groups
    candidates: dict[str, list[str]] = {}
    for column in params:
        path, _, name = column[len("param/") :].rpartition(".")
        if path and name and re.fullmatch(r"[A-Za-z0-9_-]+", name):
            candidates.setdefault(path, []).append(name)
    done = complete(trials)
    for path, names in candidates.items():
        if len(names) < 2:
            continue
        cols = [f"param/{path}.{n}" for n in names]
        if not all(done.schema[c].is_numeric() for c in cols):
            continue
        sums = done.select(pl.sum_horizontal(cols).alias("s")).drop_nulls()["s"]
        if sums.len() and ((sums - 1.0).abs() <= SIMPLEX_TOLERANCE).all():
            groups[path] = names
    return groups


def metric_columns(trials: pl.DataFrame) -> pl.DataFrame:
    """The ``metric/<stage>/<split>/<task>/<metric>`` columns parsed: ``column, stage, split, task, metric``, in
    column order (which is the curriculum order of the stages as the sweep wrote them)."""
    rows = [{"column": c, **m.groupdict()} for c in trials.columns if (m := _METRIC_COLUMN.match(c))]
    return pl.DataFrame(
        rows, schema={"column": pl.Utf8, "stage": pl.Utf8, "split": pl.Utf8, "task": pl.Utf8, "metric": pl.Utf8}
    )


def objective_columns(trials: pl.DataFrame) -> list[str]:
    """``["objective"]`` or ``["objective_0", "objective_1", …]`` (whichever the sweep wrote)."""
    multi = sorted((c for c in trials.columns if re.fullmatch(r"objective_\d+", c)), key=lambda c: int(c[10:]))
    return multi or (["objective"] if "objective" in trials.columns else [])


def stage_of_path(path: str, stages: Sequence[str]) -> str | None:
    """The stage a space path points into: ``stages[2].mixture`` → the third stage; ``stages.assistant...``."""
    m = re.match(r"stages\[(\d+)\]", path)
    if m and int(m.group(1)) < len(stages):
        return stages[int(m.group(1))]
    m = re.match(r"stages\.([^.]+)", path)
    return m.group(1) if m and m.group(1) in stages else None
