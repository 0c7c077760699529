"""The evidence behind a run's numbers, as the run writes it: per-item outcomes gathered into the rows the paired
seesaw test reads, the seesaw of a whole run under ``eval.seesaw_test``, the baselines of every eval pool, and the
``0.458 [0.28,0.65] n=24`` form every console line uses.

Outcome rows are keyed by item index (``samples.jsonl`` records carry each item's 0/1 ``outcomes``), so the same
rows come from an evaluation in memory, from the samples of a resumed run, and from a finished run's
``samples.jsonl`` read by the analysis. No torch here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from harness.core.metrics import BASELINE_PREFIX, BENCH_TASK_PREFIX, SEESAW_TESTS_METRIC, is_benchmark_task
from harness.core.seesaw import SEESAW_METRICS, change_tests, paired_seesaw_events, seesaw_events
from harness.core.seesaw_families import BENCH_FAMILY  # the event family (metric and split) of benchmark_family
from harness.core.store import Row
from harness.evaluation.baselines import Baseline, strongest_baselines, task_baselines
from harness.evaluation.forgetting import REF_FAMILY, REF_TASK_PREFIX, paired_t_pvalues, reference_family


def outcome_rows(samples: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``{step, stage, task, split, metric, outcomes}`` per evaluation × task × split × metric from sample records
    (``samples.jsonl`` lines, or an evaluation's samples with ``stage``/``step`` added); ``outcomes`` maps item
    index → 0/1. Samples without ``outcomes`` (runs from before they were recorded) contribute nothing."""
    grouped: dict[tuple, dict[Any, float]] = {}
    for s in samples:
        for metric, value in (s.get("outcomes") or {}).items():
            key = (s["step"], s["stage"], s["task"], s["split"], metric)
            grouped.setdefault(key, {})[s["index"]] = value
    return [
        {"step": step, "stage": stage, "task": task, "split": split, "metric": metric, "outcomes": outcomes}
        for (step, stage, task, split, metric), outcomes in grouped.items()
    ]


def run_seesaw(
    outcomes: list[dict[str, Any]],
    values: list[dict[str, Any]],
    *,
    test: str,
    delta: float,
    alpha: float,
    seed: int,
    metrics: Sequence[str] = SEESAW_METRICS,
) -> tuple[list[dict[str, Any]], int]:
    """``(events, number of paired tests made)`` for a run: the paired rule on per-item ``outcomes`` rows
    (:func:`outcome_rows`), benchmarks (:func:`benchmark_family`) and the forgetting probe's reference text
    (:func:`harness.evaluation.forgetting.reference_family`, paired t-tests) included, or with ``test == "none"``
    the untested threshold rule on metric ``values`` rows (``{step, stage, task, split, metric, value}``; 0 tests;
    our tasks only)."""
    if test == "none":
        return seesaw_events(values, delta, metrics), 0
    tests = change_tests(outcomes, metrics, seed=seed)
    family = benchmark_family(outcomes)
    if family:  # benchmarks: their changes and the tasks' over the same spans, in the same BH family
        tests += change_tests(family, [BENCH_FAMILY], seed=seed)
    reference = reference_family(outcomes)
    if reference:  # the reference text falls when its loss rises: its changes meet the tasks' in the same family
        ref_tests = change_tests(reference, [REF_FAMILY], seed=seed)
        paired_t_pvalues(ref_tests, reference)
        tests += ref_tests
    events = paired_seesaw_events(outcomes, delta, metrics, alpha=alpha, seed=seed, tests=tests)
    # in the two added families only events of their own (benchmark, reference) count: the tasks' own families
    # report the task-vs-task ones at their finer spans
    own = {BENCH_FAMILY: BENCH_TASK_PREFIX, REF_FAMILY: REF_TASK_PREFIX}
    return [e for e in events if e["metric"] not in own or own[e["metric"]] in e["rose"] + e["fell"]], len(tests)


