"""From a sweep's trials to the mixture to train: the mixing-law forms of :mod:`analysis.mixing_laws` fitted to the
sweep's objective tasks, the form chosen by cross-validated error, and the mixture that optimises the sweep's own
objective (its direction included) under that form inside the trust region, with the form's predicted value and a
95 % bootstrap interval — beside the sweep's in-sample winner. ``harness mixture SWEEP_DIR`` prints it and writes
``proposal.json``.

The trust region is the convex hull of the explored mixtures: a proposal interpolates between trials the form was
fitted (and cross-validated) on and never extrapolates to a corner no trial came near. (Olmix's KL ball around the
best trial would also reach outside the explored set on the side the sweep did not sample.)

Intervals are a bootstrap over trials: each resample refits the chosen form and predicts the proposal (and the
winner's mixture). ``mean_interval`` is the percentile interval of the predicted objective; ``interval``, the
prediction interval of what one training run of the proposal would score, adds to each resample's prediction a
held-out residual vector of a random trial (targets together, so their correlation is kept).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import polars as pl
from scipy import optimize

from analysis import mixing_laws as laws
from analysis.frames import lower_is_better
from analysis.loading import AnalysisError
from analysis.mixture_fit import _choose_columns, _objective_weights, _scorer
from analysis.sweep import fit_objective, objective_columns, sweep_objective
from analysis.trials import complete
from harness.core.jsonl import json_safe
from harness.core.metrics import PROPORTION_METRICS

PROPOSAL_NAME = "proposal.json"


@dataclass
class MixtureProposal:
    """What ``harness mixture`` reports (and ``proposal.json`` holds): the columns fitted, the cross-validated error
    of each form (``cv``: form, objective and mean target RMSE leave-one-trial-out / leave-one-seed-out), the
    chosen form and its parameters, the proposal with its predicted targets, objective and intervals, and the
    sweep's in-sample winner (its observed objective and what the chosen form predicts for its mixture)."""

    sweep_dir: str
    path: str
    weights: list[str]
    targets: list[str]
    metric: str
    split: str
    stage: str
    objective: str
    maximize: bool
    n_trials: int
    seeds: Optional[int]
    cv: list[dict[str, Any]]
    chosen: str
    cv_by: str
    params: list[dict[str, Any]]
    trust_region: str
    mixture: dict[str, float]
    predicted_targets: dict[str, float]
    predicted: float
    mean_interval: tuple[float, float]
    interval: tuple[float, float]
    gain_over_winner: float
    gain_interval: tuple[float, float]
    winner: dict[str, Any]
    bootstrap: int
    supported: bool
    support: dict[str, float]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON values (NaN, e.g. a leave-one-seed-out error without seeds, as null)."""
        return json_safe(asdict(self))


def _objective_spec(config: Mapping[str, Any]) -> dict[str, Any]:
    """The sweep file's single objective, or an :class:`AnalysisError` when it has none or several."""
    if config.get("objectives"):
        raise AnalysisError("the sweep has several objectives (a Pareto front): no single mixture optimises them")
    if not config.get("objective"):
        raise AnalysisError("no objective in sweep.resolved.yaml: nothing to optimise")
    return sweep_objective(config)


def _seed_column(data: pl.DataFrame) -> Optional[str]:
    """The varied seed parameter of the trials (``param/seed``, or another ``param/…seed``), if any."""
    names = [c for c in data.columns if c.startswith("param/") and c.rsplit(".", 1)[-1].endswith("seed")]
    names.sort(key=lambda c: c != "param/seed")
    for c in names:
        if data[c].drop_nulls().n_unique() >= 2 and data[c].null_count() == 0:
            return c
    return None


