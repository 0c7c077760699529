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
    python bench/mixing_laws_checks.py --reps 0 --coverage-reps 0 --holdout-reps 0 --shipped-reps 100

The last is the regime the shipped six-task sweep operates in (:func:`shipped_rates`): loss targets at the SNRs
measured on it, a law fitted on 32 proxy trials, 14 full-size held-out mixtures. ``--interference-reps N`` checks
the interference matrix a law implies in that regime (:func:`interference_rates`).
"""

from __future__ import annotations

import argparse

import numpy as np
import polars as pl

from analysis import mixing_laws as laws
from analysis.mixture_data import LawData
from analysis.mixture_holdout import agreement
from analysis.mixture_proposal import propose, propose_data
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


# The shipped six-task sweep's regime (docs/sweeps.md, "Proxy trials"): 6 weights, 32 proxy trials to fit on, 14
# full-size held-out mixtures, one seed each, and each loss target's full-size SNR as measured there (SNR = sd across
# mixtures / sd across seeds at one mixture; the sd across mixtures carries the seed noise too).
SHIPPED_TASKS, SHIPPED_FIT, SHIPPED_HELDOUT = 6, 32, 14
SHIPPED_SNRS = (16.13, 7.15, 4.49, 2.75, 1.67, 1.28)  # math, repeat, assistant_qa (templates), repeat (templates), …
# harness mixture's forms less the log-linear law, which is slow to refit 32 times a repetition (as FORMS above); the
# planted law is log-linear, so leaving it out can only lower the hit rates
SHIPPED_FORMS = ("constant", "scheffe", "scheffe2", "gp")


def _planted_target(rng: np.random.Generator, k: int) -> np.ndarray:
    """One target's exponents over ``k`` weights: falls with its own task's weight (the first), moved a little by
    the others' (a draw per repetition, so the rates average over laws, not over one)."""
    t = rng.uniform(-1.0, 1.0, k)
    t[0] = -3.0
    return t


def _target_law(t: np.ndarray, W: np.ndarray) -> np.ndarray:
    return 0.8 + np.exp(W @ t)


def _noise_sd(t: np.ndarray, snr: float, rng: np.random.Generator) -> float:
    """The seed noise that gives the law ``t`` the SNR ``snr`` over the design: SNR² = (var law + var noise) / var
    noise, so var noise = var law / (SNR² − 1); the law's variance over 4,000 draws of the design."""
    spread = _target_law(t, rng.dirichlet(np.ones(len(t)), 4000)).std()
    return float(spread / np.sqrt(snr**2 - 1.0))


def _law_from_proxies(W_fit: np.ndarray, y_fit: np.ndarray, W_held: np.ndarray) -> tuple[np.ndarray, bool]:
    """What harness mixture does with one target: cross-validate the forms on the proxy trials (leave one trial
    out), choose the smallest error, refit it on every proxy trial, predict the held-out mixtures; and whether the
    support check passes (the chosen form beats the trials' mean in cross-validation)."""
    Y, score = y_fit[:, None], lambda Y: Y[:, 0]
    forms = laws.usable_forms(len(W_fit) - 1, W_fit.shape[1], SHIPPED_FORMS)
    rows = laws.cross_validate(forms, W_fit, Y, [False], score)
    chosen = laws.choose(rows, by_seed=False)
    mean = next(r for r in rows if r.form == "constant")
    supported = chosen.form != "constant" and laws.improvement(chosen, mean, Y, score, np.arange(len(Y))).low > 0
    return laws.fit_law(chosen.form, W_fit, Y, [False]).predict(W_held)[:, 0], bool(supported)


def shipped_rates(reps: int) -> None:
    """Per loss-target SNR of the shipped sweep: how often the law fitted on 32 proxy trials ranks 14 full-size
    held-out mixtures significantly (ρ's bootstrap interval above 0) and at the issue's bar (ρ ≥ 0.8, interval's
    lower end above 0.5), with the proxy a faithful but noisier copy of the full-size law (its own outcomes at
    half the full-size SNR, scaled and shifted: a shorter stage's higher losses). Then the nulls: full-size outcomes
    the mixture does not move (SNR 1), a proxy whose law is another task's (the full-size law with its weights
    permuted), and proxy trials the mixture does not move. Beside each, how often the support check passes on the
    proxy trials."""
    k = SHIPPED_TASKS
    cases = [(f"planted, full-size SNR {snr}", snr, "faithful") for snr in SHIPPED_SNRS]
    cases += [("null: the mixture does not move the full-size target (SNR 1)", 1.0, "faithful")]
    cases += [("null: the proxy's law is another task's (full-size SNR 4.49)", 4.49, "unrelated")]
    cases += [("null: the proxy trials are seed noise alone (full-size SNR 4.49)", 4.49, "noise")]
    for name, snr, proxy in cases:
        significant = bar = constant = supported = 0
        rhos = []
        for rep in range(reps):
            rng = np.random.default_rng(5000 + rep)
            t = _planted_target(rng, k)
            W_fit, W_held = rng.dirichlet(np.ones(k), SHIPPED_FIT), rng.dirichlet(np.ones(k), SHIPPED_HELDOUT)
            # unrelated: the same law about another task (the weights permuted so that the target's own task is
            # another's), whose rank correlation with the full-size law over the design is about 0 or below
            t_proxy = t if proxy == "faithful" else t[np.roll(np.arange(k), 1 + rep % (k - 1))]
            proxy_sd = _noise_sd(t_proxy, max(snr / 2, 1.1), rng)  # the proxy at half the SNR (at least 1.1)
            y_fit = 0.3 + 1.3 * _target_law(t_proxy, W_fit) + rng.normal(0, 1.3 * proxy_sd, SHIPPED_FIT)
            if proxy == "noise":  # the mixture does not move the proxy: its outcomes are the noise alone
                y_fit = 1.5 + rng.normal(0, 1.3 * proxy_sd, SHIPPED_FIT)
            if snr > 1.0:
                held = _target_law(t, W_held) + rng.normal(0, _noise_sd(t, snr, rng), SHIPPED_HELDOUT)
            else:  # a constant law: the outcome is the seed noise alone
                held = 1.5 + rng.normal(0, 0.1, SHIPPED_HELDOUT)
            predicted, support = _law_from_proxies(W_fit, y_fit, W_held)
            supported += support
            constant += bool(np.ptp(predicted) == 0)  # the constant law chosen: no ranking (rho undefined)
            got = agreement(predicted, held, 2000, rep)
            rhos.append(got["rho"])
            significant += got["rho_low"] > 0
            bar += got["rho"] >= 0.8 and got["rho_low"] > 0.5
        print(f"{name}: median rho {np.nanmedian(rhos):.2f} where a law was chosen", flush=True)
        rate("  the support check passes on the proxy trials", supported, reps)
        rate("  the constant law chosen (no ranking)", constant, reps)
        rate("  rho significantly positive", significant, reps)
        rate("  rho >= 0.8 with the interval's lower end above 0.5 (the bar)", bar, reps)


