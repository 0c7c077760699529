"""Coverage of the across-seed interval of a proportion (harness.core.stats.seeds_items_interval and, from rates
only, seeds_rates_interval) on simulated seeds × items tables with a known truth, each with its 95 % Wilson
interval and n; and the median width against the oracle (±1.96 true standard errors of the estimate).

Model: P(item i right in seed s) = logistic(mu + u_s + v_i), u_s ~ N(0, seed_sd), v_i ~ N(0, item_sd), a fresh
draw of seeds and items per table; the truth is the accuracy over both populations. Also the old rule (Student t
over the seed means, cut at [0, 1]) for comparison, and seeds_rates_interval(same_items=False) on tables in which
each seed draws its own items (as harness repro's seeds do).

    python bench/seeds_interval_coverage.py [--tables 4000]
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from harness.core.stats import seeds_items_interval, seeds_rates_interval, t_interval, wilson_interval

SCENARIOS = [  # seeds, items, mu, seed_sd, item_sd
    (3, 200, 0.0, 0.5, 1.0),
    (3, 64, -2.0, 0.3, 1.0),
    (5, 200, 0.0, 0.0, 1.5),
    (3, 200, 0.0, 0.3, 1.5),
    (2, 100, 0.0, 0.3, 1.0),
    (3, 200, -3.0, 0.3, 1.0),
    (3, 24, 0.0, 0.0, 0.5),
    (10, 50, -1.0, 0.3, 1.0),
]


def truth_of(mu: float, sd: float) -> float:
    x, w = np.polynomial.hermite_e.hermegauss(200)
    return float(np.sum(w / w.sum() / (1 + np.exp(-(mu + sd * x)))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=4000)
    args = parser.parse_args()
    print(
        f"{'seeds':>5} {'items':>5} {'mu':>5} {'seed_sd':>7} {'item_sd':>7} {'truth':>6}  "
        f"{'coverage items×seeds [95 % Wilson]':<36} {'rates only':<24} {'old t over seeds':<24} "
        f"{'own items per seed':<24} width/oracle"
    )
    for seeds, items, mu, seed_sd, item_sd in SCENARIOS:
        rng = np.random.default_rng([seeds, items, int(100 * seed_sd)])
        u = rng.normal(0, seed_sd, (args.tables, seeds, 1))
        v = rng.normal(0, item_sd, (args.tables, 1, items))
        tables = (rng.random((args.tables, seeds, items)) < 1 / (1 + np.exp(-(mu + u + v)))).astype(float)
        truth = truth_of(mu, math.hypot(seed_sd, item_sd))
        new = [seeds_items_interval(t) for t in tables]
        rates = [seeds_rates_interval(t.mean(axis=1), items) for t in tables]
        old = [t_interval(t.mean(axis=1)) for t in tables]
        # each seed its own items (harness repro): the same model with v drawn per seed and item
        own = (
            rng.random((args.tables, seeds, items))
            < 1 / (1 + np.exp(-(mu + u + rng.normal(0, item_sd, (args.tables, seeds, items)))))
        ).astype(float)
        nested = [seeds_rates_interval(t.mean(axis=1), items, same_items=False) for t in own]
        covered = lambda cis, truth=truth: sum(max(0.0, c.low) <= truth <= min(1.0, c.high) for c in cis)  # noqa: E731
        oracle = 2 * 1.96 * np.std([c.estimate for c in new])
        ratio = np.median([c.high - c.low for c in new]) / oracle
        cells = []
        for cis in (new, rates, old, nested):
            w = wilson_interval(covered(cis), args.tables)
            cells.append(f"{w.estimate:.4f} [{w.low:.4f}, {w.high:.4f}]")
        print(
            f"{seeds:>5} {items:>5} {mu:>5} {seed_sd:>7} {item_sd:>7} {truth:>6.3f}  {cells[0]:<36} "
            f"{cells[1]:<24} {cells[2]:<24} {cells[3]:<24} {ratio:.2f}"
        )
    print(f"n = {args.tables} tables per row")


if __name__ == "__main__":
    main()
