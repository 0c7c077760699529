"""What a mixing law is fitted to, whatever the results came from: :class:`LawData` (one row per run: the normalised
mixture ``W``, the targets ``Y``, the seeds, the objective that reduces the targets and its direction), built from
a sweep directory's trials here (:func:`sweep_law_data`) or from any table of results
(:mod:`analysis.mixture_table`). :mod:`analysis.mixture_proposal` fits, cross-validates and proposes from a
:class:`LawData` alone, so both inputs go through the same forms, the same cross-validation and the same support
check; :func:`cv_folds` is that cross-validation's split.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from analysis.frames import lower_is_better
from analysis.loading import AnalysisError
from analysis.mixture_fit import _choose_columns, _objective_weights, _scorer
from analysis.sweep import fit_objective, objective_columns, sweep_objective
from analysis.trials import complete
from harness.core.metrics import PROPORTION_METRICS

# Above this many rows, leave-one-out refits every form once per row (minutes on a table of hundreds): the rows
# are split into CV_FOLDS random folds instead. A sweep's few dozen trials keep leave-one-trial-out.
LEAVE_ONE_OUT_ROWS = 64
CV_FOLDS = 10


@dataclass
class LawData:
    """The rows a law is fitted to and what it optimises.

    ``W``: normalised mixtures (rows × ``weights``); ``Y``: targets (rows × ``targets``); ``observed``: each row's
    objective; ``score``: the objective from targets (one value per row of its argument); ``labels``: each row's
    name in reports (a trial number, a table row); ``varied``: other parameters that vary across rows (not in the
    fit, named in the notes); ``source``: the sweep directory or table file; ``path``: the simplex parameter."""

    source: str
    path: str
    weights: list[str]
    targets: list[str]
    W: np.ndarray
    Y: np.ndarray
    seeds: np.ndarray | None
    proportion: list[bool]
    score: Callable[[np.ndarray], np.ndarray]
    objective: str
    maximize: bool
    observed: np.ndarray
    labels: list[Any]
    metric: str = ""
    split: str = ""
    stage: str = ""
    varied: list[str] = field(default_factory=list)
    kind: str = "sweep"  # sweep | table

    def __len__(self) -> int:
        return len(self.W)

    @property
    def by_seed(self) -> bool:
        """The rows carry two seeds or more: laws are chosen by their leave-one-seed-out error."""
        return self.seeds is not None and len(np.unique(self.seeds)) >= 2


def cv_folds(n: int, seeds: np.ndarray | None, seed: int = 0) -> tuple[np.ndarray, str]:
    """The cross-validation's groups (rows of one group are held out together) and its name: one per seed when
    the rows carry seeds (rows of a seed share its noise), else one per row up to :data:`LEAVE_ONE_OUT_ROWS` rows,
    else :data:`CV_FOLDS` random folds of equal size."""
    if seeds is not None and len(np.unique(seeds)) >= 2:
        return np.asarray(seeds), "leave-one-seed-out"
    if n <= LEAVE_ONE_OUT_ROWS:
        return np.arange(n), "leave-one-trial-out"
    return np.random.default_rng(seed).permutation(n) % CV_FOLDS, f"{CV_FOLDS}-fold"


def objective_spec(config: Mapping[str, Any]) -> dict[str, Any]:
    """The sweep file's single objective, or an :class:`AnalysisError` when it has none or several."""
    if config.get("objectives"):
        raise AnalysisError("the sweep has several objectives (a Pareto front): no single mixture optimises them")
    if not config.get("objective"):
        raise AnalysisError("no objective in sweep.resolved.yaml: nothing to optimise")
    return sweep_objective(config)


def seed_column(data: pl.DataFrame) -> str | None:
    """The varied seed parameter of the trials (``param/seed``, or another ``param/…seed``), if any."""
    names = [c for c in data.columns if c.startswith("param/") and c.rsplit(".", 1)[-1].endswith("seed")]
    names.sort(key=lambda c: c != "param/seed")
    for c in names:
        if data[c].drop_nulls().n_unique() >= 2 and data[c].null_count() == 0:
            return c
    return None


def sweep_columns(trials: pl.DataFrame, objective: Mapping[str, Any], space: Mapping[str, Any]):
    """The simplex path and weights, the stage and targets, each target's column, the score and its direction."""
    try:
        path, weights, stage, targets, columns = _choose_columns(
            trials, objective["metric"], objective["split"], objective["stage"], None, None, space
        )
    except AnalysisError as e:
        raise AnalysisError(f"{e} (the sweep's objective reads them)") from e
    fit_args = fit_objective(objective, targets)
    target_weights, name = _objective_weights(fit_args["objective"], targets, fit_args.get("over"))
    used = [t for t, w in zip(targets, target_weights) if w > 0]  # fit only the tasks the objective reads
    target_weights = np.array([w for w in target_weights if w > 0])
    score = _scorer(fit_args["objective"], target_weights)
    direction = objective.get("direction")
    maximize = direction == "maximize" if direction else not lower_is_better(objective["metric"])
    return path, weights, stage, used, {t: columns[t] for t in used}, score, name, maximize


def sweep_matrices(trials: pl.DataFrame, path: str, weights: list[str], columns: Mapping[str, str]):
    """The complete trials with every weight and target, their normalised mixtures ``W`` and targets ``Y``."""
    data = complete(trials).drop_nulls([f"param/{path}.{w}" for w in weights] + list(columns.values()))
    W = data.select([f"param/{path}.{w}" for w in weights]).to_numpy().astype(float)
    W = W / W.sum(axis=1, keepdims=True)
    return data, W, data.select(list(columns.values())).to_numpy().astype(float)


def observed_objective(data: pl.DataFrame, Y: np.ndarray, score: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Each trial's objective as the sweep recorded it (its ``objective`` column), else reduced from its targets."""
    cols = objective_columns(data)
    if cols == ["objective"] and data["objective"].null_count() == 0:
        return data["objective"].to_numpy().astype(float)
    return score(Y)


def sweep_law_data(trials: pl.DataFrame, config: Mapping[str, Any], source: str = "") -> LawData:
    """A sweep's complete trials as :class:`LawData`: the swept simplex, the objective's tasks as targets, the
    sweep file's reduce and direction (``config``: ``sweep.resolved.yaml``)."""
    objective = objective_spec(config)
    path, weights, stage, targets, columns, score, name, maximize = sweep_columns(
        trials, objective, config.get("space") or {}
    )
    data, W, Y = sweep_matrices(trials, path, weights, columns)
    seed_col = seed_column(data)
    varied = [
        c[len("param/") :]
        for c in data.columns
        if c.startswith("param/") and not any(c == f"param/{path}.{w}" for w in weights) and data[c].n_unique() > 1
    ]
    return LawData(
        source=str(source),
        path=path,
        weights=weights,
        targets=targets,
        W=W,
        Y=Y,
        seeds=data[seed_col].to_numpy() if seed_col else None,
        proportion=[objective["metric"] in PROPORTION_METRICS] * len(targets),
        score=score,
        objective=name,
        maximize=maximize,
        observed=observed_objective(data, Y, score),
        labels=[int(x) for x in data["number"]] if "number" in data.columns else list(range(len(W))),
        metric=objective["metric"],
        split=objective["split"],
        stage=stage,
        varied=varied,
    )
