"""Mixing laws: forms that predict each task's final metric from a sweep's mixture weights, fitted on the trials
table alone, and their cross-validated error — the error, never the in-sample R², picks the form a proposal uses
(:mod:`analysis.mixture_proposal`).

Forms (one fit per target task; ``W`` holds the trials' normalised weights, one row per trial):

- ``scheffe`` / ``scheffe2``: Scheffé's mixture regression, linear / with the ``w_i w_j`` terms
  (:mod:`analysis.mixture_fit`'s model), ordinary least squares;
- ``loglinear``: the data mixing law of Ye et al. 2024, ``L = c + k · exp(Σ_j t_j w_j)``, fitted with
  ``scipy.optimize.least_squares`` from both signs of ``k``. On a proportion metric (greedy, …) it is fitted through
  the logit (clipped to [:data:`LOGIT_CLIP`, 1 − :data:`LOGIT_CLIP`]) and predicted back through the sigmoid, so a
  prediction stays a proportion. ``k`` and a constant added to every ``t_j`` are not separable on the simplex
  (Σw = 1), so the parameters are reported with ``t`` centred (mean 0) and the scale in ``k``;
- ``gp``: a Gaussian process (squared-exponential kernel on the weights plus white noise, hyperparameters by
  marginal likelihood) — Olmix's non-parametric form. Chosen over BiMix because BiMix models a task by its own
  weight only (no transfer between tasks, which is what a sweep measures) and diverges at weight 0, which a
  simplex sweep samples and which a target outside the simplex always has;
- ``constant``: the trials' mean, the reference a form must beat to be worth proposing from.

Cross-validation refits a form on every fold: leave-one-trial-out, and leave-one-seed-out (every trial of one
seed held out) where the trials carry a seed parameter — then the choice uses it, because trials that share a
seed share its noise and leave-one-trial-out would reward fitting it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import linalg, optimize, special

from analysis.mixture_fit import _design
from harness.core.stats import Interval, t_interval

FORMS = ("constant", "scheffe", "scheffe2", "loglinear", "gp")
LOGIT_CLIP = 0.01  # a 0 or 1 would be an infinite logit; 1 % keeps a near-0/1 trial from dominating the fit
_MAX_EXPONENT = 50.0  # exp() of more overflows; a fit that goes there is wrong anyway
_GP_HYPER_ROWS = 128  # the rows a Gaussian process's hyperparameters are fitted on, at most
_SIGN_TRIAL_EVALS = 20  # the short budget each sign of the log-linear law gets before the better one is refined


def n_params(form: str, k: int) -> int:
    """Parameters one target's fit of ``form`` spends over ``k`` weights (the GP: its three hyperparameters)."""
    return {"constant": 1, "scheffe": k, "scheffe2": k + k * (k - 1) // 2, "loglinear": k + 1, "gp": 3}[form]


@dataclass
class FittedLaw:
    """A form fitted to every target: ``predict(W)`` gives one row per mixture, one column per target, on the
    metric's own scale; ``params`` holds each target's parameters (names per form, see the module docstring)."""

    form: str
    params: list[dict] = field(default_factory=list)
    _predictors: list[Callable[[np.ndarray], np.ndarray]] = field(default_factory=list, repr=False)

    def predict(self, W: np.ndarray) -> np.ndarray:
        W = np.atleast_2d(np.asarray(W, dtype=float))
        return np.column_stack([p(W) for p in self._predictors])


# ----------------------------------------------------------------------------------------------------------------
# The forms, one target at a time
# ----------------------------------------------------------------------------------------------------------------


def _logit(y: np.ndarray) -> np.ndarray:
    y = np.clip(y, LOGIT_CLIP, 1.0 - LOGIT_CLIP)
    return np.log(y / (1.0 - y))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return special.expit(z)  # no overflow warning where a far-off exponent sends z to ±inf


def _fit_scheffe(W: np.ndarray, y: np.ndarray, degree: int) -> tuple[dict, Callable]:
    beta, *_ = np.linalg.lstsq(_design(W, degree), y, rcond=None)
    return {"beta": beta.tolist()}, lambda V: _design(V, degree) @ beta


def _loglinear_curve(x: np.ndarray, W: np.ndarray, sign: float) -> np.ndarray:
    """``c + sign · exp(W @ t)`` for ``x = (c, t_1, …, t_k)`` (the scale of k is inside t)."""
    return x[0] + sign * np.exp(np.clip(W @ x[1:], -_MAX_EXPONENT, _MAX_EXPONENT))


def _loglinear_jacobian(x: np.ndarray, W: np.ndarray, sign: float) -> np.ndarray:
    e = sign * np.exp(np.clip(W @ x[1:], -_MAX_EXPONENT, _MAX_EXPONENT))
    return np.column_stack([np.ones(len(W)), e[:, None] * W])


def _fit_loglinear_z(W: np.ndarray, z: np.ndarray, start: dict | None = None) -> tuple[float, np.ndarray, float]:
    """The least-squares ``(c, t, sign)`` of ``z ≈ c + sign · exp(W t)``, the better of both signs. Each sign
    starts from the log-linear regression of ``sign · (z − c0)`` with ``c0`` just outside the data's range and gets
    a short budget; only the better one is refined to convergence (the wrong sign rarely converges, and running it
    to the full budget was most of a fit's time). ``start``: a fit's parameters (a bootstrap resample starts from
    the full data's fit, with its sign)."""
    spread = float(np.ptp(z)) or 1.0
    budget = 50 * (W.shape[1] + 2)  # a law that has not converged by then is noise: CV will say so
    if start is not None and start["k"] != 0.0:
        sign = math.copysign(1.0, start["k"])
        x0 = np.concatenate([[start["c"]], np.asarray(start["t"]) + math.log(abs(start["k"]))])
        result = _least_squares_loglinear(W, z, sign, x0, budget)
        return float(result.x[0]), result.x[1:], sign
    trial = []
    for sign in (1.0, -1.0):
        c0 = float(z.min() - 0.5 * spread) if sign > 0 else float(z.max() + 0.5 * spread)
        t0, *_ = np.linalg.lstsq(W, np.log(sign * (z - c0)), rcond=None)
        trial.append((_least_squares_loglinear(W, z, sign, np.concatenate([[c0], t0]), _SIGN_TRIAL_EVALS), sign))
    result, sign = min(trial, key=lambda r: r[0].cost)
    if result.status == 0:  # the short budget ran out: refine the better sign
        result = _least_squares_loglinear(W, z, sign, result.x, budget)
    return float(result.x[0]), result.x[1:], sign


def _least_squares_loglinear(W: np.ndarray, z: np.ndarray, sign: float, start: np.ndarray, max_nfev: int):
    return optimize.least_squares(
        lambda x: _loglinear_curve(x, W, sign) - z,
        start,
        jac=lambda x: _loglinear_jacobian(x, W, sign),
        method="lm",
        max_nfev=max_nfev,
    )


def _fit_loglinear(W: np.ndarray, y: np.ndarray, proportion: bool, start: dict | None = None) -> tuple[dict, Callable]:
    z = _logit(y) if proportion else y
    if float(np.ptp(z)) <= 1e-12:  # nothing varies: the law is its constant
        c = float(z[0])
        return {"c": c, "k": 0.0, "t": [0.0] * W.shape[1], "logit": proportion}, (
            lambda V: np.full(len(V), _sigmoid(c) if proportion else c)
        )
    c, t, sign = _fit_loglinear_z(W, z, start)
    # Reported as Ye et al. write it: L = c + k·exp(Σ t_j w_j), t centred (a shift of t is a factor of k on Σw = 1).
    params = {"c": c, "k": float(sign * math.exp(float(t.mean()))), "t": (t - t.mean()).tolist(), "logit": proportion}
    x = np.concatenate([[c], t])

    def predict(V: np.ndarray) -> np.ndarray:
        out = _loglinear_curve(x, V, sign)
        return _sigmoid(out) if proportion else out

    return params, predict


def _gp_kernel(A: np.ndarray, B: np.ndarray, length: float, signal: float) -> np.ndarray:
    d2 = ((A[:, None, :] - B[None, :, :]) ** 2).sum(axis=-1)
    return signal * np.exp(-0.5 * d2 / length**2)


def _gp_neg_log_likelihood(log_theta: np.ndarray, W: np.ndarray, z: np.ndarray) -> tuple[float, np.ndarray]:
    """The negative log marginal likelihood over log (length, signal, noise), and its gradient (Rasmussen &
    Williams eq. 5.9: ``-½ tr((αα' − K⁻¹) ∂K)``)."""
    length, signal, noise = np.exp(log_theta)
    d2 = ((W[:, None, :] - W[None, :, :]) ** 2).sum(axis=-1)
    K_se = signal * np.exp(-0.5 * d2 / length**2)
    K = K_se + (noise + 1e-9) * np.eye(len(W))
    try:
        L = linalg.cholesky(K, lower=True)
    except linalg.LinAlgError:
        return 1e10, np.zeros(3)
    K_inv = linalg.cho_solve((L, True), np.eye(len(W)))
    alpha = K_inv @ z
    inner = np.outer(alpha, alpha) - K_inv
    grads = [K_se * d2 / length**2, K_se, noise * np.eye(len(W))]
    grad = np.array([-0.5 * float((inner * dK).sum()) for dK in grads])
    return float(0.5 * z @ alpha + np.log(np.diag(L)).sum()), grad


def _fit_gp(W: np.ndarray, y: np.ndarray) -> tuple[dict, Callable]:
    mean, scale = float(y.mean()), float(y.std()) or 1.0
    z = (y - mean) / scale
    bounds = [(math.log(0.05), math.log(5.0)), (math.log(1e-3), math.log(10.0)), (math.log(1e-4), math.log(2.0))]
    # The hyperparameters from at most _GP_HYPER_ROWS rows (a fixed subsample): the likelihood costs n³ per step,
    # and three numbers are pinned down long before a table's hundreds of rows; the posterior uses every row.
    sub = np.random.default_rng(len(W)).permutation(len(W))[:_GP_HYPER_ROWS] if len(W) > _GP_HYPER_ROWS else ...
    # One start, from a length scale a fifth of the simplex's diameter: cheap enough to refit in every fold.
    best = optimize.minimize(
        _gp_neg_log_likelihood,
        np.log([0.3, 1.0, 0.2]),
        args=(W[sub], z[sub]),
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        options={"maxiter": 60},
    )
    length, signal, noise = np.exp(best.x)
    K = _gp_kernel(W, W, length, signal) + (noise + 1e-9) * np.eye(len(W))
    alpha = np.linalg.solve(K, z)
    params = {"length": float(length), "signal": float(signal * scale**2), "noise": float(noise * scale**2)}
    return params, lambda V: mean + scale * (_gp_kernel(V, W, length, signal) @ alpha)


def fit_law(
    form: str, W: np.ndarray, Y: np.ndarray, proportion: Sequence[bool], start: FittedLaw | None = None
) -> FittedLaw:
    """``form`` fitted to every column of ``Y`` (targets) on the weights ``W``; ``proportion[j]``: target j is a
    proportion (the log-linear law then fits its logit). ``start``: a fit of the same form whose parameters the
    log-linear law starts from (a bootstrap's refits: the same optimum, found in a few steps)."""
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}: one of {', '.join(FORMS)}")
    W, Y = np.asarray(W, dtype=float), np.asarray(Y, dtype=float)
    fitted = FittedLaw(form)
    for j in range(Y.shape[1]):
        y = Y[:, j]
        if form == "constant":
            m = float(y.mean())
            params, predictor = {"mean": m}, (lambda V, m=m: np.full(len(V), m))
        elif form in ("scheffe", "scheffe2"):
            params, predictor = _fit_scheffe(W, y, 1 if form == "scheffe" else 2)
        elif form == "loglinear":
            warm = start.params[j] if start is not None and start.form == form else None
            params, predictor = _fit_loglinear(W, y, bool(proportion[j]), warm)
        else:
            params, predictor = _fit_gp(W, y)
        fitted.params.append(params)
        fitted._predictors.append(predictor)
    return fitted


# ----------------------------------------------------------------------------------------------------------------
# Cross-validation and the choice
# ----------------------------------------------------------------------------------------------------------------


def held_out_predictions(
    form: str, W: np.ndarray, Y: np.ndarray, proportion: Sequence[bool], groups: np.ndarray
) -> np.ndarray:
    """Each trial's targets predicted by ``form`` refitted without the trials of its group (a group per trial:
    leave-one-trial-out; a group per seed: leave-one-seed-out)."""
    out = np.full(Y.shape, np.nan)
    for g in np.unique(groups):
        test = groups == g
        out[test] = fit_law(form, W[~test], Y[~test], proportion).predict(W[test])
    return out


def usable_forms(n_train: int, k: int, forms: Sequence[str] = FORMS) -> list[str]:
    """The forms a fold of ``n_train`` trials can fit with a residual degree of freedom left."""
    return [f for f in forms if n_train > n_params(f, k)]


@dataclass
class CVRow:
    """One form's cross-validated error: the RMSE of the objective (what the choice uses) and the mean over
    targets of each target's RMSE, leave-one-trial-out (``loto``) and leave-one-seed-out (``loso``, NaN without
    seeds), and the held-out residuals (observed − predicted, trials × targets) of the one the choice reads."""

    form: str
    loto_objective: float
    loto_targets: float
    loso_objective: float = math.nan
    loso_targets: float = math.nan
    residuals: np.ndarray | None = field(default=None, repr=False)
    diverged: int = 0  # held-out rows whose prediction diverged (:data:`DIVERGED`): the form is out of the choice

    def error(self, by_seed: bool) -> float:
        return self.loso_objective if by_seed else self.loto_objective


