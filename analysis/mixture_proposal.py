"""From a sweep's trials (or any table of results, :mod:`analysis.mixture_table`) to the mixture to train: the
mixing-law forms of :mod:`analysis.mixing_laws` fitted to the objective's tasks, the form chosen by cross-validated
error, and the mixture that optimises the objective (its direction included) under that form inside the trust
region, with the form's predicted value and a 95 % bootstrap interval — beside the in-sample winner, and tested on
held-out mixtures where there are some (:mod:`analysis.mixture_holdout`). ``harness mixture SWEEP_DIR`` (or
``--table FILE``) prints it and writes ``proposal.json``.

The trust region is the convex hull of the explored mixtures: a proposal interpolates between trials the form was
fitted (and cross-validated) on and never extrapolates to a corner no trial came near. (Olmix's KL ball around the
best trial would also reach outside the explored set on the side the sweep did not sample.)

Both inputs become a :class:`~analysis.mixture_data.LawData` first, and :func:`propose_data` works from it alone:
the same forms, cross-validation and support check whatever the rows came from.

Intervals are a bootstrap over trials: each resample refits the chosen form and predicts the proposal (and the
winner's mixture). ``mean_interval`` is the percentile interval of the predicted objective; ``interval``, the
prediction interval of what one training run of the proposal would score, adds to each resample's prediction a
held-out residual vector of a random trial (targets together, so their correlation is kept).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import polars as pl
from scipy import optimize

from analysis import mixing_laws as laws
from analysis.loading import AnalysisError
from analysis.mixture_data import LawData, cv_folds, sweep_law_data
from analysis.mixture_format import format_proposal
from analysis.mixture_holdout import check_holdout, held_out_report
from analysis.mixture_interference import interference_matrix, shifted_mixtures, target_support
from harness.core.jsonl import json_safe

__all__ = ["PROPOSAL_NAME", "MixtureProposal", "budget_choice", "format_proposal", "propose", "propose_data"]

PROPOSAL_NAME = "proposal.json"


@dataclass
class MixtureProposal:
    """What ``harness mixture`` reports (and ``proposal.json`` holds): the columns fitted, the cross-validated error
    of each form (``cv``: form, objective and mean target RMSE at the row level — leave-one-trial-out, or random
    folds on a large table — and leave-one-seed-out), the chosen form and its parameters, the proposal with its
    predicted targets, objective and intervals, the in-sample winner (its observed objective and what the chosen
    form predicts for its mixture), the interference matrix the law implies at the winner's mixture
    (:mod:`analysis.mixture_interference`), and, given held-out rows, the law's rank correlation and error on them.
    ``sweep_dir``: the sweep directory or table file the rows came from (``source``: sweep | table)."""

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
    seeds: int | None
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
    source: str = "sweep"
    holdout: dict[str, Any] = field(default_factory=dict)
    interference: dict[str, Any] = field(default_factory=dict)  # analysis.mixture_interference, at the winner
    predictions: dict[str, np.ndarray] | None = field(default=None, repr=False)  # --predict's; not in the JSON

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON values (NaN, e.g. a leave-one-seed-out error without seeds, as null)."""
        return json_safe({k: v for k, v in asdict(self).items() if k != "predictions"})


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
    data: LawData,
    points: np.ndarray,
    resamples: int,
    seed: int,
    start: laws.FittedLaw | None = None,
) -> np.ndarray:
    """Predicted targets at ``points`` of the form refitted on each resample of the rows (from ``start``'s
    parameters where the form has a starting point): ``(resamples, len(points), targets)``."""
    rng = np.random.default_rng(seed)
    out = np.empty((resamples, len(points), data.Y.shape[1]))
    for b in range(resamples):
        idx = rng.integers(0, len(data), len(data))
        out[b] = laws.fit_law(form, data.W[idx], data.Y[idx], data.proportion, start).predict(points)
    return out


def _interval(x: np.ndarray, axis: int | None = None):
    lo, hi = np.percentile(x, [2.5, 97.5], axis=axis)
    return (float(lo), float(hi)) if axis is None else (lo, hi)


