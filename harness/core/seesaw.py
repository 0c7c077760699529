"""Seesaw events: between consecutive evaluations, one task rose by at least δ while another fell by at least δ.

Two rules (``eval.seesaw_test``):

- **paired** (:func:`paired_seesaw_events`, the default): eval items are fixed, so a task's change between two
  evaluations is a paired measurement. Each task's change is tested on its items — exact McNemar for 0/1 outcomes
  (proportion metrics, benchmark documents), a seeded sign-flip permutation test for the others — every p-value of
  the run is Benjamini–Hochberg corrected together, and an event needs both changes ≥ δ *and* both significant after the
  correction at ``alpha``. Under a null with no real change it reports an event in at most α of runs, where the
  untested rule fires in most of them at the quickstart's pool sizes; with a small δ the correction, not δ, decides
  (``tests/core/test_seesaw_power.py``; the rates: docs/evaluation.md, "How often each rule fires").
  What the events control (≥ 1 event in a run with no real change: ≤ α; no per-event bound otherwise):
  :func:`paired_seesaw_events`;
- **none** (:func:`seesaw_events`): the untested threshold rule on metric values alone. Kept for the cases where
  no per-item outcomes exist — runs stored before they were recorded, and rows re-read from ``metrics.parquet``
  by the analysis — and for exploratory runs with pools so small (≲ 30 items) that no test can reach
  significance; its events are movements, not findings.

Pure Python plus numpy/scipy (no torch, no polars needed), so the ``analysis`` package can reuse it on stored rows.

Semantics shared by both rules:

- per ``metric`` (default ``greedy`` and ``ft_hijack``) and per ``split``, the evaluations are ordered by step,
  and at equal steps by stage order (stages ordered by their first step, then by first appearance in ``rows``);
- two evaluations at the same step (a stage's last and the next stage's first) with the same values for the same
  tasks are one evaluation, labelled with the later stage: a stage that starts from the previous one's weights
  does not produce an empty comparison. If the values differ (the new stage starts from other weights), both are
  kept and the jump between them is compared like any other pair (``step_from == step_to``);
- for each consecutive pair of evaluations, every ordered pair (A rose by ≥ δ, B fell by ≥ δ) over the tasks
  present in both is a candidate event (a tolerance of 1e-9 makes a change of exactly δ count);
- a task's missing or NaN value is skipped; repeated rows for the same evaluation, task, split and metric: the last
  one wins.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from harness.core.metrics import PROPORTION_METRICS
from harness.core.stats import benjamini_hochberg, mcnemar_exact, paired_permutation_test

SEESAW_METRICS = ("greedy", "ft_hijack")
SEESAW_TESTS = ("paired", "none")  # eval.seesaw_test: paired_seesaw_events, seesaw_events
DEFAULT_ALPHA = 0.05
TOLERANCE = 1e-9

Point = tuple[Any, str]  # (step, stage) of one evaluation


def _as_dicts(rows: Any) -> list[Mapping[str, Any]]:
    if hasattr(rows, "to_dicts"):  # a polars DataFrame
        return rows.to_dicts()
    return list(rows)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _consecutive(
    rows: list[Mapping[str, Any]],
    metrics: list[str],
    payload: Callable[[Mapping[str, Any]], Any],
    same: Callable[[dict, dict], bool],
) -> list[tuple[tuple, str, str, Point, Point, dict, dict]]:
    """The consecutive evaluation pairs of every (metric, split) series, with the sort key of each pair.

    ``payload(row)`` is what a task contributes to an evaluation (a value, or per-item outcomes; None = skip);
    ``same(a, b)`` tells a repeated evaluation at a stage boundary. Returns ``(key, metric, split, before, after,
    {task: payload} before, {task: payload} after)`` with ``key = (step_from, stage_from, step_to, stage_to,
    metric index, split index)`` for time ordering."""
    first_step: dict[str, float] = {}
    appearance: dict[str, int] = {}
    for row in rows:
        stage = row.get("stage", "")
        appearance.setdefault(stage, len(appearance))
        first_step[stage] = min(first_step.get(stage, math.inf), row["step"])
    stage_rank = {s: i for i, s in enumerate(sorted(appearance, key=lambda s: (first_step[s], appearance[s])))}

    splits: dict[str, int] = {}
    series: dict[tuple[str, str], dict[Point, dict[str, Any]]] = {}
    for row in rows:
        if row["metric"] not in metrics:
            continue
        value = payload(row)
        if value is None:
            continue
        splits.setdefault(row["split"], len(splits))
        point = (row["step"], row.get("stage", ""))
        series.setdefault((row["metric"], row["split"]), {}).setdefault(point, {})[row["task"]] = value

    out = []
    for (metric, split), points in series.items():
        ordered = sorted(points, key=lambda p: (p[0], stage_rank[p[1]]))
        kept: list[Point] = []
        for point in ordered:
            if kept and kept[-1][0] == point[0] and same(points[kept[-1]], points[point]):
                kept[-1] = point  # the same evaluation recorded under the next stage: the later stage wins
            else:
                kept.append(point)
        for before, after in zip(kept, kept[1:]):
            key = (
                before[0],
                stage_rank[before[1]],
                after[0],
                stage_rank[after[1]],
                metrics.index(metric),
                splits[split],
            )
            out.append((key, metric, split, before, after, points[before], points[after]))
    return out


def _event(
    metric: str, split: str, before: Point, after: Point, up: str, up_by: float, down: str, down_by: float
) -> dict[str, Any]:
    return {
        "metric": metric,
        "split": split,
        "step_from": before[0],
        "step_to": after[0],
        "stage_from": before[1],
        "stage_to": after[1],
        "rose": up,
        "rose_by": up_by,
        "fell": down,
        "fell_by": down_by,
    }


def seesaw_events(
    rows: Iterable[Mapping[str, Any]], delta: float, metrics: Iterable[str] = SEESAW_METRICS
) -> list[dict[str, Any]]:
    """The untested threshold rule (``seesaw_test: none``; see the module docstring for when it is the right one).

    Events ``{metric, split, step_from, step_to, stage_from, stage_to, rose, rose_by, fell, fell_by}`` from
    rows with keys ``step, stage, task, split, metric, value`` (a list of dicts or a polars DataFrame), in time
    order, then metric (in ``metrics`` order), split, rising task, falling task."""
    metrics = list(metrics)
    pairs = _consecutive(_as_dicts(rows), metrics, lambda r: None if _missing(r["value"]) else float(r["value"]), _same)
    events: list[tuple[tuple, dict[str, Any]]] = []
    for key, metric, split, before, after, a, b in pairs:
        changes = [(task, b[task] - a[task]) for task in a if task in b]
        rose = [(t, d) for t, d in changes if d >= delta - TOLERANCE]
        fell = [(t, -d) for t, d in changes if -d >= delta - TOLERANCE]
        for up, up_by in rose:
            for down, down_by in fell:
                events.append(((*key, up, down), _event(metric, split, before, after, up, up_by, down, down_by)))
    return [event for _, event in sorted(events, key=lambda e: e[0])]


def _outcomes(row: Mapping[str, Any]) -> np.ndarray | dict[Any, float] | None:
    """A row's per-item outcomes: a float array (a sequence, in item order) or ``{item key: value}`` (a mapping,
    NaN and None dropped); ``None`` when there are none."""
    raw = row.get("outcomes")
    if raw is None:
        raise ValueError(
            f"paired seesaw test: the row for {row.get('task')}/{row.get('split')}/{row.get('metric')} "
            f"at step {row.get('step')} has no per-item 'outcomes' (use the untested rule, "
            "seesaw_test: none, for rows without them)"
        )
    if isinstance(raw, Mapping):
        kept = {key: float(v) for key, v in raw.items() if not _missing(v)}
        return kept or None
    values = np.array([math.nan if v is None else float(v) for v in raw])
    return values if values.size else None


def _paired(before: np.ndarray | dict, after: np.ndarray | dict) -> tuple[np.ndarray, np.ndarray]:
    """The two evaluations' values on the items present (and not NaN) in both."""
    if isinstance(before, dict) and isinstance(after, dict):
        common = [k for k in before if k in after]
        return np.array([before[k] for k in common]), np.array([after[k] for k in common])
    if isinstance(before, dict) or isinstance(after, dict) or before.shape != after.shape:
        raise ValueError(
            "paired seesaw test: the items of one task × split must be the same at every evaluation "
            "(outcomes as equally long sequences in item order, or as mappings keyed by item)"
        )
    both = ~(np.isnan(before) | np.isnan(after))
    return before[both], after[both]


