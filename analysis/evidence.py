"""What a run's numbers rest on, read back from its store: the eval pools' baselines, final scores tested against
them, and the seesaw events the run itself decided (with their p-values).

- :func:`baselines` — the ``baseline_<metric>`` rows a run logs at its start (per task × split: the strongest of
  the best constant answer, the majority first token and chance);
- :func:`above_baseline` — each task's final score, its 95 % interval, its baseline and the one-sided exact
  binomial p-value that it is above the baseline, Benjamini–Hochberg corrected over the tasks;
- :func:`stored_seesaw_events` — the ``seesaw`` rows of runs that recorded which rule decided them (a
  ``seesaw_tests`` row); runs from before that get None, and :func:`analysis.seesaw_events` recomputes them with the
  untested rule (the store has no per-item outcomes to test with).
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl

from harness.core.metrics import BASELINE_PREFIX, SEESAW_TESTS_METRIC
from harness.core.seesaw_families import EVENT_METRICS
from harness.core.stats import above_rate_p, benjamini_hochberg

BASELINE_SCHEMA = {
    "run_id": pl.Utf8,
    "task": pl.Utf8,
    "split": pl.Utf8,
    "metric": pl.Utf8,
    "baseline": pl.Float64,
    "n": pl.Int64,
    "kind": pl.Utf8,
}
EVENT_SCHEMA = {
    "run_id": pl.Utf8,
    "metric": pl.Utf8,
    "split": pl.Utf8,
    "step_from": pl.Int64,
    "step_to": pl.Int64,
    "stage_from": pl.Utf8,
    "stage_to": pl.Utf8,
    "rose": pl.Utf8,
    "rose_by": pl.Float64,
    "fell": pl.Utf8,
    "fell_by": pl.Float64,
    "p_value": pl.Float64,
    "test": pl.Utf8,
}


def _with_run_id(frame: pl.DataFrame) -> pl.DataFrame:
    return frame if "run_id" in frame.columns else frame.with_columns(pl.lit("run").alias("run_id"))


def baselines(frame: pl.DataFrame) -> pl.DataFrame:
    """``run_id, task, split, metric, baseline, n, kind`` — one row per task × split × metric with a baseline
    (``metric`` without the ``baseline_`` prefix; ``kind``: constant_answer, majority_first_token or chance).
    Empty for runs stored before baselines were logged."""
    rows = _with_run_id(frame).filter(pl.col("metric").str.starts_with(BASELINE_PREFIX), pl.col("task").is_not_null())
    if rows.is_empty():
        return pl.DataFrame(schema=BASELINE_SCHEMA)
    kinds = [json.loads(t).get("kind") if t else None for t in rows["text"].to_list()]
    return (
        rows.with_columns(pl.col("metric").str.strip_prefix(BASELINE_PREFIX), pl.Series("kind", kinds, dtype=pl.Utf8))
        .unique(["run_id", "task", "split", "metric"], keep="last", maintain_order=True)
        .select(
            "run_id", "task", "split", "metric", pl.col("value").alias("baseline"), pl.col("n").cast(pl.Int64), "kind"
        )
    )


def above_baseline(final: pl.DataFrame, base: pl.DataFrame, alpha: float = 0.05) -> pl.DataFrame:
    """Final scores against their baselines: ``final`` holds one row per task (``task, value, n, ci_low,
    ci_high``) of one metric and split, ``base`` the matching rows of :func:`baselines`. Returns ``task, value,
    ci_low, ci_high, n, baseline, kind, p, p_adj, above`` — ``p`` the one-sided exact binomial p-value of
    ``round(value · n)`` successes against the baseline rate, ``p_adj`` Benjamini–Hochberg over these tasks,
    ``above`` whether ``p_adj ≤ alpha``. Tasks without a baseline or an item count are left out."""
    joined = final.join(base.select("task", "baseline", "kind"), on="task", how="inner").filter(
        pl.col("n").is_not_null(), pl.col("value").is_not_null()
    )
    if joined.is_empty():
        return joined.with_columns(pl.lit(None, dtype=pl.Float64).alias(c) for c in ("p", "p_adj")).with_columns(
            pl.lit(None, dtype=pl.Boolean).alias("above")
        )
    p = [above_rate_p(round(v * n), n, b) for v, n, b in zip(joined["value"], joined["n"], joined["baseline"])]
    adjusted = benjamini_hochberg(p)
    return (
        joined.with_columns(pl.Series("p", p, dtype=pl.Float64), pl.Series("p_adj", adjusted, dtype=pl.Float64))
        .with_columns((pl.col("p_adj") <= alpha).alias("above"))
        .select("task", "value", "ci_low", "ci_high", "n", "baseline", "kind", "p", "p_adj", "above")
    )


def stored_seesaw_events(run: pl.DataFrame, metrics: list[str], delta: float | None) -> list[dict] | None:
    """The seesaw events one run stored, restricted to ``metrics``; None when the run did not record its rule or
    decided it with another ``delta`` than the one asked for, or when ``metrics`` names one the run did not test
    (the caller then recomputes)."""
    marker = run.filter(pl.col("metric") == SEESAW_TESTS_METRIC)
    if marker.is_empty() or not set(metrics) <= set(EVENT_METRICS):  # the families a run tests (seesaw_families)
        return None
    rule: dict[str, Any] = json.loads(marker["text"][-1] or "{}")
    if delta is not None and abs(float(rule.get("delta", delta)) - delta) > 1e-12:
        return None
    rows = run.filter(pl.col("metric") == "seesaw")["text"].to_list()
    events = [json.loads(t) for t in rows if t]
    return [
        {**e, "p_value": e.get("p_value"), "test": e.get("test", rule.get("test"))}
        for e in events
        if e["metric"] in metrics
    ]