def propose(
    trials: pl.DataFrame,
    config: Mapping[str, Any],
    *,
    forms: Sequence[str] = laws.FORMS,
    bootstrap: int = 200,
    seed: int = 0,
    sweep_dir: str = "",
    holdout: pl.DataFrame | None = None,
) -> MixtureProposal:
    """Fit, cross-validate and choose a form over the sweep's complete trials, and propose the mixture that
    optimises the sweep's objective (``config``: ``sweep.resolved.yaml``) inside the explored convex hull.
    ``holdout``: trials not fitted on (another sweep of the same space) that the chosen law is tested on."""
    data = sweep_law_data(trials, config, sweep_dir)
    held = sweep_law_data(holdout, config, "holdout") if holdout is not None else None
    return propose_data(data, forms=forms, bootstrap=bootstrap, seed=seed, holdout=held)


def propose_data(
    data: LawData,
    *,
    forms: Sequence[str] = laws.FORMS,
    bootstrap: int = 200,
    seed: int = 0,
    holdout: LawData | None = None,
    predict_at: np.ndarray | None = None,
) -> MixtureProposal:
    """The proposal from rows of any origin: cross-validate ``forms``, choose one, search the explored hull for
    the mixture that optimises ``data``'s objective, bootstrap its intervals. ``holdout``: rows not fitted on (the
    same weights and targets), on which the chosen law's rank correlation and error are measured; a proposal is
    then supported only where its held-out ρ is significantly positive too. ``predict_at``: further mixtures
    whose predictions and intervals go in ``predictions``."""
    W, Y, score, maximize = data.W, data.Y, data.score, data.maximize
    if holdout is not None:
        check_holdout(data, holdout)
    folds, cv_name = cv_folds(len(data), data.seeds, seed)  # what the choice and the support check read
    rows, chosen, usable = _choose_form(data, cv_folds(len(data), None, seed)[0], folds, forms)
    fitted = laws.fit_law(chosen.form, W, Y, data.proportion)
    n = len(W)

    def value(M: np.ndarray) -> np.ndarray:
        return score(fitted.predict(M))

    win = _best(data.observed, maximize)
    # under the constant form every mixture is predicted alike: the proposal is the observed winner's (keep it)
    proposal = W[win] if chosen.form == "constant" else search_hull(W, value, maximize, seed)
    extra = np.empty((0, W.shape[1])) if predict_at is None else np.asarray(predict_at, dtype=float)
    shifted = shifted_mixtures(W[win])  # the interference matrix's mixtures: a tenth moved to each task
    points = np.vstack([proposal, W[win], shifted, extra])
    boot = _bootstrap(chosen.form, data, points, bootstrap, seed, fitted)
    k = len(shifted)
    at = points[1 : 2 + k]  # the winner's mixture, then the shifted ones
    interference = _interference(data, rows, chosen, (fitted, boot[:, 1 : 2 + k]), at, folds, bootstrap, seed)
    residuals = chosen.residuals[np.random.default_rng(seed + 1).integers(0, n, bootstrap)]
    boot_obj, boot_win = score(boot[:, 0]), score(boot[:, 1])
    predicted_targets = fitted.predict(proposal[None, :])[0]
    sign = 1.0 if maximize else -1.0
    constant = next(r for r in rows if r.form == "constant") if "constant" in usable else None
    gain = laws.improvement(chosen, constant, Y, score, folds) if constant and chosen is not constant else None
    held = held_out_report(fitted, holdout, score, seed=seed) if holdout is not None else {}
    supported = gain is not None and gain.low > 0 and (not held or held["objective"]["rho_low"] > 0)
    return MixtureProposal(
        sweep_dir=data.source,
        path=data.path,
        weights=data.weights,
        targets=data.targets,
        metric=data.metric,
        split=data.split,
        stage=data.stage,
        objective=data.objective,
        maximize=maximize,
        n_trials=n,
        seeds=int(len(np.unique(data.seeds))) if data.seeds is not None else None,
        cv=[{k: v for k, v in asdict(r).items() if k != "residuals"} | {"chosen": r.form == chosen.form} for r in rows],
        chosen=chosen.form,
        cv_by=cv_name,
        params=fitted.params,
        trust_region="convex hull of the explored mixtures",
        mixture={w: float(proposal[i]) for i, w in enumerate(data.weights)},
        predicted_targets={t: float(predicted_targets[j]) for j, t in enumerate(data.targets)},
        predicted=float(value(proposal[None, :])[0]),
        mean_interval=_interval(boot_obj),
        interval=_interval(score(boot[:, 0] + residuals)),
        gain_over_winner=sign * float(value(proposal[None, :])[0] - value(W[win][None, :])[0]),
        gain_interval=_interval(sign * (boot_obj - boot_win)),
        winner=_winner(data, win) | {"predicted": float(value(W[win][None, :])[0])},
        bootstrap=bootstrap,
        supported=supported,
        support=(
            {"gain": gain.estimate, "low": gain.low, "high": gain.high, "folds": gain.n} if gain is not None else {}
        ),
        notes=_notes(chosen, gain, held, data, usable, forms, rows),
        source=data.kind,
        holdout=held,
        interference=interference,
        predictions=_predictions(fitted, extra, boot[:, 2 + k :], residuals, score) if predict_at is not None else None,
    )


