"""The families of seesaw events, named once for every surface that shows a run's events (the console, the report,
the analysis), so that each says which families it counts.

An event's ``metric`` names the family of tests it came from: tasks against tasks on each seesaw metric (``greedy``,
``ft_hijack``) and, under the paired rule, tasks against benchmarks (:data:`BENCH_FAMILY`,
``harness.evaluation.evidence.benchmark_family``) and against the forgetting probe's reference text
(:data:`REF_FAMILY`, ``harness.evaluation.forgetting.reference_family``). The untested threshold rule reads the tasks'
values only: task–task. No imports, so the evaluation's light modules name their family from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: The seesaw family in which benchmarks meet the tasks (event metric and split)
BENCH_FAMILY = "bench_vs_greedy"
#: The seesaw family in which the forgetting probe's reference text meets the tasks (event metric and split)
REF_FAMILY = "ref_vs_greedy"

#: Each event metric a run may store, with its family's name in words (in the order surfaces list them)
FAMILY_LABELS = {
    "greedy": "task–task",
    "ft_hijack": "task–task first-token hijack",
    BENCH_FAMILY: "task–benchmark",
    REF_FAMILY: "task–reference text",
}
EVENT_METRICS = tuple(FAMILY_LABELS)


def family_label(metric: str) -> str:
    """The family of an event on ``metric`` in words (an event recomputed on another metric: task–task on it)."""
    return FAMILY_LABELS.get(metric, f"task–task {metric}")


def family_counts(events: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The number of events per family, families in :data:`FAMILY_LABELS` order, then others as they appear."""
    counts: dict[str, int] = {}
    for event in events:
        label = family_label(event["metric"])
        counts[label] = counts.get(label, 0) + 1
    order = list(FAMILY_LABELS.values())
    return dict(sorted(counts.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))


def describe_counts(events: Iterable[Mapping[str, Any]]) -> str:
    """``4 task–task, 2 task–reference text``; ``none`` for no events."""
    return ", ".join(f"{n} {label}" for label, n in family_counts(events).items()) or "none"


def families_scope(test: str) -> str:
    """Which families a run's events cover under its rule (``eval.seesaw_test``), in words."""
    if test == "paired":
        return "families: task–task, and task–benchmark and task–reference text where evaluated"
    return "family: task–task only"
