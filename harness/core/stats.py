"""The statistics the harness reports with its numbers: intervals, paired tests, false-discovery correction, power.

Thin wrappers over :mod:`scipy.stats` where it has the procedure; those that scipy lacks (the McNemar power
formula, the AUC's score interval) are written here and say so.

- :func:`wilson_interval` — 95 % Wilson score interval of a proportion (every ``greedy``/``mode_ok``/… rate);
- :func:`mcnemar_exact` — exact two-sided McNemar test for paired binary outcomes (the same items evaluated twice);
- :func:`paired_permutation_test` — seeded sign-flip permutation test of a mean difference for non-binary paired
  values;
- :func:`above_rate_p` — one-sided exact binomial test of a proportion against a fixed rate (score vs baseline);
- :func:`benjamini_hochberg` — BH-adjusted p-values (``scipy.stats.false_discovery_control``);
- :func:`t_interval` — Student-t interval of a mean across replicates (seeds), for values that are not proportions;
- :func:`seeds_items_interval` / :func:`seeds_rates_interval` — 95 % interval of a proportion measured by several
  seeds on the same items, accounting for both (two-way crossed variance components); none from one seed;
- :func:`auc_test` — ROC AUC of two classes' scores with a score interval (:func:`auc_score_interval`, valid at
  small classes) and a one-sided Mann–Whitney p-value;
- :func:`min_detectable_difference` — the smallest paired change in a proportion that a pool of ``n`` items
  detects at 80 % power.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from scipy import optimize, stats

CONFIDENCE = 0.95


class Interval(NamedTuple):
    """A point estimate with its interval and the count it rests on (``low``/``high`` NaN when undefined)."""

    estimate: float
    low: float
    high: float
    n: int


def wilson_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> Interval:
    """The Wilson score interval (no continuity correction) of ``successes / n``.

    Wilson rather than the normal ("Wald") interval: it stays inside [0, 1] and keeps its coverage near 0 and 1
    and at the small pools (12–200 items) evaluations use. ``n == 0`` gives NaNs.
    """
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n], got {successes} of {n}")
    ci = stats.binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    return Interval(successes / n, float(ci.low), float(ci.high), int(n))


def mcnemar_exact(gained: int | np.ndarray, lost: int | np.ndarray) -> float | np.ndarray:
    """Two-sided exact McNemar p-value from the discordant pairs: ``gained`` items went 0 → 1, ``lost`` 1 → 0.

    Under the null each discordant pair is equally likely to go either way, so ``gained ~ Binomial(gained + lost,
    1/2)``; the two-sided p-value of that symmetric binomial is twice the smaller tail, capped at 1 — identical to
    ``scipy.stats.binomtest(gained, gained + lost).pvalue`` (the tests check this), but vectorised through
    ``binom.cdf``, because a run makes hundreds of these tests and the null simulation hundreds of thousands.
    No discordant pairs give p = 1. Accepts scalars or arrays of counts.
    """
    gained, lost = np.asarray(gained), np.asarray(lost)
    total = gained + lost
    p = np.minimum(1.0, 2.0 * stats.binom.cdf(np.minimum(gained, lost), total, 0.5))
    p = np.where(total == 0, 1.0, p)
    return float(p) if p.ndim == 0 else p


def paired_outcomes_test(before: Sequence[float], after: Sequence[float]) -> float:
    """Exact McNemar p-value of binary outcomes (0/1) on the same items, in the same order, at two evaluations."""
    a, b = np.asarray(before, dtype=bool), np.asarray(after, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"paired outcomes need the same items: {a.shape} vs {b.shape}")
    return mcnemar_exact(int(np.sum(~a & b)), int(np.sum(a & ~b)))


def paired_permutation_test(
    before: Sequence[float], after: Sequence[float], *, resamples: int = 2000, seed: int | Sequence[int] = 0
) -> float:
    """Two-sided p-value that the mean of ``after - before`` (same items, same order) is zero, for non-binary
    paired values (ranks, reciprocal ranks, losses).

    The sign-flip permutation test: under the null each item's two values are exchangeable, so the sign of each
    difference is a coin flip. ``scipy.stats.permutation_test(permutation_type="samples")``, exact when
    2^n ≤ ``resamples``, otherwise ``resamples`` random sign patterns (seeded: the same data give the same
    p-value). Chosen over a paired bootstrap of the centred differences, which is liberal at the pool sizes used
    here (measured: docs/evaluation.md, "A proportion across seeds").
    """
    x, y = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if x.ndim != 1 or x.shape != y.shape or x.size == 0:
        raise ValueError("paired_permutation_test needs two equally long, non-empty sequences")
    if not np.any(y - x):
        return 1.0
    result = stats.permutation_test(
        (y, x),
        _mean_difference,
        permutation_type="samples",
        vectorized=True,
        n_resamples=resamples,
        alternative="two-sided",
        rng=np.random.default_rng(seed),
    )
    return float(result.pvalue)


def _mean_difference(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(a - b, axis=axis)


def above_rate_p(successes: int, n: int, rate: float) -> float:
    """One-sided exact binomial p-value that the true proportion behind ``successes / n`` exceeds ``rate`` (e.g.
    a final score against its baseline, the baseline taken as a fixed number): ``binomtest(..., alternative=
    "greater")``. A rate of 1 cannot be exceeded (p = 1); ``n == 0`` gives NaN."""
    if n == 0:
        return math.nan
    if rate >= 1:
        return 1.0
    return float(stats.binomtest(int(successes), int(n), rate, alternative="greater").pvalue)


def benjamini_hochberg(p_values: Sequence[float]) -> np.ndarray:
    """Benjamini–Hochberg adjusted p-values, in input order (reject where adjusted ≤ α controls the false-discovery
    rate at α). ``scipy.stats.false_discovery_control(method="bh")``; an empty input gives an empty array."""
    p = np.asarray(p_values, dtype=float)
    if p.size == 0:
        return p
    return stats.false_discovery_control(p, method="bh")


def t_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean of ``values`` (one per replicate, e.g. per seed) with its Student-t interval (n − 1 degrees of freedom);
    NaN bounds with fewer than two values, a zero-width interval when all values are equal."""
    x = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    n = int(x.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if n == 1:
        return Interval(mean, math.nan, math.nan, 1)
    sem = float(stats.sem(x))
    if sem == 0:
        return Interval(mean, mean, mean, n)
    low, high = stats.t.interval(confidence, n - 1, loc=mean, scale=sem)
    return Interval(mean, float(low), float(high), n)


def seeds_items_interval(outcomes: Sequence[Sequence[float]], confidence: float = CONFIDENCE) -> Interval:
    """The proportion behind ``outcomes[seed][item]`` (0/1; every seed scored on the same items, in the same order)
    with a 95 % interval that accounts for both the seeds (a training run is one draw of them) and the items (the
    eval pool is one draw of them); ``n``: the items per seed.

    The design is two-way crossed (seeds × items), so the grand mean's variance has a seed part, an item part and
    a residual (Miller 2024, "Adding error bars to evals", arXiv:2411.00640, §3 on clustered items; Cameron,
    Gelbach & Miller 2011, J. Bus. Econ. Stat. 29:238, two-way clustering). From the ANOVA mean squares of the
    S × n table:

    - seed part ``MS_seed / (S n)`` (estimates σ²_seed / S + σ²_res / (S n): it carries the residual too, so it is
      never truncated), scaled by Student t with S − 1 degrees of freedom — few seeds say little about how much
      seeds vary, and taking t from a Satterthwaite combination instead undercovered at 3 seeds (docs/evaluation.md,
      "A proportion across seeds");
    - item part ``max(MS_item − MS_res, 0) / (S n)`` (σ²_item / n), scaled by t with n − 1.

    The half-width is ``sqrt(t²_{S−1} · seed part + t²_{n−1} · item part)``, at least that of ``S n`` independent
    draws (so it is never zero-width while any outcome differs), and the interval is cut at 0 and 1. When every
    outcome is the same (nothing varies, e.g. 0 of 64 items in each of 3 seeds) it is the Wilson interval of the
    items: seeds that agree on every item add no information about the items. Coverage on simulated seeds × items
    with a known truth: ``tests/core/test_stats.py``. One seed gives NaN bounds (there is no across-seed interval;
    report that seed's :func:`wilson_interval`).
    """
    y = np.asarray(outcomes, dtype=float)
    if y.ndim != 2 or y.shape[1] == 0 or np.isnan(y).any():
        raise ValueError("seeds_items_interval needs a seeds × items table of 0/1 outcomes, the same items per seed")
    seeds, items = y.shape
    p = float(y.mean())
    if seeds < 2:
        return Interval(p, math.nan, math.nan, items)
    if y.min() == y.max():
        return Interval(p, *wilson_interval(int(round(p * items)), items, confidence)[1:3], items)
    seed_means, item_means = y.mean(axis=1), y.mean(axis=0)
    ms_seed = items * float(np.sum((seed_means - p) ** 2)) / (seeds - 1)
    ms_item = seeds * float(np.sum((item_means - p) ** 2)) / (items - 1) if items > 1 else 0.0
    residual = y - seed_means[:, None] - item_means[None, :] + p
    ms_res = float(np.sum(residual**2)) / ((seeds - 1) * max(items - 1, 1))
    cells = seeds * items
    return _two_part(p, ms_seed / cells, max(ms_item - ms_res, 0.0) / cells, seeds, items, confidence)


def seeds_rates_interval(
    rates: Sequence[float], n: int, confidence: float = CONFIDENCE, *, same_items: bool = True
) -> Interval:
    """A proportion across seeds when only each seed's rate over ``n`` items is known (no per-item outcomes).

    ``same_items`` (every seed scored on the same items, as in a ``--seeds`` group): the seed part from the rates'
    spread, the item part bounded above by ``p̂(1 − p̂) / n`` (the whole variance of one outcome, σ²_seed +
    σ²_item + σ²_res, is at least σ²_item) — conservative, never narrower than :func:`seeds_items_interval`
    would be. Otherwise (each seed draws its own items, as ``harness repro``'s seeds do) the seeds' rates are
    independent draws that carry their items' noise, and their spread is the whole variance: ``s² / S``, with t
    on S − 1 degrees of freedom (the cluster-robust interval with seeds as clusters), at least that of the
    ``S · n`` items pooled. Either way cut at 0 and 1, the items' (pooled, when they differ) Wilson interval when
    every rate is 0 or every rate is 1, and NaN bounds from one seed (or none).
    """
    r = np.asarray([v for v in rates if v is not None and not math.isnan(v)], dtype=float)
    if r.size == 0 or n <= 0:
        return Interval(math.nan, math.nan, math.nan, max(n, 0))
    p = float(r.mean())
    if r.size < 2:
        return Interval(p, math.nan, math.nan, n)
    pooled = n if same_items else n * int(r.size)
    if p in (0.0, 1.0):
        return Interval(p, *wilson_interval(int(round(p * pooled)), pooled, confidence)[1:3], n)
    spread = float(np.var(r, ddof=1)) / r.size
    if same_items:
        return _two_part(p, spread, p * (1 - p) / n, int(r.size), n, confidence)
    return _two_part(p, spread, 0.0, int(r.size), n, confidence)


def crossed_interval(table: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """Mean of a seeds × items table of real values (every seed on the same items) with a 95 % interval from the
    two-way crossed variance components, as :func:`harness.core.stats.seeds_items_interval` makes it for 0/1
    outcomes, without its cut at [0, 1] and its binomial floor (a difference of outcomes is neither); NaN bounds
    from one seed."""
    y = np.asarray(table, dtype=float)
    seeds, items = y.shape
    p = float(y.mean())
    if seeds < 2:
        return p, math.nan, math.nan
    seed_means, item_means = y.mean(axis=1), y.mean(axis=0)
    ms_seed = items * float(np.sum((seed_means - p) ** 2)) / (seeds - 1)
    if items > 1:
        ms_item = seeds * float(np.sum((item_means - p) ** 2)) / (items - 1)
        residual = y - seed_means[:, None] - item_means[None, :] + p
        ms_res = float(np.sum(residual**2)) / ((seeds - 1) * (items - 1))
        t_items = float(stats.t.ppf(0.5 + confidence / 2, items - 1))
    else:
        ms_item = ms_res = t_items = 0.0
    cells = seeds * items
    t_seeds = float(stats.t.ppf(0.5 + confidence / 2, seeds - 1))
    half = math.sqrt(t_seeds**2 * ms_seed / cells + t_items**2 * max(ms_item - ms_res, 0.0) / cells)
    return p, p - half, p + half


def _two_part(p: float, seed_part: float, item_part: float, seeds: int, items: int, confidence: float) -> Interval:
    """``p`` ± sqrt(t²_{seeds−1}·seed_part + t²_{items−1}·item_part), the total variance at least that of
    ``seeds · items`` independent draws (the shortfall added to the item part), cut at 0 and 1."""
    floor = p * (1 - p) / (seeds * items)
    item_part += max(0.0, floor - seed_part - item_part)
    q = 0.5 + confidence / 2
    t_items = stats.t.ppf(q, items - 1) if items > 1 else stats.norm.ppf(q)
    half = math.sqrt(stats.t.ppf(q, seeds - 1) ** 2 * seed_part + t_items**2 * item_part)
    return Interval(p, max(0.0, p - half), min(1.0, p + half), items)


def mcnemar_power(n: int, difference: float, discordant: float, alpha: float = 0.05) -> float:
    """Approximate power of the two-sided McNemar test on ``n`` paired items when the true change in the proportion
    is ``difference`` (= P(0→1) − P(1→0)) and a share ``discordant`` (= P(0→1) + P(1→0)) of items change.

    Hand-written (scipy has no power functions): the normal approximation of Connor (1987, Biometrics 43:207),
    ``Φ((|d|·√n − z_{1−α/2}·√ψ) / √(ψ − d²))``.
    """
    d, psi = abs(difference), discordant
    if not 0 < psi <= 1 or d > psi:
        raise ValueError(f"need 0 < discordant <= 1 and |difference| <= discordant, got {difference}, {discordant}")
    if psi - d * d <= 0:  # every item changed, all the same way: no variance left
        return 1.0
    z = stats.norm.ppf(1 - alpha / 2)
    return float(stats.norm.cdf((d * math.sqrt(n) - z * math.sqrt(psi)) / math.sqrt(psi - d * d)))


def min_detectable_difference(n: int, *, discordant: float = 0.5, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest change in a task's proportion between two evaluations of the same ``n`` items that the
    two-sided McNemar test at ``alpha`` detects with probability ``power`` (uncorrected for multiple tests).

    Paired, because that is the comparison the harness makes with its pools: seesaw events compare one task's
    fixed items at two evaluations. The answer depends on how many items change (``discordant``), unknown before
    a run; the default 0.5 is what two *independent* evaluations at accuracy 0.5 would disagree on — the
    two-sample case, and the conservative choice (the quickstart's evaluations change fewer items, docs/evaluation.md,
    Intervals, which gives a smaller difference). Returns ``math.inf`` when not even the largest change
    possible with that many changed items (``discordant``: all of them in one direction) reaches that power.
    """
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    if mcnemar_power(n, discordant * (1 - 1e-9), discordant, alpha) < power:
        return math.inf
    return float(
        optimize.brentq(
            lambda d: mcnemar_power(n, d, discordant, alpha) - power, 0.0, discordant * (1 - 1e-9), xtol=1e-6
        )
    )


class AucResult(NamedTuple):
    """The ROC AUC of scores between a positive and a negative class: estimate, 95 % score interval (Newcombe's),
    one-sided p-value (H1: positives score higher), and the class sizes. NaN throughout when a class is empty."""

    auc: float
    low: float
    high: float
    p_value: float
    n_positive: int
    n_negative: int

    @property
    def n(self) -> int:
        return self.n_positive + self.n_negative


def auc_test(positive: Sequence[float], negative: Sequence[float], confidence: float = CONFIDENCE) -> AucResult:
    """The probability that a positive item scores above a negative one (ties count ½): the ROC AUC, 0.5 = no
    ranking. The binary-choice metric of two-answer tasks (``choice_auc``: P(Yes) share of true vs false statements).

    The estimate and its one-sided p-value are scipy's Mann–Whitney U (``U / (m·n)``, ``alternative="greater"``,
    exact for small untied samples). The interval is :func:`auc_score_interval`, which stays valid when a class has
    few items (a yes/no pool with one or two items of a class is common) and never has zero width."""
    x, y = np.asarray(positive, dtype=float), np.asarray(negative, dtype=float)
    m, n = int(x.size), int(y.size)
    if m == 0 or n == 0:
        return AucResult(math.nan, math.nan, math.nan, math.nan, m, n)
    u, p_value = stats.mannwhitneyu(x, y, alternative="greater")
    auc = float(u) / (m * n)
    low, high = auc_score_interval(auc, m, n, confidence)
    return AucResult(auc, low, high, float(p_value), m, n)


def auc_score_interval(auc: float, m: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Newcombe's score interval for an AUC from ``m`` positives and ``n`` negatives (Newcombe 2006, "Confidence
    intervals for an effect size measure based on the Mann–Whitney statistic. Part 2", Stat. Med. 25:559, method
    5): every θ with ``|AUC − θ| ≤ z·sqrt(V(θ))``, V being Hanley & McNeil's variance (1982, Radiology 143:29)
    evaluated at θ, with both class sizes minus one replaced by ``(m + n)/2 − 1``:

        V(θ) = θ(1 − θ)/(m·n) · [1 + ((m + n)/2 − 1)·((1 − θ)/(2 − θ) + θ/(1 + θ))]

    Chosen over DeLong's interval, which estimates the variance from the placement values: with one item in a
    class one of its terms is undefined, and all placements equal (perfect separation, all scores tied) give
    zero variance, so its interval excluded 0.5 under the null far more often than the nominal 2.5 % at small
    classes (measured: ``tests/analysis/test_choice.py``). Like Wilson's for a proportion, this one takes its
    variance at θ, not at the estimate: V(0.5) is the exact null variance of U/(m·n) for untied scores,
    ``(m + n + 1)/(12·m·n)``, so "interval above 0.5" is the normal approximation of the one-sided Mann–Whitney
    test, and the interval has positive width at AUC 0 or 1. Hand-written: scipy has no interval for an AUC.
    Returns ``(low, high)`` in [0, 1]."""
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    half = (m + n) / 2 - 1

    def sd(theta: float) -> float:
        inner = 1 + half * ((1 - theta) / (2 - theta) + theta / (1 + theta))
        return math.sqrt(max(theta * (1 - theta) / (m * n) * inner, 0.0))

    # the brackets stop short of an estimate of exactly 0 or 1, where θ = the estimate is a trivial root (V = 0)
    low = 0.0 if auc <= 0 else optimize.brentq(lambda t: auc - t - z * sd(t), 0.0, min(auc, 1 - 1e-12))
    high = 1.0 if auc >= 1 else optimize.brentq(lambda t: t - auc - z * sd(t), max(auc, 1e-12), 1.0)
    return float(low), float(high)
