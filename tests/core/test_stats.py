"""harness.core.stats against independent computations (closed forms, scipy's reference routines) and textbook
values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from harness.core import stats

Z95 = sps.norm.ppf(0.975)


def wilson_closed_form(k: int, n: int) -> tuple[float, float]:
    """Wilson (1927) score interval written out."""
    p = k / n
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 / (1 + Z95**2 / n) * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n))
    return centre - half, centre + half


@pytest.mark.parametrize("k,n", [(0, 24), (1, 24), (12, 24), (23, 24), (24, 24), (81, 263), (150, 200)])
def test_wilson_matches_the_closed_form(k, n):
    got = stats.wilson_interval(k, n)
    low, high = wilson_closed_form(k, n)
    assert got.estimate == pytest.approx(k / n) and got.n == n
    assert got.low == pytest.approx(max(low, 0.0), abs=1e-9) and got.high == pytest.approx(min(high, 1.0), abs=1e-9)
    assert got.low <= got.estimate <= got.high


def test_wilson_textbook_values():
    # Newcombe (1998), Statistics in Medicine 17:857, Table I, method 3 (score interval without continuity correction)
    assert stats.wilson_interval(81, 263)[1:3] == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert stats.wilson_interval(0, 20)[1:3] == pytest.approx((0.0, 0.1611), abs=1e-4)


def test_wilson_empty_pool_and_bad_counts():
    assert all(math.isnan(x) for x in stats.wilson_interval(0, 0)[:3])
    with pytest.raises(ValueError):
        stats.wilson_interval(5, 4)


def test_mcnemar_equals_scipy_binomtest_on_every_small_table():
    gained, lost = np.meshgrid(np.arange(0, 30), np.arange(0, 30))
    vectorised = stats.mcnemar_exact(gained.ravel(), lost.ravel())
    for g, lo, p in zip(gained.ravel(), lost.ravel(), vectorised):
        reference = 1.0 if g + lo == 0 else sps.binomtest(int(g), int(g + lo), 0.5).pvalue
        assert p == pytest.approx(reference, rel=1e-9, abs=1e-15), (g, lo)


def test_mcnemar_textbook_value():
    # 1 item gained, 9 lost: p = 2 · P(X <= 1 | Binomial(10, 1/2)) = 2 · 11 / 1024
    assert stats.mcnemar_exact(1, 9) == pytest.approx(2 * (1 + 10) / 2**10)
    assert stats.mcnemar_exact(0, 0) == 1.0 and stats.mcnemar_exact(5, 5) == 1.0


def test_paired_outcomes_test_counts_discordant_items_only():
    before = [1, 1, 1, 0, 0, 0, 0, 0, 1, 1]
    after = [1, 0, 0, 1, 1, 1, 1, 1, 1, 1]  # 5 gained, 2 lost, 3 unchanged
    assert stats.paired_outcomes_test(before, after) == pytest.approx(sps.binomtest(5, 7).pvalue)
    with pytest.raises(ValueError):
        stats.paired_outcomes_test([1, 0], [1])


def sign_flip_reference(before, after):
    """Exact two-sided sign-flip p-value, enumerating all 2^n sign patterns."""
    diff = np.asarray(after) - np.asarray(before)
    observed = abs(diff.mean())
    means = [abs(np.mean(diff * signs)) for signs in itertools.product((1, -1), repeat=diff.size)]
    return np.mean([m >= observed - 1e-12 for m in means])


def test_paired_permutation_is_exact_on_small_pools():
    rng = np.random.default_rng(2)
    before, after = rng.normal(size=10), rng.normal(loc=0.8, size=10)
    assert stats.paired_permutation_test(before, after) == pytest.approx(sign_flip_reference(before, after))
    assert stats.paired_permutation_test(before, before) == 1.0
    assert stats.paired_permutation_test(before, before + 0.3) == pytest.approx(2 / 2**10)  # all up or all down
    with pytest.raises(ValueError):
        stats.paired_permutation_test([1.0, 2.0], [1.0])


def test_paired_permutation_is_seeded_and_detects_a_shift():
    rng = np.random.default_rng(1)
    before = rng.normal(size=40)
    after = before + 1.0 + rng.normal(scale=0.5, size=40)
    assert stats.paired_permutation_test(before, after, seed=3) == stats.paired_permutation_test(before, after, seed=3)
    assert stats.paired_permutation_test(before, after) < 0.01


# How many simulated trials a rate check needs to tell a valid 5 % from a broken 7 % (a paired bootstrap of centred
# differences rejects a true null in 7.2 % of trials at n = 30, and an interval whose coverage is 93 % misses in 7 %):
# with N trials, accept when at most C = the 99.9th percentile of Binomial(N, 0.05) miss (or reject). N = 4000 gives
# C = 244: a valid procedure fails with probability < 0.001 (not flaky) and a 7 % one passes with probability 0.013
# (powerful); N = 3000 would let a 7 % one pass in 6 % of seeds. test_the_rate_check_is_powerful_and_not_flaky
# checks these two numbers.
RATE_TRIALS = 4000
RATE_NULL, RATE_BROKEN = 0.05, 0.07


def accepted_misses(trials: int = RATE_TRIALS) -> int:
    return int(sps.binom.isf(0.001, trials, RATE_NULL))


def test_the_rate_check_is_powerful_and_not_flaky():
    c = accepted_misses()
    assert sps.binom.sf(c, RATE_TRIALS, RATE_NULL) <= 0.001  # a valid 5 % procedure fails this rarely
    assert sps.binom.cdf(c, RATE_TRIALS, RATE_BROKEN) <= 0.02  # a 7 % one passes this rarely


def test_paired_permutation_false_positive_rate_under_the_null():
    rng = np.random.default_rng(7)
    rejections = sum(
        stats.paired_permutation_test(rng.normal(size=30), rng.normal(size=30), resamples=400, seed=i) <= 0.05
        for i in range(RATE_TRIALS)
    )
    # valid at α: a test that ignored the pairing or the signs, or the liberal bootstrap (7 %), would exceed it
    assert rejections <= accepted_misses(), stats.wilson_interval(rejections, RATE_TRIALS)


def test_the_rate_check_fails_the_liberal_paired_bootstrap():
    """The check above on the procedure the permutation test replaced (a paired bootstrap of the centred
    differences, 400 resamples): it rejects a true null in ~7 % of trials at n = 30, and the check catches it."""
    rng = np.random.default_rng(7)
    diffs = rng.normal(size=(RATE_TRIALS, 30)) - rng.normal(size=(RATE_TRIALS, 30))
    observed = np.abs(diffs.mean(axis=1))
    centred = diffs - diffs.mean(axis=1, keepdims=True)
    rejections = 0
    for chunk in np.array_split(np.arange(RATE_TRIALS), 20):
        picks = rng.integers(0, 30, size=(chunk.size, 400, 30))
        boot = np.abs(np.take_along_axis(centred[chunk][:, None, :].repeat(400, axis=1), picks, axis=2).mean(axis=2))
        rejections += int(np.sum(np.mean(boot >= observed[chunk, None], axis=1) <= 0.05))
    assert rejections > accepted_misses(), stats.wilson_interval(rejections, RATE_TRIALS)


def bh_reference(p):
    """Benjamini & Hochberg (1995) step-up, written out: p_(i) · m / i, then the running minimum from the top."""
    p = np.asarray(p, dtype=float)
    m = p.size
    order = np.argsort(p)
    scaled = p[order] * m / np.arange(1, m + 1)
    adjusted = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    out = np.empty(m)
    out[order] = adjusted
    return out


def test_benjamini_hochberg_matches_the_step_up_procedure():
    p = np.random.default_rng(0).uniform(size=50) ** 3
    assert stats.benjamini_hochberg(p) == pytest.approx(bh_reference(p))
    assert stats.benjamini_hochberg([0.01, 0.02, 0.5]) == pytest.approx([0.03, 0.03, 0.5])
    assert stats.benjamini_hochberg([]).size == 0


def test_t_interval_textbook_and_edge_cases():
    got = stats.t_interval([1, 2, 3, 4, 5])
    half = sps.t.ppf(0.975, 4) * math.sqrt(2.5) / math.sqrt(5)  # t_{.975,4} · s / √n
    assert got == pytest.approx((3.0, 3.0 - half, 3.0 + half, 5))
    assert got.low == pytest.approx(1.0368, abs=1e-4)
    one = stats.t_interval([0.4])
    assert one.estimate == 0.4 and math.isnan(one.low) and one.n == 1
    assert stats.t_interval([0.5, 0.5, float("nan")]) == (0.5, 0.5, 0.5, 2)


def test_min_detectable_difference_has_the_promised_power():
    n, psi = 200, 0.2
    d = stats.min_detectable_difference(n, discordant=psi)
    assert 0 < d < psi
    # Simulate McNemar with the exact test at that difference: power close to 80 % (the approximation is normal).
    rng = np.random.default_rng(0)
    counts = rng.multinomial(n, [(psi + d) / 2, (psi - d) / 2, 1 - psi], size=4000)
    power = np.mean(stats.mcnemar_exact(counts[:, 0], counts[:, 1]) <= 0.05)
    assert 0.72 <= power <= 0.88


def test_min_detectable_difference_shrinks_with_n_and_caps_at_tiny_pools():
    sizes = [24, 50, 200, 800]
    mdds = [stats.min_detectable_difference(n) for n in sizes]
    assert mdds == sorted(mdds, reverse=True)
    assert mdds[-1] == pytest.approx(mdds[1] * math.sqrt(50 / 800), rel=0.1)  # ~ 1/√n
    assert stats.min_detectable_difference(24, discordant=0.2) == math.inf  # even 0.2 (all flips one way) is too weak


def test_above_rate_p_is_the_one_sided_binomial_tail():
    # P(X >= 15 | Binomial(20, 1/2)), written out
    tail = sum(math.comb(20, k) for k in range(15, 21)) / 2**20
    assert stats.above_rate_p(15, 20, 0.5) == pytest.approx(tail)
    assert stats.above_rate_p(10, 20, 1.0) == 1.0 and math.isnan(stats.above_rate_p(0, 0, 0.5))


# -- a proportion across seeds and items ------------------------------------------------------------------------


def logit_normal_truth(mu: float, sd: float) -> float:
    """E[logistic(mu + sd·Z)], Z standard normal (Gauss-Hermite, 200 nodes): the population accuracy."""
    x, w = np.polynomial.hermite_e.hermegauss(200)
    return float(np.sum(w / w.sum() / (1 + np.exp(-(mu + sd * x)))))


def simulated_tables(rng, runs: int, seeds: int, items: int, mu: float, seed_sd: float, item_sd: float):
    """Outcome tables of ``runs`` seeds × items experiments: P(item i right in seed s) = logistic(mu + u_s + v_i),
    u_s ~ N(0, seed_sd) (a training run's luck), v_i ~ N(0, item_sd) (an item's ease), each table a fresh draw of
    both; and the truth they estimate (the accuracy over the populations of seeds and items)."""
    u = rng.normal(0, seed_sd, (runs, seeds, 1))
    v = rng.normal(0, item_sd, (runs, 1, items))
    tables = rng.random((runs, seeds, items)) < 1 / (1 + np.exp(-(mu + u + v)))
    return tables.astype(float), logit_normal_truth(mu, math.hypot(seed_sd, item_sd))


@pytest.mark.parametrize(
    "seeds, items, mu, seed_sd, item_sd",
    [
        (3, 200, 0.0, 0.5, 1.0),  # seeds differ a lot (±0.1 in accuracy): the seed part decides
        (3, 64, -2.0, 0.3, 1.0),  # low accuracy (~0.16), a small pool
        (5, 200, 0.0, 0.0, 1.5),  # seeds exchangeable: only the items vary
    ],
)
def test_seeds_items_interval_covers_the_truth(seeds, items, mu, seed_sd, item_sd):
    rng = np.random.default_rng([seeds, items])
    tables, truth = simulated_tables(rng, RATE_TRIALS, seeds, items, mu, seed_sd, item_sd)
    misses, widths, estimates = 0, [], []
    for table in tables:
        ci = stats.seeds_items_interval(table)
        misses += not ci.low <= truth <= ci.high
        widths.append(ci.high - ci.low)
        estimates.append(ci.estimate)
        assert 0.0 <= ci.low < ci.high <= 1.0
    assert misses <= accepted_misses(), f"coverage {1 - misses / RATE_TRIALS:.4f}"
    # and not by being uselessly wide: within 2.5 times the width of the oracle interval (±1.96 true standard
    # errors of the estimate, measured over the tables); t with S − 1 = 2 degrees of freedom alone makes 2.2
    oracle = 2 * 1.96 * np.std(estimates)
    assert np.median(widths) < 2.5 * oracle, (np.median(widths), oracle)


def test_seeds_rates_interval_covers_the_truth():
    """Rates only (no per-item outcomes): conservative, so at least as often right."""
    rng = np.random.default_rng(5)
    tables, truth = simulated_tables(rng, RATE_TRIALS, 3, 100, 0.5, 0.3, 1.0)
    misses = sum(
        not ci.low <= truth <= ci.high
        for ci in (stats.seeds_rates_interval(t.mean(axis=1), t.shape[1]) for t in tables)
    )
    assert misses <= accepted_misses()


def test_seeds_intervals_are_never_zero_width_while_items_vary():
    agree = [[1, 0, 1, 1, 0, 0, 1, 0]] * 3  # three seeds, the same outcome on every item
    ci = stats.seeds_items_interval(agree)
    assert ci.estimate == 0.5 and ci.high - ci.low > 0.3 and ci.n == 8
    crossed = [[1, 0], [0, 1]]  # equal seed means, items differ between seeds
    assert stats.seeds_items_interval(crossed).high > stats.seeds_items_interval(crossed).low
    assert stats.seeds_rates_interval([0.5, 0.5, 0.5], 8).high - stats.seeds_rates_interval([0.5] * 3, 8).low > 0.3


def test_seeds_intervals_when_nothing_varies_and_from_one_seed():
    nothing = stats.seeds_items_interval([[0] * 64] * 3)  # docs/repro/dmt.md printed 0.000 [0.000, 0.000] here
    assert nothing == stats.wilson_interval(0, 64) and nothing.high > 0.05
    assert stats.seeds_rates_interval([0.0, 0.0, 0.0], 64) == stats.wilson_interval(0, 64)
    one = stats.seeds_items_interval([[1, 0, 1]])
    assert one.estimate == pytest.approx(2 / 3) and math.isnan(one.low) and math.isnan(one.high)
    assert math.isnan(stats.seeds_rates_interval([0.4], 10).low)
    near_one = stats.seeds_items_interval([[1] * 49 + [0]] * 2 + [[1] * 50])
    assert 0.0 <= near_one.low and near_one.high == 1.0  # cut at 1, not 1.01
    with pytest.raises(ValueError):
        stats.seeds_items_interval([[1, 0], [1]])
