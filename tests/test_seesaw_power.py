"""The seesaw detectors on simulated histories: false events under the issue's null, detection of a planted effect.

Null: the quickstart's schedule (6 tasks, 24 items per task and split, 11 intervals, 3 splits, accuracy 0.5, 20 % of
items flipping between evaluations). Planted: task 0 +0.4 and task 1 −0.4 at one interval, 200 items.
"""

from __future__ import annotations

import numpy as np

from harness.core.seesaw import DEFAULT_ALPHA
from harness.core.seesaw_sim import Planted, Schedule, found_planted, simulate_run
from harness.core.stats import wilson_interval

NULL_RUNS = 300  # enough that a detector firing in α = 5 % of runs fails the bound below almost surely
PLANTED_RUNS = 40


def test_null_false_event_rate_is_at_most_alpha():
    rng = np.random.default_rng(13)
    runs = [simulate_run(Schedule(), rng) for _ in range(NULL_RUNS)]
    untested = wilson_interval(sum(bool(r["none"]) for r in runs), NULL_RUNS)
    paired = wilson_interval(sum(bool(r["paired"]) for r in runs), NULL_RUNS)
    assert untested.low > 0.8  # the null is the issue's: the untested rule fires in ~90 % of runs
    assert paired.high <= DEFAULT_ALPHA, paired  # the whole 95 % interval of the paired rule's rate is ≤ α


def test_planted_effect_is_found():
    rng = np.random.default_rng(14)
    planted = Planted(interval=5, rise_task=0, fall_task=1, size=0.4)
    runs = [simulate_run(Schedule(items=200), rng, planted=planted) for _ in range(PLANTED_RUNS)]
    found = sum(found_planted(r["paired"], planted) for r in runs)
    assert found / PLANTED_RUNS >= 0.9
    # and nothing else: every paired event is the planted one, or the drift back to 0.5 that follows it
    planted_tasks = {"t0", "t1"}
    assert all({e["rose"], e["fell"]} == planted_tasks for r in runs for e in r["paired"])
