"""The interference (seesaw) matrix a fitted mixing law implies: for each swept task *i* and each target *j*, the
change the law predicts in target *j* when a share ``delta`` of the mixture moves to task *i* from the others in
proportion — ``w' = (1 − delta)·w + delta·e_i`` (the mixture stays on the simplex, the others keep their ratios) —
at a reference mixture, the sweep's in-sample winner's. Signed so that positive is better for the target (a rise of
a rate, a fall of a loss). A seesaw is a row whose cells have both signs: more of task *i* helps one target and hurts
another.

Hand-written: no library derives this from a fitted mixture law. It is the law's finite-difference answer to the
question the sweep was run for — who rises and who falls with a task's weight — with the law's uncertainty:

- the law is the form with the smallest cross-validated error of the targets (not of the objective: a seesaw whose
  two sides cancel in the objective leaves the objective's choice at the trials' mean);
- each cell's 95 % percentile interval over the bootstrap refits of that form (the proposal's resamples when it is
  the objective's form too, :func:`analysis.mixture_proposal.propose_data`), and the same interval
  Bonferroni-adjusted over the matrix's cells (the family: every swept task × every target) — from the resamples'
  order statistics when there are enough of them (``B ≥ m/0.025``: 480 for 12 cells), else by the normal
  approximation over the resamples (:func:`_adjusted`; the report says which);
- a cell is *called* (``+`` helps, ``−`` hurts) only when its adjusted interval excludes 0 **and** the law is
  supported for its target: it predicts that target on held-out trials better than the trials' mean (the held-out
  squared error of the target, paired per cross-validation fold, with a 95 % t interval above 0 —
  :func:`target_support`). A law that does not predict a target better than its mean implies nothing about what
  moves it, however narrow its resamples; the support is per target, not on the objective, because a seesaw whose
  two sides cancel in the objective is exactly what the matrix is for. Under the constant law there is no matrix.

The false-alarm rate on sweeps where the weights move nothing and the hit rate on a planted seesaw are measured in
``tests/analysis/test_mixture_interference.py`` and ``bench/mixing_laws_checks.py`` (docs/sweeps.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import norm

from analysis import mixing_laws as laws
from harness.core.stats import Interval

# The share moved to a task: a tenth of the mixture, a small step from the winner's mixture (which may sit on the edge
# of the explored hull: the law then extrapolates that step).
DELTA = 0.1


def shifted_mixtures(w: np.ndarray, delta: float = DELTA) -> np.ndarray:
    """``(k, k)``: row *i* is ``w`` with a share ``delta`` moved to task *i* from the others in proportion."""
    w = np.asarray(w, dtype=float)
    return (1.0 - delta) * w[None, :] + delta * np.eye(len(w))


def target_support(row: Any, mean: Any, Y: np.ndarray, folds: np.ndarray) -> list[Interval]:
    """Per target: how much ``row``'s form lowers the held-out squared error below the trials' mean's (``mean``'s),
    averaged per cross-validation fold, with its 95 % t interval over the folds — the support check
    (:func:`analysis.mixing_laws.improvement`) with each target alone as the objective."""
    return [laws.improvement(row, mean, Y, lambda y, j=j: np.asarray(y)[:, j], folds) for j in range(Y.shape[1])]


def interference_matrix(
    at: np.ndarray,
    boot_at: np.ndarray,
    boot_shifted: np.ndarray,
    fitted_at: np.ndarray,
    fitted_shifted: np.ndarray,
    *,
    weights: Sequence[str],
    targets: Sequence[str],
    better_higher: bool,
    support: Sequence[Interval] | None,
    form: str = "",
    delta: float = DELTA,
) -> dict[str, Any]:
    """The matrix at mixture ``at`` from the chosen law's predictions: ``fitted_at`` ``(targets,)`` and
    ``fitted_shifted`` ``(k, targets)`` of the law fitted on every row, ``boot_at`` ``(B, targets)`` and
    ``boot_shifted`` ``(B, k, targets)`` of its bootstrap refits; ``support``: :func:`target_support` (None: not
    measured, nothing is called). Returns ``{delta, at, family, adjusted_rank, support: {target: {gain, low, high,
    folds}}, cells: [{weight, target, effect, low, high, adjusted_low, adjusted_high, call}]}``."""
    if form == "constant":
        return {"delta": delta, "cells": [], "why": "the chosen law is the trials' mean: it implies no interference"}
    sign = 1.0 if better_higher else -1.0
    effect = sign * (fitted_shifted - fitted_at[None, :])  # (k, targets)
    boot = sign * (boot_shifted - boot_at[:, None, :])  # (B, k, targets)
    family = effect.size
    adj_low, adj_high, adjusted_by = _adjusted(effect, boot, family)
    low, high = np.percentile(boot, [2.5, 97.5], axis=0)
    cells = []
    for i, weight in enumerate(weights):
        for j, target in enumerate(targets):
            supported = support is not None and support[j].low > 0
            call = ""
            if supported and adj_low[i, j] > 0:
                call = "+"
            elif supported and adj_high[i, j] < 0:
                call = "-"
            cells.append(
                {
                    "weight": weight,
                    "target": target,
                    "effect": float(effect[i, j]),
                    "low": float(low[i, j]),
                    "high": float(high[i, j]),
                    "adjusted_low": float(adj_low[i, j]),
                    "adjusted_high": float(adj_high[i, j]),
                    "call": call,
                }
            )
    return {
        "delta": delta,
        "form": form,
        "at": {w: float(x) for w, x in zip(weights, at)},
        "family": family,
        "adjusted_by": adjusted_by,
        "support": {
            t: {"gain": g.estimate, "low": g.low, "high": g.high, "folds": g.n} for t, g in zip(targets, support or [])
        },
        "cells": cells,
    }


def _adjusted(effect: np.ndarray, boot: np.ndarray, family: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Each cell's interval Bonferroni-adjusted over ``family`` cells (two-sided 95 %): the bootstrap's order
    statistics when there are resamples enough for them — the ``floor(B·0.025/m)``-th from each end, which needs
    ``B ≥ m/0.025`` — else the normal approximation ``effect ± z(1 − 0.025/m)·sd`` over the resamples (the extreme
    resample of too few is not a Bonferroni bound: of 200, it sits near z = 2.75, where 36 cells need 3.2)."""
    resamples = boot.shape[0]
    rank = int(np.floor(resamples * 0.025 / family))
    if rank >= 1:
        ordered = np.sort(boot, axis=0)
        return ordered[rank - 1], ordered[resamples - rank], f"order statistics of {resamples} resamples"
    z = float(norm.ppf(1 - 0.025 / family))
    spread = z * boot.std(axis=0, ddof=1)
    needed = math.ceil(family / 0.025)
    return (
        effect - spread,
        effect + spread,
        f"normal approximation, z = {z:.2f} ({resamples} resamples; the order statistics need {needed})",
    )


