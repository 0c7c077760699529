"""Interference: a RegMix-style regression of each task's final metric on a sweep's mixture weights — which
weights move which task metrics (the interference matrix), how well the fit explains the trials, the mixture the
fitted model predicts best, and the model along each weight (partial dependence).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from analysis.frames import lower_is_better
from analysis.loading import AnalysisError
from analysis.trials import complete, metric_columns, simplex_groups, stage_of_path


@dataclass
class Interference:
    """The fit of ``metric(task) ~ mixture weights`` over a sweep's complete trials.

    - ``coef``: Scheffé coefficients, one row per weight (``weight`` column), one column per target task: the
      metric the model predicts for a stage made of that task alone (an extrapolation beyond the sweep's range);
    - ``effect``: the interference matrix — how much each target's metric moves when one task's weight rises by
      ``per`` (0.1), taken from the others in proportion, at the sweep's mean mixture. Negative off-diagonal cells
      are the seesaw;
    - ``r2`` / ``loo_r2`` / ``rmse`` per target (``loo_r2``: leave-one-out, the honest one), ``quality`` in words;
    - ``best_mixture``: RegMix's choice — the mean of the top predicted mixtures among many sampled inside the
      range the sweep explored — with ``best_predicted`` (per target) and ``best_objective``; ``best_observed``
      is the best complete trial, for comparison.
    """

    metric: str
    split: str
    stage: str
    path: str
    weights: list[str]
    targets: list[str]
    n: int
    degree: int
    per: float
    coef: pl.DataFrame
    effect: pl.DataFrame
    r2: dict[str, float]
    loo_r2: dict[str, float]
    rmse: dict[str, float]
    quality: str
    notes: list[str]
    objective: str
    maximize: bool
    best_mixture: dict[str, float]
    best_predicted: dict[str, float]
    best_objective: float
    best_observed: dict[str, Any]
    verdict: str = "none"  # good | fair | poor | none (nothing varies): from the median leave-one-out R²
    mean_mixture: dict[str, float] = field(default_factory=dict)
    weight_range: dict[str, tuple[float, float]] = field(default_factory=dict)
    _beta: np.ndarray = field(repr=False, default=None)  # type: ignore[assignment]
    _target_weights: np.ndarray = field(repr=False, default=None)  # type: ignore[assignment]

    def predict(self, mixture: Mapping[str, float] | Sequence[Mapping[str, float]]) -> pl.DataFrame:
        """Predicted target metrics for one mixture ``{task: weight}`` or several (normalised to sum 1)."""
        mixtures = [mixture] if isinstance(mixture, Mapping) else list(mixture)
        w = np.array([[float(m.get(t, 0.0)) for t in self.weights] for m in mixtures])
        w = w / w.sum(axis=1, keepdims=True)
        y = _design(w, self.degree) @ self._beta
        return pl.DataFrame({t: y[:, j] for j, t in enumerate(self.targets)})

    def statement(self) -> str:
        """The fit and its quality in two sentences (what a report prints under the heatmap)."""
        return self.quality

    def __repr__(self) -> str:
        best = ", ".join(f"{t} {w:.2f}" for t, w in self.best_mixture.items())
        return (
            f"Interference({self.metric}/{self.split} at the end of {self.stage!r} ~ weights of {self.path}: "
            f"{self.quality} Predicted best mixture: {best})"
        )


def _design(w: np.ndarray, degree: int) -> np.ndarray:
    """Scheffé mixture design: the weights (no intercept: they sum to 1), plus w_i·w_j for degree 2."""
    if degree == 1:
        return w
    k = w.shape[1]
    pairs = [w[:, i] * w[:, j] for i in range(k) for j in range(i + 1, k)]
    return np.column_stack([w, *pairs]) if pairs else w


def _choose_columns(
    trials: pl.DataFrame,
    metric: str,
    split: str,
    stage: str | None,
    path: str | None,
    targets: Sequence[str] | None,
    space: Mapping[str, Any],
) -> tuple[str, list[str], str, list[str], dict[str, str]]:
    """What :func:`interference` fits: the simplex ``path`` and its ``weights``, the ``stage`` whose final metrics
    are read, the ``targets`` and each target's ``metric/`` column (the defaults resolved, every choice checked)."""
    groups = simplex_groups(trials, space)
    if not groups:
        raise AnalysisError("no mixture weights in the trials (expected param/<path>.<task> columns summing to 1)")
    if path is None:
        path = list(groups)[-1]
    elif path not in groups:
        raise AnalysisError(f"no simplex parameter {path!r}; the sweep has {', '.join(groups)}")
    weights = groups[path]
    parsed = metric_columns(trials)
    chosen = parsed.filter(pl.col("metric") == metric, pl.col("split") == split)
    if chosen.is_empty():
        raise AnalysisError(f"no metric/<stage>/{split}/<task>/{metric} columns in the trials")
    stages = list(dict.fromkeys(parsed["stage"].to_list()))
    if stage is None:
        stage = stage_of_path(path, stages) if stage_of_path(path, stages) in chosen["stage"].to_list() else None
        stage = stage or list(dict.fromkeys(chosen["stage"].to_list()))[-1]
    chosen = chosen.filter(pl.col("stage") == stage)
    if chosen.is_empty():
        raise AnalysisError(f"no {metric}/{split} columns for stage {stage!r}; stages: {', '.join(stages)}")
    targets = list(targets) if targets is not None else chosen["task"].to_list()
    columns = {r["task"]: r["column"] for r in chosen.iter_rows(named=True)}
    missing = [t for t in targets if t not in columns]
    if missing:
        raise AnalysisError(f"no {metric}/{split} column at stage {stage!r} for {', '.join(missing)}")
    return path, weights, stage, targets, columns


def _least_squares(
    X: np.ndarray, Y: np.ndarray, targets: list[str]
) -> tuple[np.ndarray, dict[str, float], dict[str, float], dict[str, float], list[str]]:
    """The OLS fit of every target column of ``Y`` on ``X``: ``beta``, ``r2``, ``loo_r2`` and ``rmse`` per target,
    and the targets that do not vary (their R² is NaN)."""
    beta, *_ = np.linalg.lstsq(X, Y, rcond=None)
    fitted = X @ beta
    resid = Y - fitted
    # Leave-one-out residuals without refitting: e_i / (1 - h_ii), h the hat matrix's diagonal.
    h = np.einsum("ij,ji->i", X, np.linalg.pinv(X.T @ X) @ X.T)
    loo = resid / np.clip(1.0 - h, 1e-9, None)[:, None]
    r2, loo_r2, rmse = {}, {}, {}
    constant = []
    for j, t in enumerate(targets):
        ss_tot = float(((Y[:, j] - Y[:, j].mean()) ** 2).sum())
        rmse[t] = float(np.sqrt((resid[:, j] ** 2).mean()))
        if ss_tot <= 1e-12:
            constant.append(t)
            r2[t] = loo_r2[t] = float("nan")
        else:
            r2[t] = 1.0 - float((resid[:, j] ** 2).sum()) / ss_tot
            loo_r2[t] = 1.0 - float((loo[:, j] ** 2).sum()) / ss_tot
    return beta, r2, loo_r2, rmse, constant


def _effect_matrix(mean: np.ndarray, beta: np.ndarray, degree: int, per: float, n_targets: int) -> np.ndarray:
    """The interference matrix: raise weight i by ``per``, taking it from the others in proportion, at the mean
    mixture; row i holds the predicted change of every target (a central difference of the fitted model)."""
    k = len(mean)
    effect = np.zeros((k, n_targets))
    for i in range(k):
        others = mean.copy()
        others[i] = 0.0
        direction = -others / max(others.sum(), 1e-12)
        direction[i] = 1.0
        eps = 1e-4
        up = _design((mean + eps * direction)[None, :], degree) @ beta
        down = _design((mean - eps * direction)[None, :], degree) @ beta
        effect[i] = (up - down)[0] / (2 * eps) * per
    return effect


def _scorer(objective: str | Mapping[str, float], target_weights: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The objective over predicted (or observed) targets, one row per mixture."""
    reduced = target_weights > 0

    def score(pred: np.ndarray) -> np.ndarray:
        if objective == "min":  # the smallest of the tasks reduced over (the worst one, when higher is better)
            return pred[:, reduced].min(axis=1)
        if objective == "max":
            return pred[:, reduced].max(axis=1)
        return pred @ target_weights

    return score


def _search_best(
    W: np.ndarray,
    beta: np.ndarray,
    degree: int,
    score: Callable[[np.ndarray], np.ndarray],
    maximize: bool,
    candidates: int,
    top: float,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, float]:
    """RegMix search: many mixtures inside the explored box, the top ones averaged (robust to a flat optimum).
    Returns the best mixture, its predicted targets and its predicted objective."""
    k = W.shape[1]
    rng = np.random.default_rng(seed)
    cand = rng.dirichlet(np.ones(k), size=candidates)
    lo, hi = W.min(axis=0) - 1e-9, W.max(axis=0) + 1e-9
    cand = np.vstack([cand[((cand >= lo) & (cand <= hi)).all(axis=1)], W])
    s = score(_design(cand, degree) @ beta)
    order = np.argsort(-s if maximize else s)
    n_top = max(1, int(round(top * len(cand))))
    best = cand[order[:n_top]].mean(axis=0)
    best_pred = (_design(best[None, :], degree) @ beta)[0]
    best_obj = float(score(best_pred[None, :])[0])
    return best, best_pred, best_obj


def _best_observed(
    data: pl.DataFrame,
    W: np.ndarray,
    Y: np.ndarray,
    observed: np.ndarray,
    maximize: bool,
    weights: list[str],
    targets: list[str],
) -> dict[str, Any]:
    """The best complete trial by the objective: its number, mixture, target metrics and objective."""
    b = int(np.argmax(observed) if maximize else np.argmin(observed))
    return {
        "number": data["number"][b] if "number" in data.columns else b,
        "mixture": {w: float(W[b, i]) for i, w in enumerate(weights)},
        "metrics": {t: float(Y[b, j]) for j, t in enumerate(targets)},
        "objective": float(observed[b]),
    }


def _fit_notes(
    trials: pl.DataFrame, data: pl.DataFrame, path: str, weights: list[str], n: int, p: int, constant: list[str]
) -> list[str]:
    """Caveats of a fit, in words: few trials per coefficient, targets that never vary, other varied parameters."""
    notes = []
    if n < 3 * p:
        notes.append(f"only {n / p:.1f} trials per coefficient: read the coefficients as rough")
    if constant:
        notes.append(f"{', '.join(constant)}: the same value in every trial (nothing to explain)")
    other_params = [
        c[len("param/") :]
        for c in trials.columns
        if c.startswith("param/")
        and not any(c == f"param/{path}.{w}" for w in weights)
        and data.select(pl.col(c).n_unique()).item() > 1
    ]
    if other_params:
        notes.append(f"also varied, not in the model (their effect is in the residual): {', '.join(other_params)}")
    return notes


def _verdict(targets: list[str], loo_r2: dict[str, float]) -> str:
    """good / fair / poor from the median leave-one-out R² of the targets that vary; none when none does."""
    varying = [loo_r2[t] for t in targets if not math.isnan(loo_r2[t])]
    median_loo = float(np.median(varying)) if varying else float("nan")
    return "none" if not varying else "good" if median_loo >= 0.7 else "fair" if median_loo >= 0.4 else "poor"


def interference(
    trials: pl.DataFrame,
    metric: str = "greedy",
    split: str = "heldout",
    *,
    stage: str | None = None,
    path: str | None = None,
    targets: Sequence[str] | None = None,
    objective: str | Mapping[str, float] = "mean",
    over: Sequence[str] | None = None,
    maximize: bool | None = None,
    per: float = 0.1,
    degree: int = 1,
    space: Mapping[str, Any] | None = None,
    candidates: int = 20000,
    top: float = 0.01,
    seed: int = 0,
) -> Interference:
    """Fit each task's ``metric`` on ``split`` at the end of ``stage`` against the mixture weights of the simplex
    parameter ``path``, over the complete trials — the RegMix recipe (Liu et al. 2024: regress the target on the
    mixture, then search the simplex with the fitted model).

    The model is Scheffé's mixture regression ``y_t = Σ_i β_it w_i`` (``degree=2`` adds the ``w_i w_j`` terms);
    it has no intercept because the weights sum to one. Fitted by ordinary least squares with numpy: this is
    written here because no maintained package fits mixture regressions and searches the simplex (RegMix's own
    code is a research script around LightGBM); a linear fit is what a sweep of a few dozen trials can support.

    - ``stage``: whose final metrics (default: the stage the weights belong to, else the last stage);
    - ``path``: which simplex (default: the only one; with several, the last);
    - ``targets``: the tasks whose metric is modelled (default: every task with that metric column);
    - ``objective``: what "best mixture" optimises over the predicted targets: ``mean``, ``min``, ``max`` (as the
      sweep file's ``reduce``), a task name, or ``{task: weight}``; ``over``: the targets ``mean`` / ``min`` /
      ``max`` reduce over (default all);
      ``maximize`` defaults to the metric's direction (greedy up, loss down).
    """
    path, weights, stage, targets, columns = _choose_columns(trials, metric, split, stage, path, targets, space or {})
    maximize = (not lower_is_better(metric)) if maximize is None else maximize

    data, W, Y, X = _regression_data(trials, path, weights, targets, columns, degree)
    n, k, p = data.height, len(weights), X.shape[1]
    beta, r2, loo_r2, rmse, constant = _least_squares(X, Y, targets)
    mean = W.mean(axis=0)
    effect = _effect_matrix(mean, beta, degree, per, len(targets))

    target_weights, objective_name = _objective_weights(objective, targets, over)
    score = _scorer(objective, target_weights)
    best, best_pred, best_obj = _search_best(W, beta, degree, score, maximize, candidates, top, seed)
    best_observed = _best_observed(data, W, Y, score(Y), maximize, weights, targets)

    notes = _fit_notes(trials, data, path, weights, n, p, constant)
    quality = _quality(targets, r2, loo_r2, n, k, degree, notes)
    return Interference(
        metric=metric,
        split=split,
        stage=stage,
        path=path,
        weights=weights,
        targets=targets,
        n=n,
        degree=degree,
        per=per,
        coef=_per_weight_frame(weights, targets, beta[:k]),
        effect=_per_weight_frame(weights, targets, effect),
        r2=r2,
        loo_r2=loo_r2,
        rmse=rmse,
        quality=quality,
        notes=notes,
        objective=objective_name,
        maximize=maximize,
        best_mixture={w: float(best[i]) for i, w in enumerate(weights)},
        best_predicted={t: float(best_pred[j]) for j, t in enumerate(targets)},
        best_objective=best_obj,
        best_observed=best_observed,
        verdict=_verdict(targets, loo_r2),
        mean_mixture={w: float(mean[i]) for i, w in enumerate(weights)},
        weight_range={w: (float(W[:, i].min()), float(W[:, i].max())) for i, w in enumerate(weights)},
        _beta=beta,
        _target_weights=target_weights,
    )


def _regression_data(
    trials: pl.DataFrame, path: str, weights: list[str], targets: list[str], columns: dict[str, str], degree: int
) -> tuple[pl.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
    """The complete trials that have every weight and target (``data``), their weights normalised to sum to one
    (``W``), their targets (``Y``) and the design matrix (``X``); too few trials for the coefficients is an error."""
    data = complete(trials).drop_nulls([f"param/{path}.{w}" for w in weights] + [columns[t] for t in targets])
    n, k = data.height, len(weights)
    W = data.select([f"param/{path}.{w}" for w in weights]).to_numpy().astype(float)
    W = W / W.sum(axis=1, keepdims=True)
    Y = data.select([columns[t] for t in targets]).to_numpy().astype(float)
    X = _design(W, degree)
    p = X.shape[1]
    if n <= p:
        raise AnalysisError(
            f"{n} complete trials cannot fit {p} coefficients (degree {degree} over {k} weights); "
            f"run more than {p} trials"
        )
    return data, W, Y, X


def _per_weight_frame(weights: list[str], targets: list[str], matrix: np.ndarray) -> pl.DataFrame:
    """One row per weight, one column per target, from a ``[weight, target]`` matrix."""
    return pl.DataFrame({"weight": weights, **{t: matrix[:, j] for j, t in enumerate(targets)}})


def _objective_weights(
    objective: str | Mapping[str, float], targets: list[str], over: Sequence[str] | None = None
) -> tuple[np.ndarray, str]:
    """The weight of each target in the objective (``min`` / ``max`` use the positive ones as a mask) and the
    objective's name as a report prints it."""
    if over is not None and isinstance(objective, str) and objective in ("mean", "min", "max"):
        unknown = [t for t in over if t not in targets]
        if unknown or not over:
            raise AnalysisError(
                f"over: {', '.join(unknown) or 'no tasks'} not among the targets ({', '.join(targets)})"
            )
        w = np.array([1.0 if t in over else 0.0 for t in targets])
        return w / w.sum(), f"{objective} of {', '.join(t for t in targets if t in over)}"
    if isinstance(objective, Mapping):
        unknown = [t for t in objective if t not in targets]
        if unknown:
            raise AnalysisError(f"objective names tasks that are not targets: {', '.join(unknown)}")
        w = np.array([float(objective.get(t, 0.0)) for t in targets])
        w = w / w.sum()
        return w, "weighted " + ", ".join(f"{t} {objective[t]:g}" for t in objective)
    if objective == "mean":
        return np.full(len(targets), 1.0 / len(targets)), "mean"
    if objective in ("min", "max"):
        return np.full(len(targets), 1.0 / len(targets)), objective
    if objective in targets:
        return np.array([1.0 if t == objective else 0.0 for t in targets]), objective
    raise AnalysisError(
        f"objective {objective!r}: use mean, min, max, a target task ({', '.join(targets)}) or {{task: weight}}"
    )


def _quality(targets, r2, loo_r2, n, k, degree, notes) -> str:
    """The fit's quality in words: the model, the verdict from the median leave-one-out R², R² per target, notes."""
    fitted = [t for t in targets if not math.isnan(loo_r2[t])]
    model = "linear" if degree == 1 else "quadratic"
    head = f"{model} mixture model over {k} weights, {n} complete trials"
    if not fitted:
        return f"{head}: no target varies across trials, nothing to fit."
    med = float(np.median([loo_r2[t] for t in fitted]))
    verdict = (
        "good fit — the matrix can be trusted"
        if med >= 0.7
        else "fair fit — trust the large cells, not the small ones"
        if med >= 0.4
        else "poor fit — the weights explain little; do not trust the matrix or the predicted best mixture"
    )
    per_task = "; ".join(f"{t} R² {r2[t]:.2f} (LOO {loo_r2[t]:.2f})" for t in fitted)
    text = f"{head}: {verdict} (median leave-one-out R² {med:.2f}). {per_task}."
    if notes:
        text += " Note: " + "; ".join(notes) + "."
    return text


def partial_dependence(fit: Interference, points: int = 41) -> pl.DataFrame:
    """The fitted model along each weight: ``weight, value, target, predicted`` — the predicted metric of each
    target as one task's weight goes from its smallest to its largest value in the sweep, the others keeping their
    mean proportions."""
    mean = np.array([fit.mean_mixture[w] for w in fit.weights])
    rows = []
    for i, w in enumerate(fit.weights):
        lo, hi = fit.weight_range[w]
        others = mean.copy()
        others[i] = 0.0
        others = others / max(others.sum(), 1e-12)
        for x in np.linspace(lo, hi, points):
            mix = others * (1 - x)
            mix[i] = x
            pred = (_design(mix[None, :], fit.degree) @ fit._beta)[0]
            rows.extend(
                {"weight": w, "value": float(x), "target": t, "predicted": float(pred[j])}
                for j, t in enumerate(fit.targets)
            )
    return pl.DataFrame(rows)
