"""Run-report curves beside the tasks' scores: the yes/no ranking (``choice_auc``, ``choice_yes``: logged by the
``first_token`` probe for two-answer tasks) and the lm-evaluation-harness benchmarks (split ``bench``)."""

from __future__ import annotations

from html import escape
from typing import Any

from analysis import frames as F
from analysis import plots as P
from analysis.report.page import Page


def _chance_line(fig):
    for ax in fig.axes:
        if ax.get_title():  # the panels, not the legend's axes
            ax.axhline(0.5, color="grey", ls=":", lw=1, zorder=1)
    return fig


def choice_and_benchmark_curves(page: Page, run: Any) -> None:
    """The yes/no ranking (``choice_auc``, answered-Yes share) and the benchmarks (split ``bench``), when logged."""
    frame, splits, colors = run.frame, run.splits, run.colors
    choice = F.eval_rows(frame, ["choice_auc"], splits)
    if not choice.is_empty():
        tasks = sorted(choice["task"].unique().to_list())
        page.figure(
            lambda: _chance_line(P.plot_curves(frame, "choice_auc", splits, None, tasks, colors)),
            "curves_choice_auc.png",
            "Two-answer tasks (yes/no): AUC of P(Yes) / (P(Yes) + P(No)) at the first answer token between "
            "true and false statements, with its 95 % score-interval band; dotted: 0.5, no ranking. Greedy accuracy "
            "cuts this ranking at P(Yes) = P(No), so a model leaning to one answer scores chance while it "
            "ranks right.",
        )
        page.figure(
            lambda: _chance_line(P.plot_curves(frame, "choice_yes", splits, None, tasks, colors)),
            "curves_choice_yes.png",
            "Share of items where Yes is the likelier of the two answers "
            "(95 % Wilson band): the lean the AUC does not show.",
        )
    bench = F.eval_rows(frame, None, ["bench"])
    if not bench.is_empty():
        page.section("Benchmarks", "benchmarks")
        tasks = sorted(bench["task"].unique().to_list())
        for metric in bench["metric"].unique(maintain_order=True).to_list():
            page.figure(
                lambda m=metric: P.plot_curves(frame, m, ["bench"], None, tasks, colors),
                f"bench_{metric.replace(':', '_')}.png",
                f"lm-evaluation-harness benchmarks (eval.benchmarks): {escape(metric)} at every evaluation "
                "that ran them, with its 95 % band (Wilson from per-document outcomes, else lm-eval's "
                "stderr); grey bands are stages.",
            )
