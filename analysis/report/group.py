"""The report of a seed group (``harness report GROUP``): final scores with their interval across seeds (over the
seeds and the items they share, for a rate) next to one run's Wilson interval, and seesaw events with the number of
seeds they recur in (:mod:`analysis.group`)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import polars as pl

from analysis.group import choice_scores, final_scores, read_group, recurring_events, replicate_runs
from analysis.loading import PathLike
from analysis.report.page import Page, facts_table, fmt, table


def _interval(low: float | None, high: float | None) -> str:
    return "–" if low is None or high is None or low != low or high != high else f"[{fmt(low)}, {fmt(high)}]"


def _across(r: dict[str, Any]) -> str:
    """The across-seed interval, or why there is none (one seed: its Wilson interval is the one-run column)."""
    if r["across"].startswith("none"):
        return r["across"].replace("none: ", "none (") + ")"
    return f"{_interval(r['across_low'], r['across_high'])} {r['across']}"


def score_table(scores: pl.DataFrame) -> pl.DataFrame:
    """The displayed columns: mean, across-seed interval, within-run interval, n, per-seed values."""
    return pl.DataFrame(
        [
            {
                "task": r["task"],
                "seeds": r["seeds"],
                "mean": r["mean"],
                "95% across seeds": _across(r),
                "n items": r["n"],
                "95% one run (Wilson)": _interval(r["within_low"], r["within_high"]),
                "baseline": r.get("baseline"),
                "above baseline in": r.get("above_in") or "–",
                "per seed": r["values"],
            }
            for r in scores.iter_rows(named=True)
        ]
    )


def group_report(group_dir: PathLike, out: PathLike | None = None, *, metric: str = "greedy", **_: Any) -> Path:
    """Write ``report.html`` for a seed group; returns its path. (Run-report options such as ``delta`` do not
    apply: events come from each replicate's own detection.)"""
    group_dir = Path(group_dir)
    out = Path(out) if out else group_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    group, runs = read_group(group_dir), replicate_runs(group_dir)
    page = Page(out, f"{group['experiment']}: {len(runs)} seeds")
    page.section("Final scores across seeds", "scores")
    page.p(
        f"{html.escape(metric)} at the end of the last stage. The interval across seeds accounts for both how "
        "much the score moves between trainings and which items the pool drew (for a rate: seeds × items "
        "variance components, inside [0, 1]; a Student t over the seeds for other values; none from one seed); "
        "the Wilson interval is what one run of n items would report at that mean (eval-pool noise). Every "
        "replicate is scored on the same items (data_seed "
        f"{group['data_seed']}). The baseline is the pool's best constant answer, majority first token or "
        "chance; 'above baseline in' counts the seeds whose final score is significantly above it (one-sided "
        "exact binomial, Benjamini–Hochberg over the run's tasks, α = 0.05).",
        "note",
    )
    scores = final_scores(group_dir, metric)
    for split in scores["split"].unique(maintain_order=True).to_list() if not scores.is_empty() else []:
        page.h3(split)
        page.raw(table(score_table(scores.filter(pl.col("split") == split))))
    choices = choice_scores(group_dir)
    if not choices.is_empty():
        page.section("Yes/no ranking across seeds", "choice")
        page.p(
            "choice_auc: the probability that a true statement gets a higher P(Yes) / (P(Yes) + P(No)) at the "
            "first answer token than a false one (0.5: no ranking), at the end of the last stage; 'above 0.5 in' "
            "counts the seeds whose 95 % interval lies above 0.5. Greedy accuracy is this ranking cut at "
            "P(Yes) = P(No): a model leaning to one answer scores chance while it ranks right.",
            "note",
        )
        page.raw(
            table(
                pl.DataFrame(
                    [
                        {
                            "split": r["split"],
                            "task": r["task"],
                            "seeds": r["seeds"],
                            "mean AUC": r["mean"],
                            "95% across seeds (t)": _interval(r["t_low"], r["t_high"]),
                            "above 0.5 in": r["above_half_in"],
                            "answered Yes (mean share)": r["yes_share"],
                            "per seed: AUC [95%] p": r["values"],
                        }
                        for r in choices.iter_rows(named=True)
                    ]
                )
            )
        )
    page.section("Seesaw events across seeds", "events")
    page.p(
        "Matched on split, rising task, falling task and stage transition; recurs_in counts the replicates "
        "whose run detected it (with the run's own rule: eval.seesaw_test). Every family the runs tested, as their "
        "consoles list them: task–task (metrics greedy, ft_hijack), task–benchmark (bench_vs_greedy) and "
        "task–reference text (ref_vs_greedy).",
        "note",
    )
    page.raw(table(recurring_events(group_dir).drop("k")))
    page.section("Replicates", "replicates")
    page.raw(
        facts_table(
            {f"seed {s}": str(d) for s, d in runs.items()}
            | {f"seed {s} status": st for s, st in group["status"].items()}
        )
    )
    return page.write(f"seed group {html.escape(str(group_dir))}")
