"""How often the mixture proposal's checks are right, on synthetic sweeps drawn from a known law (no training):

- the support check (:func:`analysis.mixing_laws.improvement`: the chosen form beats the trials' mean on held-out
  trials) on pure noise — its false-alarm rate — and on a planted log-linear law — its hit rate; beside it, how
  often the smallest cross-validated error alone picks a form other than the mean on noise;
- the held-out test (:func:`analysis.mixture_holdout.agreement`: the objective's Spearman ρ on held-out mixtures,
  significantly positive when its bootstrap interval lies above 0) on held-out outcomes that are pure noise — its
  false-alarm rate — and on held-out mixtures drawn from the planted law — its hit rate;
- the proposal's bootstrap intervals (:func:`analysis.mixture_proposal.propose`): how often the interval of the
  predicted objective covers the law's value at the proposal, how often the prediction interval covers a fresh
  noisy trial there, and how often the proposal is truly better than the sweep's in-sample winner.

Every rate is printed with its n and 95 % Wilson interval. The figures in docs/sweeps.md ("From a sweep to the
mixture") come from::

    python bench/mixing_laws_checks.py --reps 30 --coverage-reps 20   # ~15 min on 2 busy CPU cores
    python bench/mixing_laws_checks.py --reps 0 --coverage-reps 0 --holdout-reps 200   # the held-out test only
"""

from __future__ import annotations

import argparse

import numpy as np
import polars as pl

from analysis import mixing_laws as laws
from analysis.mixture_holdout import agreement
from analysis.mixture_proposal import propose
from harness.core.stats import wilson_interval

TASKS = ["yesno", "assistant_qa", "repeat"]
PATH = "stages[1].mixture"
# The planted law (the tests' law): L = C + K·exp(T @ w) per target task, a loss, best at an interior mixture.
C = np.array([0.5, 0.8, 0.3])
K = np.array([1.0, 0.6, 0.8])
T = np.array([[-3.0, 1.0, 0.5], [0.5, -2.5, 1.0], [1.0, 0.5, -2.0]])
FORMS = ("constant", "scheffe", "scheffe2", "gp")  # the log-linear law is slow to refit 60 times a repetition


def law(W: np.ndarray) -> np.ndarray:
    return C + K * np.exp(W @ T.T)


def rate(name: str, k: int, n: int) -> None:
    interval = wilson_interval(k, n)
    print(f"{name}: {k} of {n} ({k / n:.2f} [{interval.low:.2f}, {interval.high:.2f}])", flush=True)


def support_rates(reps: int, trials: int) -> None:
    score = lambda Y: Y.mean(axis=1)  # noqa: E731
    picked = alarms = hits = 0
    for rep in range(reps):
        rng = np.random.default_rng(1000 + rep)
        W, Y = rng.dirichlet(np.ones(3), size=trials), rng.normal(size=(trials, 3))
        rows = laws.cross_validate(FORMS, W, Y, [False] * 3, score)
        chosen = laws.choose(rows, by_seed=False)
        picked += chosen.form != "constant"
        alarms += chosen.form != "constant" and laws.improvement(chosen, rows[0], Y, score, np.arange(trials)).low > 0
        rng = np.random.default_rng(2000 + rep)
        W = rng.dirichlet(np.ones(3), size=trials)
        Y = law(W) + rng.normal(0, 0.05, size=(trials, 3))
        rows = laws.cross_validate(FORMS, W, Y, [False] * 3, score)
        chosen = laws.choose(rows, by_seed=False)
        hits += chosen.form != "constant" and laws.improvement(chosen, rows[0], Y, score, np.arange(trials)).low > 0
    rate("noise: the smallest CV error picks a form", picked, reps)
    rate("noise: the support check fires (false alarm)", alarms, reps)
    rate("planted law, noise sd 0.05: the support check fires (hit)", hits, reps)