def search_hull(
    W: np.ndarray, value: Callable[[np.ndarray], np.ndarray], maximize: bool, seed: int = 0, candidates: int = 4000
) -> np.ndarray:
    """The mixture in the convex hull of the rows of ``W`` with the best ``value`` (one per row of its argument):
    many random convex combinations of the trials (sparse and dense ones), then the best one polished by SLSQP
    over the combination's coefficients — every candidate is a convex combination, so inside the hull."""
    n = len(W)
    rng = np.random.default_rng(seed)
    lam = np.vstack([np.eye(n)] + [rng.dirichlet(np.full(n, a), size=candidates // 3) for a in (0.05, 0.3, 1.0)])
    sign = -1.0 if maximize else 1.0
    scores = sign * value(lam @ W)
    scores = np.where(np.isfinite(scores), scores, np.inf)  # a law that overflows somewhere is not optimal there
    start = lam[int(np.argmin(scores))]

    def loss(x: np.ndarray) -> float:
        x = np.clip(x, 0.0, None)
        return float(sign * value(((x / max(x.sum(), 1e-12)) @ W)[None, :])[0])

    result = optimize.minimize(
        loss,
        start,
        method="SLSQP",
        bounds=[(0.0, 1.0)] * n,
        constraints=[{"type": "eq", "fun": lambda x: x.sum() - 1.0}],
        options={"maxiter": 200},
    )
    x = np.clip(result.x, 0.0, None)
    best = start if not np.isfinite(result.fun) or loss(x) >= float(scores.min()) else x / x.sum()
    return best @ W


def _bootstrap(
    form: str,
    W: np.ndarray,
    Y: np.ndarray,
    proportion: list[bool],
    points: np.ndarray,
    resamples: int,
    seed: int,
) -> np.ndarray:
    """Predicted targets at ``points`` of the form refitted on each resample of the trials:
    ``(resamples, len(points), targets)``."""
    rng = np.random.default_rng(seed)
    out = np.empty((resamples, len(points), Y.shape[1]))
    for b in range(resamples):
        idx = rng.integers(0, len(W), len(W))
        out[b] = laws.fit_law(form, W[idx], Y[idx], proportion).predict(points)
    return out


def _interval(x: np.ndarray) -> tuple[float, float]:
    lo, hi = np.percentile(x, [2.5, 97.5])
    return float(lo), float(hi)


def _columns(trials: pl.DataFrame, objective: Mapping[str, Any], space: Mapping[str, Any]):
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


def propose(
    trials: pl.DataFrame,
    config: Mapping[str, Any],
    *,
    forms: Sequence[str] = laws.FORMS,
    bootstrap: int = 200,
    seed: int = 0,
    sweep_dir: str = "",
) -> MixtureProposal:
    """Fit, cross-validate and choose a form over the sweep's complete trials, and propose the mixture that
    optimises the sweep's objective (``config``: ``sweep.resolved.yaml``) inside the explored convex hull."""
    objective = _objective_spec(config)
    path, weights, stage, targets, columns, score, name, maximize = _columns(
        trials, objective, config.get("space") or {}
    )
    data, W, Y = _matrices(trials, path, weights, columns)
    seed_col = _seed_column(data)
    seeds = data[seed_col].to_numpy() if seed_col else None
    proportion = [objective["metric"] in PROPORTION_METRICS] * len(targets)
    rows, chosen, usable = _choose_form(W, Y, proportion, score, seeds, forms)
    fitted = laws.fit_law(chosen.form, W, Y, proportion)
    n, by_seed = len(W), seeds is not None

    def value(M: np.ndarray) -> np.ndarray:
        return score(fitted.predict(M))

    observed = _observed_objective(data, Y, score)
    win = _best(observed, maximize)
    # under the constant form every mixture is predicted alike: the proposal is the observed winner's (keep it)
    proposal = W[win] if chosen.form == "constant" else search_hull(W, value, maximize, seed)
    boot = _bootstrap(chosen.form, W, Y, proportion, np.vstack([proposal, W[win]]), bootstrap, seed)
    residuals = chosen.residuals[np.random.default_rng(seed + 1).integers(0, n, bootstrap)]
    boot_obj, boot_win = score(boot[:, 0]), score(boot[:, 1])
    predicted_targets = fitted.predict(proposal[None, :])[0]
    sign = 1.0 if maximize else -1.0
    groups = seeds if by_seed else np.arange(n)
    constant = next(r for r in rows if r.form == "constant") if "constant" in usable else None
    gain = laws.improvement(chosen, constant, Y, score, groups) if constant and chosen is not constant else None
    supported = gain is not None and gain.low > 0
    notes = _notes(chosen, gain, data, path, weights, usable, forms)
    return MixtureProposal(
        sweep_dir=str(sweep_dir),
        path=path,
        weights=weights,
        targets=targets,
        metric=objective["metric"],
        split=objective["split"],
        stage=stage,
        objective=name,
        maximize=maximize,
        n_trials=n,
        seeds=int(len(np.unique(seeds))) if seeds is not None else None,
        cv=[{k: v for k, v in asdict(r).items() if k != "residuals"} | {"chosen": r.form == chosen.form} for r in rows],
        chosen=chosen.form,
        cv_by="leave-one-seed-out" if by_seed else "leave-one-trial-out",
        params=fitted.params,
        trust_region="convex hull of the explored mixtures",
        mixture={w: float(proposal[i]) for i, w in enumerate(weights)},
        predicted_targets={t: float(predicted_targets[j]) for j, t in enumerate(targets)},
        predicted=float(value(proposal[None, :])[0]),
        mean_interval=_interval(boot_obj),
        interval=_interval(score(boot[:, 0] + residuals)),
        gain_over_winner=sign * float(value(proposal[None, :])[0] - value(W[win][None, :])[0]),
        gain_interval=_interval(sign * (boot_obj - boot_win)),
        winner=_winner(data, W, weights, observed, win) | {"predicted": float(value(W[win][None, :])[0])},
        bootstrap=bootstrap,
        supported=supported,
        support=(
            {"gain": gain.estimate, "low": gain.low, "high": gain.high, "folds": gain.n} if gain is not None else {}
        ),
        notes=notes,
    )


def _matrices(trials: pl.DataFrame, path: str, weights: list[str], columns: Mapping[str, str]):
    """The complete trials with every weight and target, their normalised mixtures ``W`` and targets ``Y``."""
    data = complete(trials).drop_nulls([f"param/{path}.{w}" for w in weights] + list(columns.values()))
    W = data.select([f"param/{path}.{w}" for w in weights]).to_numpy().astype(float)
    W = W / W.sum(axis=1, keepdims=True)
    return data, W, data.select(list(columns.values())).to_numpy().astype(float)


def first_trials(trials: pl.DataFrame, k: int) -> pl.DataFrame:
    """The sweep's first ``k`` trials in the order the study numbered them, whatever their state: what a sweep
    stopped after ``k`` trials would have left (its pruned and failed trials spent the budget too)."""
    return trials.sort("number").head(k) if "number" in trials.columns else trials.head(k)


def _best(observed: np.ndarray, maximize: bool) -> int:
    return int(np.argmax(observed) if maximize else np.argmin(observed))


def in_sample_winner(trials: pl.DataFrame, config: Mapping[str, Any]) -> tuple[str, dict[str, Any], int]:
    """The simplex path, the complete trial with the best objective (``{number, mixture, observed}``) and how many
    complete trials it was chosen from."""
    objective = _objective_spec(config)
    path, weights, _, _, columns, score, _, maximize = _columns(trials, objective, config.get("space") or {})
    data, W, Y = _matrices(trials, path, weights, columns)
    if not len(W):
        raise AnalysisError("no complete trial has the objective's values")
    observed = _observed_objective(data, Y, score)
    win = _best(observed, maximize)
    return path, _winner(data, W, weights, observed, win), len(W)


def _winner(data: pl.DataFrame, W: np.ndarray, weights: list[str], observed: np.ndarray, win: int) -> dict[str, Any]:
    """The winning trial as the reports give it: its number, mixture and observed objective."""
    return {
        "number": int(data["number"][win]) if "number" in data.columns else win,
        "mixture": {w: float(W[win, i]) for i, w in enumerate(weights)},
        "observed": float(observed[win]),
    }


def budget_row(proposal: Mapping[str, Any], k: Any) -> dict[str, Any]:
    """A budget curve's row for a law's proposal (``proposal.json``'s content) fitted on ``k`` trials."""
    constant = proposal["chosen"] == "constant"  # no form beat the mean: the proposal is the winner's mixture
    return {
        "k": k,
        "basis": "winner" if constant else "law",
        "why": "no form beats the trials' mean"
        if constant
        else f"{proposal['chosen']}, {'supported' if proposal['supported'] else 'NOT SUPPORTED'}",
        "path": proposal["path"],
        "mixture": proposal["mixture"],
        "n_complete": proposal["n_trials"],
        "winner": proposal["winner"],
    }


def budget_choice(trials: pl.DataFrame, config: Mapping[str, Any], k: int, **options: Any) -> dict[str, Any]:
    """What ``harness mixture`` gives from the sweep's first ``k`` trials: the mixing law's proposal (``basis:
    law``, supported or not), or, where ``k`` trials are too few to fit a law (or every fit fails on them), the
    winner among them (``basis: winner``) — the mixture a researcher with that budget would train; ``basis: none``
    (no mixture) when none of the first ``k`` trials completed."""
    head = first_trials(trials, k)
    try:
        return budget_row(propose(head, config, **options).to_json(), k)
    except (AnalysisError, ValueError, np.linalg.LinAlgError) as e:
        row = {"k": k, "why": str(e)}
    try:
        path, winner, n = in_sample_winner(head, config)
    except AnalysisError as none:  # every one of the first k trials was pruned or failed: nothing to train
        return {
            **row,
            "basis": "none",
            "why": str(none),
            "path": None,
            "mixture": None,
            "winner": None,
            "n_complete": 0,
        }
    return {**row, "basis": "winner", "path": path, "mixture": winner["mixture"], "winner": winner, "n_complete": n}


def _choose_form(W, Y, proportion, score, seeds, forms):
    """Cross-validate the forms one fold can fit and choose one: ``(rows, chosen, usable forms)``; an
    :class:`AnalysisError` when no form but the constant can be fitted."""
    n, k = W.shape
    if not [f for f in forms if f != "constant"]:
        raise AnalysisError("no form to fit besides the constant (the reference a form must beat)")
    n_train = n - (int(np.max(np.unique(seeds, return_counts=True)[1])) if seeds is not None else 1)
    usable = laws.usable_forms(n_train, k, forms)
    if not [f for f in usable if f != "constant"]:
        smallest = min(laws.n_params(f, k) for f in forms if f != "constant")
        raise AnalysisError(
            f"{n} complete trials are too few to fit a mixing law over {k} weights with one "
            f"{'seed' if seeds is not None else 'trial'} held out (the smallest form needs more than {smallest} "
            "in each fold)"
        )
    rows = laws.cross_validate(usable, W, Y, proportion, score, seeds)
    return rows, laws.choose(rows, seeds is not None), usable


def _observed_objective(data: pl.DataFrame, Y: np.ndarray, score: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Each trial's objective as the sweep recorded it (its ``objective`` column), else reduced from its targets."""
    cols = objective_columns(data)
    if cols == ["objective"] and data["objective"].null_count() == 0:
        return data["objective"].to_numpy().astype(float)
    return score(Y)


def _notes(chosen, gain, data, path, weights, usable, forms) -> list[str]:
    """Caveats in words: the form not better than the mean, forms left out for too few trials, other varied
    parameters."""
    notes = []
    if chosen.form == "constant":
        notes.append(
            "no form predicts held-out trials better than their mean: the proposal is the winner's mixture (keep it)"
        )
    elif gain is not None and not gain.low > 0:
        notes.append(
            f"{chosen.form} does not predict held-out trials better than their mean (squared-error gain "
            f"{gain.estimate:.3g} [{gain.low:.3g}, {gain.high:.3g}] over {gain.n} folds): the proposal is a "
            "guess, keep the winner"
        )
    skipped = [f for f in forms if f not in usable]
    if skipped:
        notes.append(f"too few trials for {', '.join(skipped)} (with one fold held out)")
    varied = [
        c[len("param/") :]
        for c in data.columns
        if c.startswith("param/") and not any(c == f"param/{path}.{w}" for w in weights) and data[c].n_unique() > 1
    ]
    if varied:
        notes.append(f"also varied, not in the fit (their effect is in the residual): {', '.join(varied)}")
    return notes


def format_proposal(p: MixtureProposal) -> str:
    """The report ``harness mixture`` prints: the CV table, the chosen form, the proposal beside the winner."""
    direction = "maximise" if p.maximize else "minimise"
    seeds = f", {p.seeds} seeds" if p.seeds else ""
    lines = [
        f"sweep {p.sweep_dir}: {p.n_trials} complete trials{seeds}; objective {p.objective} of {p.metric}/{p.split} "
        f"at the end of {p.stage} ({direction}); weights of {p.path}",
        "",
        f"{'form':<10} {'LOTO obj RMSE':>14} {'LOTO task RMSE':>15} {'LOSO obj RMSE':>14} {'LOSO task RMSE':>15}",
    ]
    for r in p.cv:
        mark = "  <- chosen" if r["chosen"] else ""
        lines.append(
            f"{r['form']:<10} {r['loto_objective']:>14.4f} {r['loto_targets']:>15.4f} "
            f"{r['loso_objective']:>14.4f} {r['loso_targets']:>15.4f}{mark}"
        )
    lines += [
        "",
        f"chosen: {p.chosen} (smallest {p.cv_by} error of the objective)"
        + (
            f"; better than the trials' mean by {p.support['gain']:.3g} [{p.support['low']:.3g}, "
            f"{p.support['high']:.3g}] in squared error over {p.support['folds']} folds"
            if p.support
            else ""
        )
        + ("" if p.supported else " — NOT SUPPORTED"),
        f"trust region: {p.trust_region}",
        "",
        f"{'':<10} {'objective':>10}  95% interval           mixture",
        f"{'proposal':<10} {p.predicted:>10.4f}  [{p.interval[0]:.4f}, {p.interval[1]:.4f}] (predicted; "
        f"mean [{p.mean_interval[0]:.4f}, {p.mean_interval[1]:.4f}])  {_mix(p.mixture)}",
        f"{'winner':<10} {p.winner['observed']:>10.4f}  (trial {p.winner['number']}, observed in-sample; "
        f"predicted {p.winner['predicted']:.4f})  {_mix(p.winner['mixture'])}",
        f"predicted gain of the proposal over the winner's mixture: {p.gain_over_winner:+.4f} "
        f"[{p.gain_interval[0]:+.4f}, {p.gain_interval[1]:+.4f}] (bootstrap over trials, {p.bootstrap} resamples)",
    ]
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def _mix(m: Mapping[str, float]) -> str:
    return ", ".join(f"{t} {w:.3f}" for t, w in m.items())