def _binary(values: np.ndarray) -> bool:
    """Whether every value is 0 or 1. For such pairs the sign-flip test's exact null distribution is McNemar's
    (the differences are ±1 on the discordant items, 0 elsewhere), so the exact test is the same test without the
    resampled one's floor of ~1/resamples — a floor that Benjamini–Hochberg over a run's hundreds of tests never lets
    through (a benchmark's 0/1 documents, in a family that is not a proportion metric, could never be significant)."""
    return bool(np.all((values == 0) | (values == 1)))


def _same_outcomes(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two evaluations have identical outcomes for the same tasks (a repeated evaluation)."""
    if a.keys() != b.keys():
        return False
    for task in a:
        x, y = a[task], b[task]
        if isinstance(x, dict) or isinstance(y, dict):
            if x != y:
                return False
        elif x.shape != y.shape or not np.array_equal(x, y, equal_nan=True):
            return False
    return True


def change_tests(
    rows: Iterable[Mapping[str, Any]], metrics: Iterable[str] = SEESAW_METRICS, *, seed: int = 0, resamples: int = 2000
) -> list[dict[str, Any]]:
    """Every paired test of a task's change between consecutive evaluations, in time order (then metric, split,
    task).

    ``rows``: ``{step, stage, task, split, metric, outcomes}``, ``outcomes`` being the task × split's per-item
    values at that evaluation — a sequence in the (fixed) eval-item order, or a mapping item key → value. Items are
    paired by position or key; items missing or NaN at either evaluation are left out of that comparison.

    Returns ``{metric, split, step_from, step_to, stage_from, stage_to, task, change, n, test, p_raw}`` per task
    present at both evaluations: ``change`` is the difference of the paired items' means over ``n`` items,
    ``test`` is ``"mcnemar"`` (exact; metrics in :data:`PROPORTION_METRICS`, and any other whose paired values are
    all 0 or 1, such as a benchmark's per-document outcomes) or ``"permutation"`` (paired, ``resamples`` resamples
    seeded by ``seed`` and the test's identity, so each p-value is reproducible alone).
    """
    metrics = list(metrics)
    tests: list[tuple[tuple, dict[str, Any]]] = []
    discordant: list[tuple[dict[str, Any], int, int]] = []  # McNemar tests: (test, gained, lost)
    pairs = _consecutive(_as_dicts(rows), metrics, _outcomes, _same_outcomes)
    for key, metric, split, before, after, a, b in pairs:
        for task in (t for t in a if t in b):
            x, y = _paired(a[task], b[task])
            if not x.size:
                continue
            test = {
                "metric": metric,
                "split": split,
                "step_from": before[0],
                "step_to": after[0],
                "stage_from": before[1],
                "stage_to": after[1],
                "task": task,
                "change": float((y.sum() - x.sum()) / x.size),
                "n": int(x.size),
            }
            if metric in PROPORTION_METRICS or (_binary(x) and _binary(y)):
                x, y = x.astype(bool), y.astype(bool)
                discordant.append((test, int(np.count_nonzero(~x & y)), int(np.count_nonzero(x & ~y))))
                test.update(test="mcnemar", p_raw=math.nan)
            else:
                identity = zlib.crc32(f"{metric}|{split}|{before}|{after}|{task}".encode())
                test.update(
                    test="permutation", p_raw=paired_permutation_test(x, y, resamples=resamples, seed=[seed, identity])
                )
            tests.append(((*key, task), test))
    if discordant:  # all McNemar tests in one vectorised call: a run makes hundreds, the null simulation thousands
        p_values = mcnemar_exact(np.array([g for _, g, _ in discordant]), np.array([lost for _, _, lost in discordant]))
        for (test, _, _), p in zip(discordant, p_values):
            test["p_raw"] = float(p)
    return [test for _, test in sorted(tests, key=lambda t: t[0])]


def paired_seesaw_events(
    rows: Iterable[Mapping[str, Any]],
    delta: float,
    metrics: Iterable[str] = SEESAW_METRICS,
    *,
    alpha: float = DEFAULT_ALPHA,
    seed: int = 0,
    tests: list[dict[str, Any]] | None = None,
    correction: str = "bh",
) -> list[dict[str, Any]]:
    """The paired rule (``seesaw_test: paired``): events that pass a test, from per-item outcome rows (see
    :func:`change_tests`; pass ``tests`` to reuse a list it returned for the same rows).

    All of the run's tests — every task, metric, split and consecutive pair of evaluations, whether or not the
    change reached δ — form one Benjamini–Hochberg family, adjusted together. An event is (A rose, B fell) in the
    same pair of evaluations with both changes ≥ δ and both adjusted p-values ≤ ``alpha``. Each event is
    ``{metric, split, step_from, step_to, stage_from, stage_to, rose, rose_by, fell, fell_by, p_value, test}``,
    ``p_value`` being the larger of the two adjusted p-values (the event holds only if both changes do, so its
    evidence is that of the weaker one). Order as :func:`seesaw_events`.

    What this controls: BH makes the expected share of false changes among the changes found ≤ ``alpha`` (the
    false-discovery rate of changes, over the family above). An event is false when either of its changes is.
    When no task really changes anywhere in the run, every change found is false, so BH's FDR is the probability
    of finding any: the probability that a run reports ≥ 1 event is ≤ ``alpha`` (measured at 24 and 200 items:
    ``tests/core/test_seesaw_power.py``, ``bench/seesaw_null.py``). When some tasks do change, there is no per-event
    bound: one false change pairs with every real change of the opposite sign in the same interval, and the
    changes of two consecutive intervals share an evaluation (they are negatively correlated, outside the
    independence BH assumes); the false-event rate per run in that case is measured, not guaranteed.
    ``correction="none"`` (simulations only) uses each change's own p-value: no control of either.
    """
    metrics = list(metrics)
    if tests is None:
        tests = change_tests(rows, metrics, seed=seed)
    groups: dict[tuple, list[tuple[dict[str, Any], float]]] = {}
    for test, p_adj in significant_changes(tests, alpha=alpha, correction=correction):
        if abs(test["change"]) >= delta - TOLERANCE:
            where = (
                test["step_from"],
                test["stage_from"],
                test["step_to"],
                test["stage_to"],
                test["metric"],
                test["split"],
            )
            groups.setdefault(where, []).append((test, float(p_adj)))
    events = []
    for (step_from, stage_from, step_to, stage_to, metric, split), found in groups.items():
        rose = [(t, p) for t, p in found if t["change"] > 0]
        fell = [(t, p) for t, p in found if t["change"] < 0]
        for up, p_up in rose:
            for down, p_down in fell:
                event = _event(
                    metric,
                    split,
                    (step_from, stage_from),
                    (step_to, stage_to),
                    up["task"],
                    up["change"],
                    down["task"],
                    -down["change"],
                )
                event.update(p_value=max(p_up, p_down), test=up["test"])
                events.append(event)
    return events  # groups keep the tests' time order, and rising/falling tasks their order within it


def significant_changes(
    tests: list[dict[str, Any]], *, alpha: float = DEFAULT_ALPHA, correction: str = "bh"
) -> list[tuple[dict[str, Any], float]]:
    """The discoveries among a run's tests (:func:`change_tests`), in their order: ``(test, adjusted p)`` for every
    test whose Benjamini–Hochberg adjusted p-value (over all of ``tests``, one family) is ≤ ``alpha``, whatever its
    size. What BH guarantees is stated about these: when no task changes anywhere, the probability of ≥ 1 of them
    is ≤ ``alpha``; events (:func:`paired_seesaw_events`) are the pairs of them that also reach δ.
    ``correction="none"``: each test's own p-value."""
    if correction not in ("bh", "none"):
        raise ValueError(f"correction must be 'bh' or 'none', got {correction!r}")
    raw = [t["p_raw"] for t in tests]
    adjusted = benjamini_hochberg(raw) if correction == "bh" else np.asarray(raw, dtype=float)
    return [(test, float(p_adj)) for test, p_adj in zip(tests, adjusted) if p_adj <= alpha]


def _same(a: dict[str, float], b: dict[str, float]) -> bool:
    return a.keys() == b.keys() and all(abs(a[t] - b[t]) <= 1e-12 for t in a)


def format_events(events: list[Mapping[str, Any]]) -> str:
    """One console line per event, e.g. ``greedy/heldout  step 100→150 (mix)  yesno ↑0.250  assistant_qa ↓0.188
    p=0.0031`` (``(a→b)`` when the two evaluations are in different stages; ``p=`` for events of the paired rule,
    which carry an adjusted p-value)."""
    if not events:
        return "no seesaw events"
    keys = [f"{e['metric']}/{e['split']}" for e in events]
    width = max(len(k) for k in keys)
    lines = []
    for key, e in zip(keys, events):
        stages = e["stage_from"] if e["stage_from"] == e["stage_to"] else f"{e['stage_from']}→{e['stage_to']}"
        lines.append(
            f"{key:<{width}}  step {e['step_from']}→{e['step_to']} ({stages})  "
            f"{e['rose']} ↑{e['rose_by']:.3f}  {e['fell']} ↓{e['fell_by']:.3f}"
            + (f"  p={e['p_value']:.2g}" if e.get("p_value") is not None else "")
        )
    return "\n".join(lines)