def holdout_rates(reps: int, trials: int, heldout: int) -> None:
    """The held-out ρ test of the log-linear law (the planted form) fitted on ``trials`` planted-law trials (noise
    sd 0.05), on ``heldout`` fresh mixtures whose outcomes are pure noise (false alarm) or drawn from the law with
    the same noise (hit)."""
    score = lambda Y: Y.mean(axis=1)  # noqa: E731
    alarms = hits = 0
    for rep in range(reps):
        rng = np.random.default_rng(4000 + rep)
        W = rng.dirichlet(np.ones(3), size=trials + heldout)
        Y = law(W) + rng.normal(0, 0.05, size=(len(W), 3))
        fitted = laws.fit_law("loglinear", W[:trials], Y[:trials], [False] * 3)
        predicted = score(fitted.predict(W[trials:]))
        noise = rng.normal(size=heldout)
        alarms += agreement(predicted, noise, 2000, rep)["rho_low"] > 0
        hits += agreement(predicted, score(Y[trials:]), 2000, rep)["rho_low"] > 0
    rate(f"held-out test, {heldout} mixtures of noise: rho significantly positive (false alarm)", alarms, reps)
    rate(f"held-out test, {heldout} mixtures of the planted law: rho significantly positive (hit)", hits, reps)


def sweep(W: np.ndarray, Y: np.ndarray) -> tuple[pl.DataFrame, dict]:
    data = {"number": list(range(len(W))), "state": ["COMPLETE"] * len(W), "objective": Y.mean(axis=1)}
    data.update({f"param/{PATH}.{t}": W[:, i] for i, t in enumerate(TASKS)})
    data.update({f"metric/mix/heldout/{t}/eval_loss": Y[:, j] for j, t in enumerate(TASKS)})
    config = {
        "space": {PATH: {"simplex": TASKS}},
        "objective": {"metric": "eval_loss", "split": "heldout", "tasks": TASKS, "reduce": "mean"},
    }
    return pl.DataFrame(data), config


def coverage(reps: int, trials: int, noise: float, bootstrap: int) -> None:
    covered = fresh_covered = better = 0
    for rep in range(reps):
        rng = np.random.default_rng(3000 + rep)
        W = rng.dirichlet(np.ones(3), size=trials)
        p = propose(*sweep(W, law(W) + rng.normal(0, noise, size=(trials, 3))), bootstrap=bootstrap, seed=rep)
        truth = law(np.array([[p.mixture[t] for t in TASKS]]))[0].mean()
        winner = law(np.array([[p.winner["mixture"][t] for t in TASKS]]))[0].mean()
        fresh = truth + rng.normal(0, noise, 3).mean()  # one more trial at the proposal
        covered += p.mean_interval[0] <= truth <= p.mean_interval[1]
        fresh_covered += p.interval[0] <= fresh <= p.interval[1]
        better += truth < winner
    rate("the interval of the predicted objective covers the law's value", covered, reps)
    rate("the prediction interval covers a fresh trial", fresh_covered, reps)
    rate("the proposal is truly better than the in-sample winner", better, reps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=30, help="Repetitions of the support check (noise and law).")
    parser.add_argument("--coverage-reps", type=int, default=20, help="Repetitions of the proposal (0: skip).")
    parser.add_argument("--trials", type=int, default=24, help="Trials per synthetic sweep (support check).")
    parser.add_argument("--bootstrap", type=int, default=100, help="Bootstrap resamples per proposal.")
    parser.add_argument("--holdout-reps", type=int, default=200, help="Repetitions of the held-out test (0: skip).")
    parser.add_argument("--heldout", type=int, default=16, help="Held-out mixtures per repetition.")
    args = parser.parse_args()
    if args.reps:
        support_rates(args.reps, args.trials)
    if args.holdout_reps:
        holdout_rates(args.holdout_reps, args.trials, args.heldout)
    if args.coverage_reps:
        coverage(args.coverage_reps, 20, 0.03, args.bootstrap)


if __name__ == "__main__":
    main()
