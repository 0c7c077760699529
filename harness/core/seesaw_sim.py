"""Simulated evaluation histories for calibrating the seesaw detectors: a null (nothing changes but noise) and a
planted effect (one task rises and another falls at one interval).

The null mirrors the quickstart's evaluation schedule as the issue measured it: items are fixed, and between two
evaluations a share ``flip`` (0.2) of the items change outcome — the churn a model shows while training on other
tasks — while every task's accuracy stays where it is. Flips respect each item's state: a right item turns wrong
with probability ``flip / (2·accuracy)`` and a wrong one turns right with ``flip / (2·(1 − accuracy))``, so as many
items are expected to turn each way and the accuracy is stationary at any level (a flip that ignored the state
would drift every task to 0.5). A planted effect replaces one interval's noise for two tasks by a real change: task
A's wrong items turn right, task B's right items turn wrong, with probabilities set so the expected change is
``+size`` and ``-size``.

Used by ``tests/core/test_seesaw_power.py`` (the false-event rate ≤ α at 24 and at 200 items, the correction deciding at
200, the planted effect found) and ``bench/seesaw_null.py`` (the rates with their intervals and n).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.core.seesaw import DEFAULT_ALPHA, change_tests, paired_seesaw_events, seesaw_events

METRIC = "greedy"


@dataclass(frozen=True)
class Schedule:
    """One run's evaluations: ``intervals + 1`` evaluations of ``tasks`` × ``splits`` pools of ``items`` each."""

    tasks: int = 6
    items: int = 24
    intervals: int = 11
    splits: int = 3
    accuracy: float = 0.5
    flip: float = 0.2

    def __post_init__(self) -> None:
        if not 0 < self.accuracy < 1 or not 0 <= self.flip <= 2 * min(self.accuracy, 1 - self.accuracy):
            raise ValueError(
                f"need 0 < accuracy < 1 and flip ≤ 2·min(accuracy, 1 − accuracy) (as many items turning "
                f"each way), got accuracy {self.accuracy}, flip {self.flip}"
            )

    def turn(self, current: np.ndarray) -> np.ndarray:
        """Each item's probability of changing outcome at the next evaluation (stationary at ``accuracy``)."""
        return np.where(current, self.flip / (2 * self.accuracy), self.flip / (2 * (1 - self.accuracy)))


@dataclass(frozen=True)
class Planted:
    """A real change at one interval (evaluation ``interval`` → ``interval + 1``): ``rise_task`` up by ``size``,
    ``fall_task`` down by ``size``, in every split."""

    interval: int = 5
    rise_task: int = 0
    fall_task: int = 1
    size: float = 0.4


def simulate_outcomes(schedule: Schedule, rng: np.random.Generator, planted: Planted | None = None) -> np.ndarray:
    """Per-item outcomes ``[evaluation, split, task, item]`` (bool) of one simulated run."""
    s = schedule
    shape = (s.splits, s.tasks, s.items)
    out = np.empty((s.intervals + 1, *shape), dtype=bool)
    out[0] = rng.random(shape) < s.accuracy
    for k in range(s.intervals):
        current = out[k]
        following = current ^ (rng.random(shape) < s.turn(current))
        if planted is not None and k == planted.interval:
            following[:, planted.rise_task] = _shift(current[:, planted.rise_task], planted.size, rng)
            following[:, planted.fall_task] = ~_shift(~current[:, planted.fall_task], planted.size, rng)
        out[k + 1] = following
    return out


def _shift(outcomes: np.ndarray, size: float, rng: np.random.Generator) -> np.ndarray:
    """Wrong items turn right with the probability that raises each row's mean by ``size`` (in expectation);
    right items stay right."""
    wrong_share = np.maximum((~outcomes).mean(axis=-1, keepdims=True), 1e-12)
    turn = rng.random(outcomes.shape) < np.minimum(1.0, size / wrong_share)
    return outcomes | turn


def outcome_rows(outcomes: np.ndarray, step_every: int = 10) -> list[dict[str, Any]]:
    """The rows both detectors read: ``{step, stage, task, split, metric, value, outcomes}`` per evaluation,
    split and task (tasks ``t0``…, splits ``s0``…, one stage ``sim``)."""
    rows = []
    for k, evaluation in enumerate(outcomes):
        for split, tasks in enumerate(evaluation):
            for task, items in enumerate(tasks):
                rows.append(
                    {
                        "step": k * step_every,
                        "stage": "sim",
                        "task": f"t{task}",
                        "split": f"s{split}",
                        "metric": METRIC,
                        "value": float(items.mean()),
                        "outcomes": items.tolist(),
                    }
                )
    return rows


def simulate_run(
    schedule: Schedule,
    rng: np.random.Generator,
    *,
    delta: float = 0.15,
    alpha: float = DEFAULT_ALPHA,
    planted: Planted | None = None,
) -> dict[str, list[dict]]:
    """The detectors on one simulated run: ``{"none": [events of the untested rule], "paired": [...], "uncorrected":
    [the paired rule without the Benjamini-Hochberg correction: each change's own p-value ≤ α]}``."""
    rows = outcome_rows(simulate_outcomes(schedule, rng, planted))
    tests = change_tests(rows, [METRIC])
    return {
        "none": seesaw_events(rows, delta, [METRIC]),
        "paired": paired_seesaw_events(rows, delta, [METRIC], alpha=alpha, tests=tests),
        "uncorrected": paired_seesaw_events(rows, delta, [METRIC], alpha=alpha, tests=tests, correction="none"),
    }


def false_events(events: list[dict], planted: Planted | None = None, step_every: int = 10) -> list[dict]:
    """The events that are not a real change: all of them under the null; with a planted effect, those that are
    not the planted pair at its interval (a later drift back of a planted task is a real change too, and is not
    counted)."""
    if planted is None:
        return list(events)
    tasks = {f"t{planted.rise_task}", f"t{planted.fall_task}"}
    return [
        e for e in events if not ({e["rose"], e["fell"]} <= tasks and e["step_from"] >= planted.interval * step_every)
    ]


def found_planted(events: list[dict], planted: Planted, step_every: int = 10) -> bool:
    """Whether ``events`` contain the planted (rise task ↑, fall task ↓) at its interval, in any split."""
    return any(
        e["rose"] == f"t{planted.rise_task}"
        and e["fell"] == f"t{planted.fall_task}"
        and e["step_from"] == planted.interval * step_every
        for e in events
    )
