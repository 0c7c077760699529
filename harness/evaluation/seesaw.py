"""Seesaw events: between consecutive evaluations, one task rose by at least δ while another fell by at least δ.

Pure Python (no torch, no polars needed), so the ``analysis`` package can reuse it on stored metric rows.

Semantics of :func:`seesaw_events`:

- per ``metric`` (default ``greedy`` and ``ft_hijack``) and per ``split``, the evaluations are ordered by step,
  and at equal steps by stage order (stages ordered by their first step, then by first appearance in ``rows``);
- two evaluations at the same step (a stage's last and the next stage's first) with the same values for the same
  tasks are one evaluation, labelled with the later stage: a stage that starts from the previous one's weights
  does not produce an empty comparison. If the values differ (the new stage starts from other weights), both are
  kept and the jump between them is compared like any other pair (``step_from == step_to``);
- for each consecutive pair of evaluations, every ordered pair (A rose by ≥ δ, B fell by ≥ δ) over the tasks
  present in both is an event (a tolerance of 1e-9 makes a change of exactly δ count);
- a task's missing or NaN value is skipped; repeated rows for the same evaluation, task, split and metric: the last
  one wins.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

SEESAW_METRICS = ("greedy", "ft_hijack")
TOLERANCE = 1e-9


def _as_dicts(rows: Any) -> list[Mapping[str, Any]]:
    if hasattr(rows, "to_dicts"):  # a polars DataFrame
        return rows.to_dicts()
    return list(rows)


def seesaw_events(rows: Iterable[Mapping[str, Any]], delta: float,
                  metrics: Iterable[str] = SEESAW_METRICS) -> list[dict[str, Any]]:
    """Events ``{metric, split, step_from, step_to, stage_from, stage_to, rose, rose_by, fell, fell_by}`` from
    rows with keys ``step, stage, task, split, metric, value`` (a list of dicts or a polars DataFrame), in time
    order, then metric (in ``metrics`` order), split, rising task, falling task."""
    metrics = list(metrics)
    rows = _as_dicts(rows)

    first_step: dict[str, float] = {}
    appearance: dict[str, int] = {}
    for row in rows:
        stage = row.get("stage", "")
        appearance.setdefault(stage, len(appearance))
        first_step[stage] = min(first_step.get(stage, math.inf), row["step"])
    stage_rank = {s: i for i, s in enumerate(sorted(appearance, key=lambda s: (first_step[s], appearance[s])))}

    splits: dict[str, int] = {}
    series: dict[tuple[str, str], dict[tuple[int, str], dict[str, float]]] = {}
    for row in rows:
        if row["metric"] not in metrics:
            continue
        value = row["value"]
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        splits.setdefault(row["split"], len(splits))
        point = (row["step"], row.get("stage", ""))
        series.setdefault((row["metric"], row["split"]), {}).setdefault(point, {})[row["task"]] = float(value)

    events: list[tuple[tuple, dict[str, Any]]] = []
    for (metric, split), points in series.items():
        ordered = sorted(points, key=lambda p: (p[0], stage_rank[p[1]]))
        kept: list[tuple[int, str]] = []
        for point in ordered:
            if kept and kept[-1][0] == point[0] and _same(points[kept[-1]], points[point]):
                kept[-1] = point  # the same evaluation recorded under the next stage: the later stage wins
            else:
                kept.append(point)
        for before, after in zip(kept, kept[1:]):
            a, b = points[before], points[after]
            changes = [(task, b[task] - a[task]) for task in a if task in b]
            rose = [(t, d) for t, d in changes if d >= delta - TOLERANCE]
            fell = [(t, -d) for t, d in changes if -d >= delta - TOLERANCE]
            for up, up_by in rose:
                for down, down_by in fell:
                    key = (before[0], stage_rank[before[1]], after[0], stage_rank[after[1]],
                           metrics.index(metric), splits[split], up, down)
                    events.append((key, {
                        "metric": metric, "split": split,
                        "step_from": before[0], "step_to": after[0],
                        "stage_from": before[1], "stage_to": after[1],
                        "rose": up, "rose_by": up_by, "fell": down, "fell_by": down_by,
                    }))
    return [event for _, event in sorted(events, key=lambda e: e[0])]


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(abs(a[t] - b[t]) <= 1e-12 for t in a)


def format_events(events: list[Mapping[str, Any]]) -> str:
    """One console line per event, e.g. ``greedy/heldout  step 100→150 (mix)  yesno ↑0.250  assistant_qa ↓0.188``
    (``(a→b)`` when the two evaluations are in different stages)."""
    if not events:
        return "no seesaw events"
    keys = [f"{e['metric']}/{e['split']}" for e in events]
    width = max(len(k) for k in keys)
    lines = []
    for key, e in zip(keys, events):
        stages = e["stage_from"] if e["stage_from"] == e["stage_to"] else f"{e['stage_from']}→{e['stage_to']}"
        lines.append(f"{key:<{width}}  step {e['step_from']}→{e['step_to']} ({stages})  "
                     f"{e['rose']} ↑{e['rose_by']:.3f}  {e['fell']} ↓{e['fell_by']:.3f}")
    return "\n".join(lines)
