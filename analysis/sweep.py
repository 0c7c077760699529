"""Analyses of a sweep's trials frame (:func:`analysis.load_sweep`): which mixture weights move which task metrics
(interference), the Pareto front, and the best trials.

Trials columns used here: ``state``, ``param/<path>.<task>`` (normalised simplex weights, e.g.
``param/stages[2].mixture.yesno``), ``metric/<stage>/<split>/<task>/<metric>`` (final per-task metrics per stage),
``objective`` or ``objective_0, objective_1, …``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import polars as pl

from analysis.frames import lower_is_better
from analysis.io import AnalysisError

SIMPLEX_TOLERANCE = 1e-3


# ----------------------------------------------------------------------------------------------------------------
# Reading the columns
# ----------------------------------------------------------------------------------------------------------------


def complete(trials: pl.DataFrame) -> pl.DataFrame:
    """Only the trials that finished (``state == COMPLETE``; every trial when there is no state column)."""
    return trials.filter(pl.col("state") == "COMPLETE") if "state" in trials.columns else trials


def simplex_groups(trials: pl.DataFrame, space: Optional[Mapping[str, Any]] = None) -> dict[str, list[str]]:
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
        path, _, name = column[len("param/"):].rpartition(".")
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


_METRIC_COLUMN = re.compile(r"^metric/(?P<stage>[^/]+)/(?P<split>[^/]+)/(?P<task>[^/]+)/(?P<metric>[^/]+)$")


def metric_columns(trials: pl.DataFrame) -> pl.DataFrame:
    """The ``metric/<stage>/<split>/<task>/<metric>`` columns parsed: ``column, stage, split, task, metric``, in
    column order (which is the curriculum order of the stages as the sweep wrote them)."""
    rows = [{"column": c, **m.groupdict()} for c in trials.columns if (m := _METRIC_COLUMN.match(c))]
    return pl.DataFrame(rows, schema={"column": pl.Utf8, "stage": pl.Utf8, "split": pl.Utf8, "task": pl.Utf8,
                                      "metric": pl.Utf8})


def objective_columns(trials: pl.DataFrame) -> list[str]:
    """``["objective"]`` or ``["objective_0", "objective_1", …]`` (whichever the sweep wrote)."""
    multi = sorted((c for c in trials.columns if re.fullmatch(r"objective_\d+", c)), key=lambda c: int(c[10:]))
    return multi or (["objective"] if "objective" in trials.columns else [])


def _stage_of_path(path: str, stages: Sequence[str]) -> Optional[str]:
    """The stage a space path points into: ``stages[2].mixture`` → the third stage; ``stages.assistant...``."""
    m = re.match(r"stages\[(\d+)\]", path)
    if m and int(m.group(1)) < len(stages):
        return stages[int(m.group(1))]
    m = re.match(r"stages\.([^.]+)", path)
    return m.group(1) if m and m.group(1) in stages else None


# ----------------------------------------------------------------------------------------------------------------
# Interference: a RegMix-style regression of each task's metric on the mixture weights
# ----------------------------------------------------------------------------------------------------------------


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

    def predict(self, mixture: Union[Mapping[str, float], Sequence[Mapping[str, float]]]) -> pl.DataFrame:
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
        return (f"Interference({self.metric}/{self.split} at the end of {self.stage!r} ~ weights of {self.path}: "
                f"{self.quality} Predicted best mixture: {best})")


def _design(w: np.ndarray, degree: int) -> np.ndarray:
    """Scheffé mixture design: the weights (no intercept: they sum to 1), plus w_i·w_j for degree 2."""
    if degree == 1:
        return w
    k = w.shape[1]
    pairs = [w[:, i] * w[:, j] for i in range(k) for j in range(i + 1, k)]
    return np.column_stack([w, *pairs]) if pairs else w


def interference(trials: pl.DataFrame, metric: str = "greedy", split: str = "heldout", *,
                 stage: Optional[str] = None, path: Optional[str] = None, targets: Optional[Sequence[str]] = None,
                 objective: Union[str, Mapping[str, float]] = "mean", over: Optional[Sequence[str]] = None,
                 maximize: Optional[bool] = None,
                 per: float = 0.1, degree: int = 1, space: Optional[Mapping[str, Any]] = None,
                 candidates: int = 20000, top: float = 0.01, seed: int = 0) -> Interference:
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
    space = space or {}
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
        stage = _stage_of_path(path, stages) if _stage_of_path(path, stages) in chosen["stage"].to_list() else None
        stage = stage or list(dict.fromkeys(chosen["stage"].to_list()))[-1]
    chosen = chosen.filter(pl.col("stage") == stage)
    if chosen.is_empty():
        raise AnalysisError(f"no {metric}/{split} columns for stage {stage!r}; stages: {', '.join(stages)}")
    targets = list(targets) if targets is not None else chosen["task"].to_list()
    columns = {r["task"]: r["column"] for r in chosen.iter_rows(named=True)}
    missing = [t for t in targets if t not in columns]
    if missing:
        raise AnalysisError(f"no {metric}/{split} column at stage {stage!r} for {', '.join(missing)}")
    maximize = (not lower_is_better(metric)) if maximize is None else maximize

    data = complete(trials).drop_nulls([f"param/{path}.{w}" for w in weights] + [columns[t] for t in targets])
    n, k = data.height, len(weights)
    W = data.select([f"param/{path}.{w}" for w in weights]).to_numpy().astype(float)
    W = W / W.sum(axis=1, keepdims=True)
    Y = data.select([columns[t] for t in targets]).to_numpy().astype(float)
    X = _design(W, degree)
    p = X.shape[1]
    if n <= p:
        raise AnalysisError(f"{n} complete trials cannot fit {p} coefficients (degree {degree} over {k} weights); "
                            f"run more than {p} trials")
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

    # The interference matrix: raise weight i by `per`, taking it from the others in proportion, at the mean mixture.
    mean = W.mean(axis=0)
    effect = np.zeros((k, len(targets)))
    for i in range(k):
        others = mean.copy()
        others[i] = 0.0
        direction = -others / max(others.sum(), 1e-12)
        direction[i] = 1.0
        eps = 1e-4
        up = _design((mean + eps * direction)[None, :], degree) @ beta
        down = _design((mean - eps * direction)[None, :], degree) @ beta
        effect[i] = (up - down)[0] / (2 * eps) * per

    target_weights, objective_name = _objective_weights(objective, targets, over)
    reduced = target_weights > 0

    def score(pred: np.ndarray) -> np.ndarray:
        if objective == "min":  # the smallest of the tasks reduced over (the worst one, when higher is better)
            return pred[:, reduced].min(axis=1)
        if objective == "max":
            return pred[:, reduced].max(axis=1)
        return pred @ target_weights

    # RegMix search: many mixtures inside the explored box, the top ones averaged (robust to a flat optimum).
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

    observed = score(Y)
    b = int(np.argmax(observed) if maximize else np.argmin(observed))
    best_observed = {
        "number": data["number"][b] if "number" in data.columns else b,
        "mixture": {w: float(W[b, i]) for i, w in enumerate(weights)},
        "metrics": {t: float(Y[b, j]) for j, t in enumerate(targets)},
        "objective": float(observed[b]),
    }

    notes = []
    if n < 3 * p:
        notes.append(f"only {n / p:.1f} trials per coefficient: read the coefficients as rough")
    if constant:
        notes.append(f"{', '.join(constant)}: the same value in every trial (nothing to explain)")
    other_params = [c[len("param/"):] for c in trials.columns if c.startswith("param/")
                    and not any(c == f"param/{path}.{w}" for w in weights)
                    and data.select(pl.col(c).n_unique()).item() > 1]
    if other_params:
        notes.append(f"also varied, not in the model (their effect is in the residual): {', '.join(other_params)}")
    quality = _quality(targets, r2, loo_r2, n, k, degree, notes)
    varying = [loo_r2[t] for t in targets if not math.isnan(loo_r2[t])]
    median_loo = float(np.median(varying)) if varying else float("nan")
    verdict = ("none" if not varying else "good" if median_loo >= 0.7 else "fair" if median_loo >= 0.4
               else "poor")

    coef = pl.DataFrame({"weight": weights,
                         **{t: beta[:k, j] for j, t in enumerate(targets)}})
    effect_frame = pl.DataFrame({"weight": weights, **{t: effect[:, j] for j, t in enumerate(targets)}})
    return Interference(
        metric=metric, split=split, stage=stage, path=path, weights=weights, targets=targets, n=n, degree=degree,
        per=per, coef=coef, effect=effect_frame, r2=r2, loo_r2=loo_r2, rmse=rmse, quality=quality, notes=notes,
        objective=objective_name, maximize=maximize,
        best_mixture={w: float(best[i]) for i, w in enumerate(weights)},
        best_predicted={t: float(best_pred[j]) for j, t in enumerate(targets)},
        best_objective=best_obj, best_observed=best_observed, verdict=verdict,
        mean_mixture={w: float(mean[i]) for i, w in enumerate(weights)},
        weight_range={w: (float(W[:, i].min()), float(W[:, i].max())) for i, w in enumerate(weights)},
        _beta=beta, _target_weights=target_weights,
    )


def _objective_weights(objective: Union[str, Mapping[str, float]], targets: list[str],
                       over: Optional[Sequence[str]] = None) -> tuple[np.ndarray, str]:
    if over is not None and isinstance(objective, str) and objective in ("mean", "min", "max"):
        unknown = [t for t in over if t not in targets]
        if unknown or not over:
            raise AnalysisError(f"over: {', '.join(unknown) or 'no tasks'} not among the targets "
                                f"({', '.join(targets)})")
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
    raise AnalysisError(f"objective {objective!r}: use mean, min, max, a target task ({', '.join(targets)}) "
                        "or {task: weight}")


def _quality(targets, r2, loo_r2, n, k, degree, notes) -> str:
    fitted = [t for t in targets if not math.isnan(loo_r2[t])]
    model = "linear" if degree == 1 else "quadratic"
    head = f"{model} mixture model over {k} weights, {n} complete trials"
    if not fitted:
        return f"{head}: no target varies across trials, nothing to fit."
    med = float(np.median([loo_r2[t] for t in fitted]))
    verdict = ("good fit — the matrix can be trusted" if med >= 0.7 else
               "fair fit — trust the large cells, not the small ones" if med >= 0.4 else
               "poor fit — the weights explain little; do not trust the matrix or the predicted best mixture")
    per_task = "; ".join(f"{t} R² {r2[t]:.2f} (LOO {loo_r2[t]:.2f})" for t in fitted)
    text = f"{head}: {verdict} (median leave-one-out R² {med:.2f}). {per_task}."
    if notes:
        text += " Note: " + "; ".join(notes) + "."
    return text


# ----------------------------------------------------------------------------------------------------------------
# Partial dependence, Pareto, best trials
# ----------------------------------------------------------------------------------------------------------------


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
            rows.extend({"weight": w, "value": float(x), "target": t, "predicted": float(pred[j])}
                        for j, t in enumerate(fit.targets))
    return pl.DataFrame(rows)


def pareto(trials: pl.DataFrame, metrics: Sequence[str],
           directions: Optional[Sequence[str]] = None) -> pl.DataFrame:
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


def best_trials(trials: pl.DataFrame, n: int = 10, by: Optional[str] = None,
                maximize: Optional[bool] = None) -> pl.DataFrame:
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
    return {"metric": obj.get("metric") or "greedy", "split": obj.get("split") or "heldout",
            "stage": obj.get("stage"), "tasks": obj.get("tasks"), "reduce": obj.get("reduce") or "mean",
            "weights": obj.get("weights"), "direction": obj.get("direction")}


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


def tradeoff_pair(trials: pl.DataFrame, objectives: Sequence[str], metric: str = "greedy", split: str = "heldout",
                  stage: Optional[str] = None) -> Optional[tuple[str, str, str]]:
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
        for b in names[i + 1:]:
            if done.height > 2 and done[a].std() and done[b].std():
                r = float(done.select(pl.corr(a, b)).item())
                if best is None or r < best[0]:
                    best = (r, a, b)
    if best is None:
        return None
    r, a, b = best
    return a, b, (f"Single-objective study: the two task metrics that trade off most across trials "
                  f"(correlation {r:+.2f}).")


def best_trial_dir(trials: pl.DataFrame, sweep_dir: Any, maximize: bool = True) -> Optional[Any]:
    """The run directory of the best complete trial (by the first objective), or None when it is not there."""
    from pathlib import Path

    from analysis.io import is_run_dir

    objectives = objective_columns(trials)
    if not objectives or "trial_dir" not in trials.columns or complete(trials).is_empty():
        return None
    best = best_trials(trials, 1, objectives[0], maximize)
    if best.is_empty() or best["trial_dir"][0] is None:
        return None
    d = Path(best["trial_dir"][0])
    d = d if d.is_absolute() else Path(sweep_dir) / d
    return d if is_run_dir(d) else None