def benchmark_family(outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Outcome rows that let the paired seesaw pair a benchmark with a task: at every evaluation where benchmarks
    ran (the run's start and stage ends by default: sparser than the tasks'), each benchmark metric's per-document
    outcomes (task ``bench:world_mc/acc``) and each task's ``greedy`` per split (``yesno/heldout``), all under
    metric and split :data:`BENCH_FAMILY` — so a benchmark's change between two such evaluations is tested against
    every task's change over the same span. Events between two tasks in this family are dropped by
    :func:`run_seesaw` (the tasks' own families report them at their finer spans)."""
    points = {(o["step"], o["stage"]) for o in outcomes if is_benchmark_task(o["task"])}
    out = []
    for o in outcomes:
        if (o["step"], o["stage"]) not in points:
            continue
        if is_benchmark_task(o["task"]):
            task = f"{o['task']}/{o['metric']}"
        elif o["metric"] == "greedy":
            task = f"{o['task']}/{o['split']}"
        else:
            continue
        out.append({**o, "task": task, "metric": BENCH_FAMILY, "split": BENCH_FAMILY})
    return out


def seesaw_rows(events: list[dict[str, Any]], n_tests: int, spec: Any, stage: str, step: int) -> list[Row]:
    """Store rows of a run's seesaw: one ``seesaw`` row per event (value: the rise; text: the event as JSON,
    ``p_value`` included under the paired rule) and one run-level ``seesaw_tests`` row saying which rule ran — so
    the analysis knows the run's own events are stored, even when there are none."""
    rule = {"test": spec.seesaw_test, "alpha": spec.seesaw_alpha, "delta": spec.seesaw_delta}
    return [
        *(
            Row(e["stage_to"], e["step_to"], e["rose"], e["split"], "seesaw", e["rose_by"], json.dumps(e))
            for e in events
        ),
        Row(stage, step, None, "eval", SEESAW_TESTS_METRIC, float(n_tests), json.dumps(rule)),
    ]


def pool_baselines(items: Iterable[Any], recipes: Mapping[str, Any]) -> dict[tuple[str, str], list[Baseline]]:
    """Every baseline of every task × split eval pool (:func:`harness.evaluation.baselines.task_baselines`) from
    the eval items (gold text and gold token ids), in order of first appearance."""
    pools: dict[tuple[str, str], list[Any]] = {}
    for item in items:
        pools.setdefault((item.task, item.split), []).append(item)
    return {
        (task, split): task_baselines(
            [it.gold_text for it in pool], [it.gold_ids[0] if it.gold_ids else None for it in pool], recipes[task]
        )
        for (task, split), pool in pools.items()
    }


def baseline_rows(baselines: dict[tuple[str, str], list[Baseline]], stage: str, step: int) -> list[Row]:
    """``baseline_<metric>`` store rows: per task × split and metric the strongest baseline (the one a score must
    beat), with its pool size ``n`` and, as JSON text, what it is (``kind``, ``answer``)."""
    return [
        Row(
            stage,
            step,
            task,
            split,
            BASELINE_PREFIX + metric,
            b.value,
            json.dumps({"kind": b.kind, "answer": b.answer}),
            n=b.n,
        )
        for (task, split), found in baselines.items()
        for metric, b in strongest_baselines(found).items()
    ]


def baselines_summary(baselines: dict[tuple[str, str], list[Baseline]]) -> dict[str, dict[str, list[dict]]]:
    """``{split: {task: [{metric, kind, value, n, answer}, ...]}}`` for ``summary.json``."""
    out: dict[str, dict[str, list[dict]]] = {}
    for (task, split), found in baselines.items():
        out.setdefault(split, {})[task] = [
            {"metric": b.metric, "kind": b.kind, "value": b.value, "n": b.n, "answer": b.answer} for b in found
        ]
    return out


def format_score(value: float | None, low: float | None = None, high: float | None = None, n: int | None = None) -> str:
    """``0.458 [0.28,0.65] n=24`` for a proportion with its interval; the bare value otherwise (``-`` if none)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    text = f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    if low is not None and high is not None and not math.isnan(low):
        text += f" [{low:.2f},{high:.2f}]"
    if n is not None:
        text += f" n={n}"
    return text