def _interference(data: LawData, rows, chosen, chosen_law, at: np.ndarray, folds, bootstrap: int, seed: int) -> dict:
    """The interference matrix at the winner's mixture (:mod:`analysis.mixture_interference`) under the form with
    the smallest cross-validated error of the *targets* (the objective's form may flatten a seesaw that cancels in
    it): the objective's fit and resamples (``chosen_law``: the law, its ``(B, 1 + k, targets)`` predictions at
    ``at``, the winner's mixture then the shifted ones) when it is the same form, a fit and bootstrap of its own
    otherwise. The matrix is a reading beside the proposal: a fit that fails here is said in it (``why``), never the
    proposal's failure."""
    try:
        return _law_interference(data, rows, chosen, chosen_law, at, folds, bootstrap, seed)
    except (AnalysisError, ValueError, np.linalg.LinAlgError) as e:
        return {"cells": [], "why": f"not computed ({type(e).__name__}: {e})"}


def _law_interference(data: LawData, rows, chosen, chosen_law, at: np.ndarray, folds, bootstrap: int, seed: int):
    """:func:`_interference`, computed."""
    row = min(rows, key=lambda r: np.nan_to_num(r.loso_targets if data.by_seed else r.loto_targets, nan=np.inf))
    constant = next((r for r in rows if r.form == "constant"), None)
    law, boot = chosen_law
    if row.form != chosen.form:
        law = laws.fit_law(row.form, data.W, data.Y, data.proportion)
        boot = _bootstrap(row.form, data, at, bootstrap, seed, law)
    fitted = law.predict(at)
    support = target_support(row, constant, data.Y, folds) if constant and row is not constant else None
    return interference_matrix(
        at[0],
        boot[:, 0],
        boot[:, 1:],
        fitted[0],
        fitted[1:],
        weights=data.weights,
        targets=data.targets,
        better_higher=data.maximize,
        support=support,
        form=row.form,
    )


def _predictions(fitted, points: np.ndarray, boot: np.ndarray, residuals: np.ndarray, score) -> dict[str, np.ndarray]:
    """The chosen law at ``points``: each target and the objective, with the bootstrap's percentile interval of
    the prediction (``mean_low`` / ``mean_high``) and the prediction interval of one run there (each resample's
    prediction plus a random row's held-out residuals: ``low`` / ``high``)."""
    targets = fitted.predict(points) if len(points) else np.empty((0, boot.shape[-1]))
    noisy = boot + residuals[:, None, :]
    out = {"targets": targets, "objective": score(targets)}
    out["mean_low"], out["mean_high"] = _interval(np.stack([score(b) for b in boot]), axis=0)
    out["low"], out["high"] = _interval(np.stack([score(b) for b in noisy]), axis=0)
    out["targets_low"], out["targets_high"] = _interval(noisy, axis=0)
    return out


