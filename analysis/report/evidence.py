"""The run report's statistical parts: each task's final score with its 95 % interval against its baseline (a
finding and a table, one-sided exact binomial tests with Benjamini–Hochberg over the tasks), the intervals
the stage-end tables print under their values, and notes on evaluation data the run left out."""

from __future__ import annotations

from html import escape
from typing import Any

import polars as pl

from analysis import frames as F
from analysis.frames import ALPHA, final_against_baselines
from analysis.report.page import Page, fmt, table

KIND_WORDS = {
    "constant_answer": "best constant answer",
    "majority_first_token": "majority first token",
    "chance": "chance",
}


def stage_end_intervals(frame: pl.DataFrame, metric: str, split: str) -> dict[tuple[str, str], tuple[float, float]]:
    """``{(stage, task): (ci_low, ci_high)}`` of ``metric`` at each stage's last evaluation (proportions only)."""
    rows = F.eval_rows(frame, [metric], split, dedupe=False).filter(pl.col("ci_low").is_not_null())
    if rows.is_empty():
        return {}
    ends = rows.group_by("stage").agg(pl.col("step").max().alias("_end"))
    last = rows.join(ends, on="stage").filter(pl.col("step") == pl.col("_end"))
    return {(r["stage"], r["task"]): (r["ci_low"], r["ci_high"]) for r in last.iter_rows(named=True)}


def _score(r: dict[str, Any]) -> str:
    ci = f" [{r['ci_low']:.2f}, {r['ci_high']:.2f}]" if r.get("ci_low") is not None else ""
    return f"{fmt(r['value'])}{ci}"


def baseline_findings(frame: pl.DataFrame, metric: str, split: str, split_title: str) -> list[str]:
    """One sentence: which tasks end significantly above their baseline on ``split`` and which do not."""
    tested = final_against_baselines(frame, metric, split)
    if tested.is_empty():
        return []
    parts = []
    for r in tested.iter_rows(named=True):
        verdict = "<b>above</b>" if r["above"] else "not significantly above"
        parts.append(
            f"{escape(r['task'])} {_score(r)} vs {fmt(r['baseline'])} "
            f"({KIND_WORDS.get(r['kind'], r['kind'])}): {verdict}, p = {r['p_adj']:.2g}"
        )
    return [
        f"<b>Against baselines</b> ({escape(metric)}, {escape(split_title)}; final score with its 95 % interval "
        f"vs a model that ignores its input; one-sided exact binomial test, Benjamini–Hochberg over "
        f"{tested.height} tasks at α = {ALPHA:g}): " + "; ".join(parts) + "."
    ]


def baseline_section(page: Page, frame: pl.DataFrame, metric: str, split: str) -> None:
    """The table behind :func:`baseline_findings`."""
    tested = final_against_baselines(frame, metric, split)
    page.h3(f"{metric} at the end against its baseline ({split})")
    if tested.is_empty():
        page.p("(no baselines in this store: a run from before they were logged)", "note")
        return
    shown = tested.select(
        "task",
        pl.col("value").alias("final"),
        "ci_low",
        "ci_high",
        "n",
        "baseline",
        pl.col("kind").replace_strict(KIND_WORDS, default=pl.col("kind")).alias("baseline is"),
        pl.col("p").alias("p (one-sided)"),
        pl.col("p_adj").alias("p (BH)"),
        pl.col("above").alias("significantly above"),
    )
    page.raw(table(shown))


def interval_note(intervals: dict | None, stage: str, task: str) -> str:
    """The ``[low, high]`` line a stage-table cell prints under its value ('' without an interval)."""
    ci = (intervals or {}).get((stage, task))
    return f"<br><span class='ci'>[{ci[0]:.2f}, {ci[1]:.2f}]</span>" if ci else ""


def data_notes(summary: dict) -> list[str]:
    """Lines about evaluation data the run left out (``summary.json``'s ``too_long``), for the report's findings."""
    too_long = summary.get("too_long") or {}
    if not too_long:
        return []
    items = ", ".join(f"{key} {n}" for key, n in sorted(too_long.items()))
    return [
        f"Evaluation dropped items too long for the model (data.too_long: drop): {items}; the scores of those "
        "task/splits are over the remaining items."
    ]
