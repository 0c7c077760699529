"""The seesaw detectors on simulated histories: false events under the null, the regime in which the correction
decides, and planted effects that must be found.

Null: the quickstart's schedule (6 tasks, 11 intervals, 3 splits, 20 % of items changing outcome between
evaluations, accuracy stationary), at 24 items per task and split (the quickstart's pools: the δ threshold decides)
and at 200 (small δ: each change's own test decides, and the Benjamini-Hochberg correction decides whether the run
reports anything). What the events control (harness.core.seesaw.paired_seesaw_events): under this null, the
probability that a run reports ≥ 1 event is ≤ α; what the correction itself guarantees, tested apart because the
event tests cannot catch a loose correction: the probability of ≥ 1 discovery is ≤ α. Rates are per run; every check
uses a seeded generator.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from harness.core.seesaw import DEFAULT_ALPHA, change_tests, significant_changes
from harness.core.seesaw_sim import (
    METRIC,
    Planted,
    Schedule,
    false_events,
    found_planted,
    outcome_rows,
    simulate_outcomes,
    simulate_run,
)
from harness.core.stats import wilson_interval

NULL_RUNS = 300  # enough that a detector firing in α = 5 % of runs fails the bound below almost surely
PLANTED_RUNS = 40
# The regime where the correction decides: 200 items, δ = 0.03 — about one standard deviation of a null change
# (√(0.2·200)/200 = 0.032), so the threshold lets almost every change through to its test. Measured here
# (bench/seesaw_null.py --items 200 --delta 0.03): the uncorrected paired rule reports ≥ 1 event in ~20 % of runs.
SMALL_DELTA = 0.03
WIDE_NULL_RUNS = 200


def test_null_false_event_rate_is_at_most_alpha():
    rng = np.random.default_rng(13)
    runs = [simulate_run(Schedule(), rng) for _ in range(NULL_RUNS)]
    untested = wilson_interval(sum(bool(r["none"]) for r in runs), NULL_RUNS)
    paired = wilson_interval(sum(bool(r["paired"]) for r in runs), NULL_RUNS)
    assert untested.low > 0.8  # the null is the issue's: the untested rule fires in ~90 % of runs
    assert paired.high <= DEFAULT_ALPHA, paired  # the whole 95 % interval of the paired rule's rate is ≤ α


DISCOVERY_RUNS = 400


def test_null_rate_of_any_discovery_is_at_most_alpha():
    """The guarantee BH itself makes, tested where it can fail: under the complete null its false-discovery rate is
    the probability that a run has ≥ 1 discovery (any change significant after the correction, whatever δ), so
    that per-run rate must be ≤ α. The event tests above cannot see a miscalibrated correction: an event needs two
    discoveries of opposite sign in one interval, which the corrected rule almost never makes under the null, so a
    correction several times too loose still passes them."""
    rng = np.random.default_rng(31)
    runs = 0
    for _ in range(DISCOVERY_RUNS):
        tests = change_tests(outcome_rows(simulate_outcomes(Schedule(items=200), rng)), [METRIC])
        runs += bool(significant_changes(tests, alpha=DEFAULT_ALPHA))
    # The most runs with a discovery that a rule at exactly α gives with probability ≥ 99.9 % (the 99.9 % quantile
    # of Binomial(DISCOVERY_RUNS, α), ~9 % of runs): exceeding it is a real excess, not bad luck. The exact
    # McNemar tests are discrete, so the measured rate sits below α (~3 %); a correction 5x too loose gives ~15 %.
    assert runs <= stats.binom.ppf(0.999, DISCOVERY_RUNS, DEFAULT_ALPHA), runs


@pytest.mark.parametrize("accuracy", [0.2, 0.5, 0.85])
def test_the_simulated_null_is_stationary_at_any_accuracy(accuracy):
    """Flips respect each item's state: the accuracy stays put (state-blind flips drift every task to 0.5: at 0.2
    the last of 12 evaluations would average 0.50, not 0.20), and the share of items changing is ``flip``."""
    rng = np.random.default_rng(3)
    schedule = Schedule(items=200, accuracy=accuracy)
    outcomes = np.stack([simulate_outcomes(schedule, rng) for _ in range(20)])  # [run, evaluation, split, task, item]
    per_evaluation = outcomes.mean(axis=(0, 2, 3, 4))
    cells = outcomes[:, 0].size  # outcomes per evaluation: sd of its mean ≤ √(0.25 / cells) ≈ 0.0014
    assert np.all(np.abs(per_evaluation - accuracy) < 5 * np.sqrt(accuracy * (1 - accuracy) / cells)), per_evaluation
    changed = (outcomes[:, 1:] != outcomes[:, :-1]).mean()
    assert changed == pytest.approx(schedule.flip, abs=0.005)
    with pytest.raises(ValueError):
        Schedule(accuracy=0.05, flip=0.2)  # half of a 0.2 churn would have to turn wrong: more than are right


def test_at_200_items_the_correction_decides():
    """The uncorrected rule (each change's own p ≤ α) reports false events in a share of runs well above α; with
    BH over the run's tests, at most α (the whole 95 % interval)."""
    rng = np.random.default_rng(21)
    runs = [simulate_run(Schedule(items=200), rng, delta=SMALL_DELTA) for _ in range(WIDE_NULL_RUNS)]
    uncorrected = wilson_interval(sum(bool(r["uncorrected"]) for r in runs), WIDE_NULL_RUNS)
    corrected = wilson_interval(sum(bool(r["paired"]) for r in runs), WIDE_NULL_RUNS)
    assert uncorrected.low > DEFAULT_ALPHA, uncorrected  # without the correction the run reports noise
    assert corrected.high <= DEFAULT_ALPHA, corrected
    assert all(r["none"] for r in runs)  # and the δ threshold alone decides nothing here


def test_planted_effect_is_found():
    rng = np.random.default_rng(14)
    planted = Planted(interval=5, rise_task=0, fall_task=1, size=0.4)
    runs = [simulate_run(Schedule(items=200), rng, planted=planted) for _ in range(PLANTED_RUNS)]
    found = sum(found_planted(r["paired"], planted) for r in runs)
    assert found / PLANTED_RUNS >= 0.9
    # and nothing else: every paired event is the planted one, or the drift back to 0.5 that follows it
    planted_tasks = {"t0", "t1"}
    assert all({e["rose"], e["fell"]} == planted_tasks for r in runs for e in r["paired"])


def test_a_small_planted_effect_is_found_where_the_correction_decides():
    """±0.12 at 200 items and δ = 0.03, at accuracy 0.7: found in (nearly) every run, while the runs reporting a
    false event stay few under the correction and not without it."""
    rng = np.random.default_rng(15)
    planted = Planted(interval=5, rise_task=0, fall_task=1, size=0.12)
    schedule = Schedule(items=200, accuracy=0.7)
    runs = [simulate_run(schedule, rng, delta=SMALL_DELTA, planted=planted) for _ in range(PLANTED_RUNS)]
    found = wilson_interval(sum(found_planted(r["paired"], planted) for r in runs), PLANTED_RUNS)
    assert found.low >= 0.85, found
    corrected = sum(bool(false_events(r["paired"], planted)) for r in runs)
    uncorrected = sum(bool(false_events(r["uncorrected"], planted)) for r in runs)
    assert corrected <= 0.15 * PLANTED_RUNS < uncorrected, (corrected, uncorrected)
