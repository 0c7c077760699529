"""Analyses of a sweep's trials frame (:func:`analysis.load_sweep`): the Pareto front, the best trials, and the
choices a report or notebook makes from the sweep file's objective. Also the one import for every sweep analysis:
reading the trials' columns (:mod:`analysis.trials`) and the mixture interference fit (:mod:`analysis.mixture_fit`)
are re-exported here.

Trials columns used here: ``state``, ``param/<path>.<task>`` (normalised simplex weights, e.g.
``param/stages[2].mixture.yesno``), ``metric/<stage>/<split>/<task>/<metric>`` (final per-task metrics per stage),
``objective`` or ``objective_0, objective_1, …``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from analysis.frames import lower_is_better
from analysis.loading import AnalysisError, is_run_dir
from analysis.mixture_fit import Interference, interference, partial_dependence
from analysis.trials import (
    SIMPLEX_TOLERANCE,
    complete,
    metric_columns,
    objective_columns,
    simplex_groups,
)

__all__ = [
    "SIMPLEX_TOLERANCE",
    "Interference",
    "best_trial_dir",
    "best_trials",
    "complete",
    "fit_objective",
    "interference",
    "metric_columns",
    "objective_columns",
    "objective_directions",
    "pareto",
    "partial_dependence",
    "simplex_groups",
    "sweep_objective",
    "tradeoff_pair",
]


# ----------------------------------------------------------------------------------------------------------------
# Pareto, best trials
# ----------------------------------------------------------------------------------------------------------------


def pareto(trials: pl.DataFrame, metrics: Sequence[str], directions: Sequence[str] | None = None) -> pl.DataFrame:
    """The complete trials with a ``pareto`` column: True where no other trial is at least as good on every one of
    ``metrics`` (columns of the trials frame) and better on one. ``directions``: ``max`` / ``min`` per metric
    (default: by the metric's name — greedy up, loss / rank / hijack down; objectives up). Sorted by the first
    metric, best first."""
    metrics = list(metrics)
    missing = [m for m in metrics if m not in trials.columns]
    if missing:
        raise AnalysisError(f"no column {', '.join(missing)} in the trials")
    if directions is None:
        directions = ["min" if lower_is_better(m) else "max" for m in metrics]
    if len(directions) != len(metrics) or any(d not in ("max", "min") for d in directions):
        raise AnalysisError("directions: one of max / min per metric")
    data = complete(trials).drop_nulls(metrics)
    values = data.select(metrics).to_numpy().astype(float)
    signs = np.array([1.0 if d == "max" else -1.0 for d in directions])
    v = values * signs  # larger is better everywhere
    n = len(v)
    dominated = np.zeros(n, dtype=bool)
    for i in range(n):
        better_eq = (v >= v[i]).all(axis=1)
        strictly = (v > v[i]).any(axis=1)
        dominated[i] = bool((better_eq & strictly).any())
    out = data.with_columns(pl.Series("pareto", ~dominated))
    return out.sort(metrics[0], descending=directions[0] == "max")


def best_trials(trials: pl.DataFrame, n: int = 10, by: str | None = None, maximize: bool | None = None) -> pl.DataFrame:
    """The ``n`` best complete trials by ``by`` (default: the objective; the first one of several)."""
    cols = objective_columns(trials)
    by = by or (cols[0] if cols else None)
    if by is None:
        raise AnalysisError("no objective column; name one with by=")
    maximize = (not lower_is_better(by)) if maximize is None else maximize
    return complete(trials).drop_nulls(by).sort(by, descending=maximize).head(n)


# ----------------------------------------------------------------------------------------------------------------
# The sweep file's objective, and choices a report or notebook makes from it
# ----------------------------------------------------------------------------------------------------------------


def sweep_objective(config: Mapping[str, Any]) -> dict[str, Any]:
    """The (first) objective of a sweep file (``sweep.resolved.yaml``): ``{metric, split, stage, tasks, reduce,
    weights}``, defaults filled in (greedy on heldout, mean over every task, the last stage)."""
    obj = config.get("objective")
    if not obj and config.get("objectives"):
        obj = config["objectives"][0]
    obj = obj if isinstance(obj, Mapping) else {}
    return {
        "metric": obj.get("metric") or "greedy",
        "split": obj.get("split") or "heldout",
        "stage": obj.get("stage"),
        "tasks": obj.get("tasks"),
        "reduce": obj.get("reduce") or "mean",
        "weights": obj.get("weights"),
        "direction": obj.get("direction"),
    }


def objective_directions(config: Mapping[str, Any], columns: Sequence[str]) -> list[str]:
    """``max`` / ``min`` for each objective column, from the sweep file's ``direction`` (default: by the metric's
    name — greedy up; loss, rank and hijack down)."""
    specs = config.get("objectives") or ([config["objective"]] if config.get("objective") else [])
    out = []
    for i, _ in enumerate(columns):
        spec = specs[i] if i < len(specs) and isinstance(specs[i], Mapping) else {}
        direction = spec.get("direction")
        if direction is None:
            direction = "minimize" if lower_is_better(spec.get("metric") or "greedy") else "maximize"
        out.append("max" if direction == "maximize" else "min")
    return out


def fit_objective(objective: Mapping[str, Any], targets: Sequence[str]) -> dict[str, Any]:
    """The sweep's objective as :func:`interference` arguments (``objective=`` and ``over=``), so the predicted
    best mixture optimises what the study optimised."""
    tasks = [t for t in (objective.get("tasks") or []) if t in targets]
    reduce = objective.get("reduce") or "mean"
    if reduce == "weighted" and objective.get("weights"):
        return {"objective": {t: float(w) for t, w in objective["weights"].items() if t in targets}}
    return {"objective": reduce if reduce in ("min", "max") else "mean", "over": tasks or None}


def tradeoff_pair(
    trials: pl.DataFrame,
    objectives: Sequence[str],
    metric: str = "greedy",
    split: str = "heldout",
    stage: str | None = None,
) -> tuple[str, str, str] | None:
    """Two columns worth a Pareto plot, and why: the study's first two objectives when it has several; otherwise
    the two task metrics (``metric`` on ``split`` at the end of ``stage``, default the last) that are most
    negatively correlated across complete trials — the sweep's seesaw. None when no pair varies."""
    if len(objectives) >= 2:
        return objectives[0], objectives[1], "The study's first two objectives."
    cols = metric_columns(trials).filter(pl.col("metric") == metric, pl.col("split") == split)
    stages = cols["stage"].unique(maintain_order=True).to_list()
    cols = cols.filter(pl.col("stage") == (stage if stage in stages else (stages[-1] if stages else None)))
    names = cols["column"].to_list()
    done = complete(trials).drop_nulls(names) if names else complete(trials)
    best = None
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            if done.height > 2 and done[a].std() and done[b].std():
                r = float(done.select(pl.corr(a, b)).item())
                if best is None or r < best[0]:
                    best = (r, a, b)
    if best is None:
        return None
    r, a, b = best
    return (
        a,
        b,
        (f"Single-objective study: the two task metrics that trade off most across trials (correlation {r:+.2f})."),
    )


def best_trial_dir(trials: pl.DataFrame, sweep_dir: Any, maximize: bool = True) -> Any | None:
    """The run directory of the best complete trial (by the first objective), or None when it is not there."""
    objectives = objective_columns(trials)
    if not objectives or "trial_dir" not in trials.columns or complete(trials).is_empty():
        return None
    best = best_trials(trials, 1, objectives[0], maximize)
    if best.is_empty() or best["trial_dir"][0] is None:
        return None
    d = Path(best["trial_dir"][0])
    d = d if d.is_absolute() else Path(sweep_dir) / d
    return d if is_run_dir(d) else None
