"""The interference matrix a fitted law implies (:mod:`analysis.mixture_interference`): its shifted mixtures stay on
the simplex; on synthetic sweeps where the weights move nothing it calls a cell in few of them (the family-wise
false-alarm rate, every cell of the matrix one family), and on a planted seesaw — more of one task raises one target
and lowers the other — it calls that row a seesaw in most. Linear forms only (constant, scheffe, scheffe2), 100
bootstrap resamples: the check of the shipped defaults' regime (every form, 200 resamples) is
``bench/mixing_laws_checks.py --interference-reps``."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.mixture_data import LawData
from analysis.mixture_interference import DELTA, seesaw_rows, shifted_mixtures
from analysis.mixture_proposal import propose_data
from harness.core.stats import wilson_interval

WEIGHTS = ["a", "b", "c", "d"]
TARGETS = ["up", "down"]
FORMS = ["constant", "scheffe", "scheffe2"]


def _sweep(rng: np.random.Generator, slope: float, rows: int = 32, noise: float = 0.03) -> LawData:
    """``rows`` Dirichlet(1) mixtures of four tasks; target ``up`` rises and ``down`` falls by ``slope`` per unit of
    task a's weight (0: the weights move nothing), both with Gaussian seed noise."""
    W = rng.dirichlet(np.ones(len(WEIGHTS)), size=rows)
    Y = np.column_stack([0.5 + slope * W[:, 0], 0.5 - slope * W[:, 0]]) + rng.normal(0, noise, (rows, 2))

    def score(Y: np.ndarray) -> np.ndarray:
        return np.asarray(Y).mean(axis=-1)

    return LawData(
        source="synthetic",
        path="mixture",
        weights=WEIGHTS,
        targets=TARGETS,
        W=W,
        Y=Y,
        seeds=None,
        proportion=[False, False],
        score=score,
        objective="mean",
        maximize=True,
        observed=score(Y),
        labels=list(range(rows)),
        kind="table",
    )


def test_a_shifted_mixture_moves_a_share_to_one_task_and_keeps_the_others_ratios():
    w = np.array([0.1, 0.2, 0.3, 0.4])
    shifted = shifted_mixtures(w)
    assert shifted.sum(axis=1) == pytest.approx(np.ones(4))
    for i in range(4):
        assert shifted[i, i] == pytest.approx(w[i] + DELTA * (1 - w[i]))
        others = [j for j in range(4) if j != i]
        assert shifted[i, others] / w[others] == pytest.approx(np.full(3, 1 - DELTA))


def _calls(slope: float, reps: int, seed: int) -> tuple[int, int]:
    """(sweeps with any cell called, sweeps whose task a is called a seesaw: + on up, − on down)."""
    rng = np.random.default_rng(seed)
    anything = seesaw = 0
    for r in range(reps):
        matrix = propose_data(_sweep(rng, slope), forms=FORMS, bootstrap=100, seed=r).interference
        anything += any(c["call"] for c in matrix.get("cells", []))
        calls = {(c["weight"], c["target"]): c["call"] for c in matrix.get("cells", [])}
        seesaw += "a" in seesaw_rows(matrix) and calls[("a", "up")] == "+" and calls[("a", "down")] == "-"
    return anything, seesaw


def test_the_matrix_rarely_calls_a_null_and_finds_a_planted_seesaw():
    reps = 40
    false_alarms, _ = _calls(0.0, reps, seed=3)
    ci = wilson_interval(false_alarms, reps)
    assert false_alarms <= 3, f"{false_alarms}/{reps} null sweeps had a called cell ([{ci.low:.2f}, {ci.high:.2f}])"
    _, found = _calls(0.4, reps, seed=4)
    assert found >= 0.8 * reps, f"the planted seesaw was found in {found}/{reps}"


def test_a_matrix_that_cannot_be_fitted_leaves_the_proposal_standing(monkeypatch):
    """The matrix is a reading beside the proposal: a fit failing there is said in the matrix, and the proposal (and
    a budget row built on it) is the same as without the matrix."""

    def failing(*args, **kwargs):
        raise np.linalg.LinAlgError("singular matrix")

    data = _sweep(np.random.default_rng(0), 0.4)
    expected = propose_data(data, forms=FORMS, bootstrap=20, seed=0)
    monkeypatch.setattr("analysis.mixture_proposal.interference_matrix", failing)
    proposal = propose_data(data, forms=FORMS, bootstrap=20, seed=0)
    assert proposal.interference == {"cells": [], "why": "not computed (LinAlgError: singular matrix)"}
    assert proposal.mixture == expected.mixture and proposal.interval == expected.interval