def _seesaw_sweep(rng: np.random.Generator, snr: float | None) -> LawData:
    """A shipped-size sweep (32 trials over 6 weights, one seed each) of two loss targets: ``better`` falls and
    ``worse`` rises with the first task's weight (a planted seesaw), each with seed noise for ``snr``; ``snr`` None:
    the weights move neither (both targets seed noise alone)."""
    W = rng.dirichlet(np.ones(SHIPPED_TASKS), SHIPPED_FIT)
    t_better, t_worse = _planted_target(rng, SHIPPED_TASKS), rng.uniform(-1.0, 1.0, SHIPPED_TASKS)
    t_worse[0] = 2.0
    if snr is None:
        Y = 1.5 + rng.normal(0, 0.1, (SHIPPED_FIT, 2))
    else:
        Y = np.column_stack(
            [_target_law(t, W) + rng.normal(0, _noise_sd(t, snr, rng), SHIPPED_FIT) for t in (t_better, t_worse)]
        )

    def score(Y: np.ndarray) -> np.ndarray:
        return np.asarray(Y).mean(axis=-1)

    weights = [f"task{i}" for i in range(SHIPPED_TASKS)]
    return LawData("synthetic", PATH, weights, ["better", "worse"], W, Y, None, [False, False], score, "mean",
                   False, score(Y), list(range(SHIPPED_FIT)), kind="table")  # fmt: skip


def interference_rates(reps: int, bootstrap: int) -> None:
    """The interference matrix's calls (:mod:`analysis.mixture_interference`) in the shipped sweep's regime, with
    ``harness mixture``'s forms (less the log-linear law) and ``bootstrap`` resamples: on sweeps whose weights move
    nothing, how often any cell is called (the family-wise false alarm); on a planted seesaw at the shipped loss
    targets' SNRs, how often the first task's row is called a seesaw with the right signs."""
    for name, snr in [("null: the weights move neither target", None)] + [
        (f"planted seesaw, SNR {snr}", snr) for snr in (7.15, 4.49, 2.75)
    ]:
        called = seesaw = 0
        for rep in range(reps):
            matrix = propose_data(
                _seesaw_sweep(np.random.default_rng(7000 + rep), snr),
                forms=SHIPPED_FORMS,
                bootstrap=bootstrap,
                seed=rep,
            ).interference
            calls = {(c["weight"], c["target"]): c["call"] for c in matrix.get("cells", [])}
            called += any(calls.values())
            seesaw += calls.get(("task0", "better")) == "+" and calls.get(("task0", "worse")) == "-"
        print(name, flush=True)
        rate("  any cell called", called, reps)
        rate("  the planted row called a seesaw (+ on better, - on worse)", seesaw, reps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=30, help="Repetitions of the support check (noise and law).")
    parser.add_argument("--coverage-reps", type=int, default=20, help="Repetitions of the proposal (0: skip).")
    parser.add_argument("--trials", type=int, default=24, help="Trials per synthetic sweep (support check).")
    parser.add_argument("--bootstrap", type=int, default=100, help="Bootstrap resamples per proposal.")
    parser.add_argument("--holdout-reps", type=int, default=200, help="Repetitions of the held-out test (0: skip).")
    parser.add_argument("--heldout", type=int, default=16, help="Held-out mixtures per repetition.")
    parser.add_argument(
        "--shipped-reps", type=int, default=0, help="Repetitions of the shipped sweep's regime (loss targets, proxies)."
    )
    parser.add_argument(
        "--interference-reps", type=int, default=0, help="Repetitions of the interference matrix's check (0: skip)."
    )
    args = parser.parse_args()
    if args.interference_reps:
        interference_rates(args.interference_reps, 200)
    if args.shipped_reps:
        shipped_rates(args.shipped_reps)
    if args.reps:
        support_rates(args.reps, args.trials)
    if args.holdout_reps:
        holdout_rates(args.holdout_reps, args.trials, args.heldout)
    if args.coverage_reps:
        coverage(args.coverage_reps, 20, 0.03, args.bootstrap)


if __name__ == "__main__":
    main()
