"""Plots of a sweep (matplotlib; each returns a figure): the interference matrix of a mixture fit, partial
dependence of each task's metric on its weight, a Pareto front and the optimisation history. Style and shared
helpers: :mod:`analysis.plot_style`.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl
from matplotlib.figure import Figure

from analysis.frames import lower_is_better
from analysis.mixture_fit import partial_dependence
from analysis.plot_style import column_label, plt, task_colors
from analysis.trials import complete, metric_columns


def plot_interference(fit, ax=None) -> Figure:
    """The interference matrix of :func:`analysis.mixture_fit` as a heatmap: row = the task whose weight rises by
    ``per``, column = the task whose metric moves; red = falls (the seesaw), blue = rises. Columns carry R²."""
    effect = fit.effect.drop("weight").to_numpy()
    rows, cols = fit.weights, fit.targets
    if ax is None:
        fig, ax = plt.subplots(figsize=(1.1 * len(cols) + 2.6, 0.8 * len(rows) + 1.8))
    else:
        fig = ax.figure
    lim = max(float(np.nanmax(np.abs(effect))), 1e-9)
    cmap = "RdBu" if not lower_is_better(fit.metric) else "RdBu_r"
    image = ax.imshow(effect, cmap=cmap, vmin=-lim, vmax=lim, aspect="auto")
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels(
        [f"{t}\nR² {fit.loo_r2[t]:.2f}" if not math.isnan(fit.loo_r2[t]) else f"{t}\n(constant)" for t in cols],
        fontsize=8,
    )
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"+{fit.per:g} {w}" for w in rows])
    ax.grid(False)
    for i in range(len(rows)):
        for j in range(len(cols)):
            v = effect[i, j]
            ax.text(
                j,
                i,
                f"{v:+.3f}",
                ha="center",
                va="center",
                fontsize=8,
                color="white" if abs(v) > 0.6 * lim else "black",
            )
    ax.set_xlabel(f"Δ {fit.metric} ({fit.split}, end of {fit.stage}) — column label: leave-one-out R²")
    ax.set_ylabel("weight raised (taken from the others)")
    ax.set_title(f"interference: raise a task's weight by {fit.per:g}, watch every task ({fit.n} trials)")
    fig.colorbar(image, ax=ax, shrink=0.8, label=f"Δ {fit.metric}")
    fig.tight_layout()
    return fig


def plot_partial_dependence(trials: pl.DataFrame, fit, colors: dict[str, str] | None = None) -> Figure:
    """Weight → metric, one panel per mixture weight: each trial's observed metric per target (dots) and the
    fitted model moving that weight alone, the others in their mean proportions (lines)."""
    pd = partial_dependence(fit)
    colors = colors or task_colors(fit.targets)
    cols = metric_columns(trials).filter(
        pl.col("stage") == fit.stage, pl.col("split") == fit.split, pl.col("metric") == fit.metric
    )
    column = {r["task"]: r["column"] for r in cols.iter_rows(named=True)}
    done = complete(trials)
    k = len(fit.weights)
    ncols = min(k, 4)
    nrows = math.ceil(k / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 3.0 * nrows), sharey=True, squeeze=False)
    for idx, w in enumerate(fit.weights):
        ax = axes[idx // ncols][idx % ncols]
        x = done[f"param/{fit.path}.{w}"].to_numpy()
        for t in fit.targets:
            ax.scatter(x, done[column[t]].to_numpy(), s=12, alpha=0.45, color=colors[t])
            line = pd.filter(pl.col("weight") == w, pl.col("target") == t)
            ax.plot(line["value"], line["predicted"], color=colors[t], lw=2, label=t)
        ax.axvline(fit.best_mixture[w], color="black", lw=1, ls=":", label="predicted best")
        ax.set_xlabel(f"weight of {w}")
        ax.set_title(w)
    for idx in range(k, nrows * ncols):
        axes[idx // ncols][idx % ncols].set_visible(False)
    axes[0][0].set_ylabel(f"{fit.metric} ({fit.split}, end of {fit.stage})")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig


def plot_pareto(front: pl.DataFrame, x: str, y: str, label_x: str | None = None, label_y: str | None = None) -> Figure:
    """Trials on two metrics (``front`` from :func:`analysis.pareto`), the Pareto front highlighted and joined."""
    fig, ax = plt.subplots(figsize=(5.6, 4.4))
    rest = front.filter(~pl.col("pareto"))
    best = front.filter(pl.col("pareto")).sort(x)
    ax.scatter(rest[x], rest[y], s=22, color="#9e9e9e", alpha=0.7, label="trial")
    ax.scatter(best[x], best[y], s=46, color="#d62728", zorder=3, label="Pareto front")
    ax.plot(best[x], best[y], color="#d62728", lw=1.2, alpha=0.6)
    if "number" in best.columns:
        for r in best.iter_rows(named=True):
            ax.annotate(f"#{r['number']}", (r[x], r[y]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel(label_x or column_label(x))
    ax.set_ylabel(label_y or column_label(y))
    ax.set_title("Pareto front")
    ax.legend()
    fig.tight_layout()
    return fig


def plot_history(trials: pl.DataFrame, objective: str, maximize: bool = True) -> Figure:
    """The objective of each trial in order (pruned and failed trials marked at the bottom) and the best so far."""
    fig, ax = plt.subplots(figsize=(7.0, 3.2))
    data = trials.sort("number") if "number" in trials.columns else trials.with_row_index("number")
    done = data.filter(pl.col("state") == "COMPLETE") if "state" in data.columns else data
    done = done.drop_nulls(objective)
    ax.scatter(done["number"], done[objective], s=16, color="#1f77b4", label="complete")
    if done.height:
        values = done[objective].to_numpy()
        best = np.maximum.accumulate(values) if maximize else np.minimum.accumulate(values)
        ax.step(done["number"], best, where="post", color="#d62728", lw=1.5, label="best so far")
        floor = float(np.nanmin(values)) if done.height else 0.0
        if "state" in data.columns:
            for state, marker, color in (("PRUNED", "x", "#ff7f0e"), ("FAIL", "X", "#7f7f7f")):
                part = data.filter(pl.col("state") == state)
                if part.height:
                    ax.scatter(
                        part["number"], [floor] * part.height, marker=marker, color=color, s=28, label=state.lower()
                    )
    ax.set_xlabel("trial")
    ax.set_ylabel(objective)
    ax.set_title("optimisation history")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig
