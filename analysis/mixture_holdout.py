"""Held-out mixtures as the test of a law: the chosen law, fitted on one set of rows, predicts mixtures it never saw
(a second sweep of the same space, or the rows of a table marked held out), and each target's — and the
objective's — Spearman rank correlation and RMSE against what those runs scored are reported with 95 % bootstrap
intervals (percentile, resampling the held-out rows with the law's predictions fixed: the interval is the
uncertainty of a finite held-out set, not of the fit). :mod:`analysis.mixture_proposal` calls a proposal supported
only where the objective's held-out ρ is significantly positive (its interval above 0) as well as beating the mean
in cross-validation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import stats

from analysis.loading import AnalysisError
from analysis.mixture_data import LawData

HOLDOUT_RESAMPLES = 2000
MIN_HOLDOUT_ROWS = 4  # a rank correlation of fewer held-out mixtures says nothing


def _rank_rows(x: np.ndarray) -> np.ndarray:
    return stats.rankdata(x, axis=-1)


def _spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman's ρ of each row pair of ``a`` and ``b`` (resamples × rows): the Pearson correlation of the ranks
    (mid-ranks for ties); NaN where one side is constant."""
    ra, rb = _rank_rows(a), _rank_rows(b)
    ra = ra - ra.mean(axis=-1, keepdims=True)
    rb = rb - rb.mean(axis=-1, keepdims=True)
    denom = np.sqrt((ra**2).sum(axis=-1) * (rb**2).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, (ra * rb).sum(axis=-1) / denom, np.nan)


def agreement(predicted: np.ndarray, observed: np.ndarray, resamples: int, seed: int) -> dict[str, float]:
    """Spearman ρ and RMSE of ``predicted`` against ``observed`` (one value per held-out row), each with its 95 %
    percentile bootstrap interval over the rows."""
    predicted, observed = np.asarray(predicted, dtype=float), np.asarray(observed, dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(observed), (resamples, len(observed)))
    rho = _spearman_rows(predicted[idx], observed[idx])
    rmse = np.sqrt(((predicted[idx] - observed[idx]) ** 2).mean(axis=1))
    rho_lo, rho_hi = np.nanpercentile(rho, [2.5, 97.5]) if np.isfinite(rho).any() else (np.nan, np.nan)
    rmse_lo, rmse_hi = np.percentile(rmse, [2.5, 97.5])
    return {
        "rho": float(_spearman_rows(predicted[None, :], observed[None, :])[0]),
        "rho_low": float(rho_lo),
        "rho_high": float(rho_hi),
        "rmse": float(np.sqrt(((predicted - observed) ** 2).mean())),
        "rmse_low": float(rmse_lo),
        "rmse_high": float(rmse_hi),
    }


def check_holdout(data: LawData, holdout: LawData) -> None:
    """The held-out rows must have the fitted rows' weights and targets, and enough rows to rank."""
    if holdout.weights != data.weights or holdout.targets != data.targets:
        raise AnalysisError(
            f"the held-out rows ({holdout.source}) have other weights or targets than the fitted ones: "
            f"weights {', '.join(holdout.weights)}; targets {', '.join(holdout.targets)}"
        )
    if len(holdout) < MIN_HOLDOUT_ROWS:
        raise AnalysisError(f"{len(holdout)} held-out rows ({holdout.source}): a rank test needs {MIN_HOLDOUT_ROWS}")


def held_out_report(
    fitted: Any,
    holdout: LawData,
    score: Callable[[np.ndarray], np.ndarray],
    *,
    seed: int = 0,
    resamples: int = HOLDOUT_RESAMPLES,
) -> dict[str, Any]:
    """The law ``fitted`` (a :class:`~analysis.mixing_laws.FittedLaw`) on the held-out rows: ``n``,
    ``resamples``, ``objective`` and ``targets`` (``{target: …}``), each ``rho``, ``rho_low``, ``rho_high``,
    ``rmse``, ``rmse_low``, ``rmse_high``; ``rows``: each held-out row's label, observed and predicted
    objective."""
    predicted = fitted.predict(holdout.W)
    objective = score(predicted)
    return {
        "source": holdout.source,
        "n": len(holdout),
        "resamples": resamples,
        "objective": agreement(objective, holdout.observed, resamples, seed),
        "targets": {
            t: agreement(predicted[:, j], holdout.Y[:, j], resamples, seed + 1 + j)
            for j, t in enumerate(holdout.targets)
        },
        "rows": [
            {"label": label, "observed": float(o), "predicted": float(p)}
            for label, o, p in zip(holdout.labels, holdout.observed, objective)
        ],
    }