def seesaw_rows(matrix: dict[str, Any]) -> list[str]:
    """The swept tasks whose called cells have both signs: more of the task helps one target and hurts another."""
    signs: dict[str, set[str]] = {}
    for cell in matrix["cells"]:
        if cell["call"]:
            signs.setdefault(cell["weight"], set()).add(cell["call"])
    return [w for w, s in signs.items() if s == {"+", "-"}]


def format_interference(matrix: dict[str, Any]) -> list[str]:
    """The matrix as ``harness mixture`` prints it: a row per swept task, a column per target, each cell the effect
    and its 95 % interval, ``+``/``−`` where it is called."""
    if not matrix:
        return []
    if not matrix["cells"]:
        return ["", f"interference: {matrix['why']}"]
    targets = list(dict.fromkeys(c["target"] for c in matrix["cells"]))
    weights = list(dict.fromkeys(c["weight"] for c in matrix["cells"]))
    by = {(c["weight"], c["target"]): c for c in matrix["cells"]}
    width = 27
    unsupported = [t for t in targets if not matrix["support"].get(t, {}).get("low", 0) > 0]
    lines = [
        "",
        f"interference the {matrix['form']} law implies at the winner's mixture (the form with the smallest CV error "
        f"of the targets): {matrix['delta']:.2f} of the mixture moved to a task "
        "(rows), change in each target (columns), positive = better; 95 % bootstrap interval; +/− where the interval "
        f"Bonferroni-adjusted over the {matrix['family']} cells ({matrix['adjusted_by']}) excludes 0 and the law "
        "beats the target's mean in CV"
        + (f" (not for {', '.join(unsupported)}: nothing called there)" if unsupported else ""),
        f"{'more of':<14}" + "".join(f"{t[:width]:>{width}}" for t in targets),
    ]
    for w in weights:
        row = f"{w[:14]:<14}"
        for t in targets:
            c = by[(w, t)]
            text = f"{c['effect']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]{c['call'] or ' '}"
            row += f"{text:>{width}}"
        lines.append(row)
    seesaw = seesaw_rows(matrix)
    if seesaw:
        lines.append(f"seesaw (helps one target, hurts another): more of {', '.join(seesaw)}")
    return lines