def first_trials(trials: pl.DataFrame, k: int) -> pl.DataFrame:
    """The sweep's first ``k`` trials in the order the study numbered them, whatever their state: what a sweep
    stopped after ``k`` trials would have left (its pruned and failed trials spent the budget too)."""
    return trials.sort("number").head(k) if "number" in trials.columns else trials.head(k)


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


def _best(observed: np.ndarray, maximize: bool) -> int:
    return int(np.argmax(observed) if maximize else np.argmin(observed))


def in_sample_winner(trials: pl.DataFrame, config: Mapping[str, Any]) -> tuple[str, dict[str, Any], int]:
    """The simplex path, the complete trial with the best objective (``{number, mixture, observed}``) and how many
    complete trials it was chosen from."""
    data = sweep_law_data(trials, config)
    if not len(data):
        raise AnalysisError("no complete trial has the objective's values")
    return data.path, _winner(data, _best(data.observed, data.maximize)), len(data)


def _winner(data: LawData, win: int) -> dict[str, Any]:
    """The winning row as the reports give it: its number (trial number, or table row), mixture and objective."""
    return {
        "number": data.labels[win],
        "mixture": {w: float(data.W[win, i]) for i, w in enumerate(data.weights)},
        "observed": float(data.observed[win]),
    }


def _choose_form(data: LawData, row_folds: np.ndarray, folds: np.ndarray, forms: Sequence[str]):
    """Cross-validate the forms one fold can fit — at the row level (``row_folds``: a row each, or random folds
    of a large table) and, with seeds, by seed — and choose one by the error over ``folds`` (the seeds, where
    there are some): ``(rows, chosen, usable forms)``; an :class:`AnalysisError` when no form but the constant
    can be fitted."""
    n, k = data.W.shape
    if not [f for f in forms if f != "constant"]:
        raise AnalysisError("no form to fit besides the constant (the reference a form must beat)")
    n_train = n - max(int(np.max(np.unique(f, return_counts=True)[1])) for f in (row_folds, folds))
    usable = laws.usable_forms(n_train, k, forms)
    if not [f for f in usable if f != "constant"]:
        smallest = min(laws.n_params(f, k) for f in forms if f != "constant")
        row = "row" if data.kind == "table" else "trial"
        held = "seed" if data.seeds is not None else "fold" if n > len(np.unique(folds)) else row
        what = "rows" if data.kind == "table" else "complete trials"
        raise AnalysisError(
            f"{n} {what} are too few to fit a mixing law over {k} weights with one {held} held out (the "
            f"smallest form needs more than {smallest} in each fold)"
        )
    rows = laws.cross_validate(usable, data.W, data.Y, data.proportion, data.score, data.seeds, row_folds)
    return rows, laws.choose(rows, data.by_seed), usable


def _notes(chosen, gain, held, data: LawData, usable, forms, rows) -> list[str]:
    """Caveats in words: the form not better than the mean (in CV or on held-out rows), forms whose held-out fits
    diverged, forms left out for too few trials, other varied parameters."""
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
    if held and not held["objective"]["rho_low"] > 0:
        o = held["objective"]
        notes.append(
            f"on the {held['n']} held-out mixtures the law's ranking of the objective is not significantly positive "
            f"(Spearman ρ {o['rho']:.2f} [{o['rho_low']:.2f}, {o['rho_high']:.2f}]): keep the winner"
        )
    for row in rows:
        if row.diverged:
            notes.append(
                f"{row.form}: its held-out fits diverged on {row.diverged} of {len(data)} rows (predictions over "
                f"{laws.DIVERGED:.0f}× the targets' range off): left out of the choice"
            )
    skipped = [f for f in forms if f not in usable]
    if skipped:
        notes.append(f"too few trials for {', '.join(skipped)} (with one fold held out)")
    if data.varied:
        notes.append(f"also varied, not in the fit (their effect is in the residual): {', '.join(data.varied)}")
    return notes