# A held-out prediction this many times the targets' range away from the observed value is a fit that diverged on
# that fold (the log-linear law's exponent running away on a few rows), not a prediction: its form's CV error is then
# no error of a law, and the form is left out of the choice rather than reported with an error of 1e20.
DIVERGED = 100.0


def _diverged(predicted: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """Per row: whether its held-out prediction is :data:`DIVERGED` times the targets' range off (or not finite)."""
    scale = DIVERGED * (np.ptp(Y, axis=0) + 1e-12)
    off = ~np.isfinite(predicted) | (np.abs(predicted - Y) > scale)
    return off.any(axis=1)


def _rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.nanmean((a - b) ** 2)))


def _mean_target_rmse(predicted: np.ndarray, Y: np.ndarray) -> float:
    return float(np.mean([_rmse(predicted[:, j], Y[:, j]) for j in range(Y.shape[1])]))


def cross_validate(
    forms: Sequence[str],
    W: np.ndarray,
    Y: np.ndarray,
    proportion: Sequence[bool],
    score: Callable[[np.ndarray], np.ndarray],
    seeds: np.ndarray | None = None,
    folds: np.ndarray | None = None,
) -> list[CVRow]:
    """A :class:`CVRow` per form; ``score`` reduces targets to the objective (one value per row). ``folds``: the
    row-level groups (default one per row: leave-one-trial-out; a large table passes random folds)."""
    by_seed = seeds is not None and len(np.unique(seeds)) >= 2
    observed = score(Y)
    folds = np.arange(len(W)) if folds is None else np.asarray(folds)
    rows = []
    for form in forms:
        loto = held_out_predictions(form, W, Y, proportion, folds)
        row = CVRow(form, _rmse(score(loto), observed), _mean_target_rmse(loto, Y))
        row.residuals, diverged = Y - loto, _diverged(loto, Y)
        if by_seed:
            loso = held_out_predictions(form, W, Y, proportion, np.asarray(seeds))
            row.loso_objective = _rmse(score(loso), observed)
            row.loso_targets = _mean_target_rmse(loso, Y)
            row.residuals, diverged = Y - loso, diverged | _diverged(loso, Y)  # a row counted once, either way out
        row.diverged = int(diverged.sum())
        if row.diverged:
            row.loto_objective = row.loto_targets = math.inf
            row.loso_objective = row.loso_targets = math.inf if by_seed else math.nan
        rows.append(row)
    return rows


def choose(rows: Sequence[CVRow], by_seed: bool) -> CVRow:
    """The form with the smallest cross-validated objective error (``constant`` only when nothing beats it)."""
    finite = [r for r in rows if math.isfinite(r.error(by_seed))]
    if not finite:
        raise ValueError("no form has a finite cross-validated error")
    return min(finite, key=lambda r: (r.error(by_seed), r.form != "constant"))


def improvement(
    row: CVRow, base: CVRow, Y: np.ndarray, score: Callable[[np.ndarray], np.ndarray], groups: np.ndarray
) -> Interval:
    """How much ``row``'s form lowers the held-out squared error of the objective below ``base``'s (the trials'
    mean), per held-out fold (a trial, or a seed's trials averaged), with its 95 % t interval over folds: the form
    is worth proposing from only when the interval lies above 0 — the smallest CV error alone is, on noise, some
    form's luck often (docs/sweeps.md, "From a sweep to the mixture")."""
    observed = score(Y)
    gain = (observed - score(Y - base.residuals)) ** 2 - (observed - score(Y - row.residuals)) ** 2
    groups = np.asarray(groups)
    return t_interval([float(gain[groups == g].mean()) for g in np.unique(groups)])
