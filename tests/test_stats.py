"""harness.core.stats against independent computations (closed forms, scipy's reference routines) and textbook values."""

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
    for g, l, p in zip(gained.ravel(), lost.ravel(), vectorised):
        reference = 1.0 if g + l == 0 else sps.binomtest(int(g), int(g + l), 0.5).pvalue
        assert p == pytest.approx(reference, rel=1e-9, abs=1e-15), (g, l)


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
    assert stats.paired_permutation_test(before, after, seed=3) == stats.paired_permutation_test(before, after,
                                                                                                 seed=3)
    assert stats.paired_permutation_test(before, after) < 0.01


def test_paired_permutation_false_positive_rate_under_the_null():
    rng = np.random.default_rng(7)
    trials = 300
    rejections = sum(stats.paired_permutation_test(rng.normal(size=30), rng.normal(size=30), resamples=400,
                                                   seed=i) <= 0.05 for i in range(trials))
    # valid at α: the rejection rate is not significantly above 5 % (a test that ignored the pairing or the
    # signs would be)
    assert stats.wilson_interval(rejections, trials).low <= 0.05


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
