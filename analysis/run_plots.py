"""Plots of one run (matplotlib; each returns a figure): per-task curves across the curriculum with intervals,
baselines and seesaw events, the first-token hijack, training curves, the effective mixture and an adaptive
mixture's weights. Style and shared helpers: :mod:`analysis.plot_style`.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.ticker
import numpy as np
import polars as pl
from matplotlib.figure import Figure

from analysis.evidence import baselines
from analysis.frames import eval_rows, hijack_timeline, lower_is_better, stage_bounds
from analysis.loading import AnalysisError
from analysis.plot_style import (
    FALL_COLOR,
    METRIC_TITLES,
    RISE_COLOR,
    SPLIT_TITLES,
    plt,
    shade_stages,
    single_run,
    task_colors,
)


def _series(rows: pl.DataFrame, task: str) -> tuple[np.ndarray, np.ndarray]:
    part = rows.filter(pl.col("task") == task).sort("step", "stage_index")
    return part["step"].to_numpy(), part["value"].to_numpy()


def plot_curves(
    frame: pl.DataFrame,
    metric: str = "greedy",
    splits: Sequence[str] | None = None,
    events: pl.DataFrame | None = None,
    tasks: Sequence[str] | None = None,
    colors: dict[str, str] | None = None,
    log: bool = False,
) -> Figure:
    """Per-task curves of ``metric`` across the whole curriculum, one panel per split: stages shaded and named,
    each proportion's 95 % interval as a band, each task's baseline (``baseline_<metric>``: best constant answer,
    majority first token or chance) as a dashed line of its colour, seesaw events (``events`` from
    :func:`analysis.seesaw_events`) marked — ▲ on the task that rose, ▼ on the task that fell, at the evaluation
    where it happened."""
    frame = single_run(frame)
    rows = eval_rows(frame, [metric])
    if rows.is_empty():
        raise AnalysisError(f"no {metric!r} rows to plot")
    splits = list(splits) if splits else list(dict.fromkeys(rows["split"].to_list()))
    tasks = list(tasks) if tasks else sorted(rows["task"].unique().to_list())
    colors = colors or task_colors(tasks)
    bounds = stage_bounds(frame)
    base = baselines(frame).filter(pl.col("metric") == metric)
    fig, axes = plt.subplots(1, len(splits), figsize=(5.6 * len(splits), 3.6), sharey=True, squeeze=False)
    for ax, split in zip(axes[0], splits):
        shade_stages(ax, bounds)
        part = rows.filter(pl.col("split") == split)
        for task in tasks:
            x, y = _series(part, task)
            if len(x):
                ax.plot(x, y, marker="o", ms=3, lw=1.6, color=colors[task], label=task, zorder=3)
                _band(ax, part, task, colors[task])
        _baseline_lines(ax, base.filter(pl.col("split") == split), tasks, colors)
        if events is not None and not events.is_empty():
            _mark_events(ax, part, events.filter(pl.col("metric") == metric, pl.col("split") == split), colors)
        ax.set_title(SPLIT_TITLES.get(split, split), pad=14)
        ax.set_xlabel("step")
        if log:
            ax.set_yscale("log")
        elif not lower_is_better(metric) and part["value"].max() <= 1.0:
            ax.set_ylim(-0.03, 1.03)
    axes[0][0].set_ylabel(METRIC_TITLES.get(metric, metric))
    return _shared_legend(fig, axes[0])


def _band(ax, part: pl.DataFrame, task: str, color: str) -> None:
    """The task's 95 % interval at every evaluation as a translucent band (stores without intervals: none)."""
    rows = part.filter(pl.col("task") == task, pl.col("ci_low").is_not_null()).sort("step", "stage_index")
    if rows.height:
        ax.fill_between(
            rows["step"].to_numpy(),
            rows["ci_low"].to_numpy(),
            rows["ci_high"].to_numpy(),
            color=color,
            alpha=0.12,
            lw=0,
            zorder=2,
        )


def _baseline_lines(ax, base: pl.DataFrame, tasks: Sequence[str], colors: dict[str, str]) -> None:
    """Each task's baseline as a dashed horizontal line in its colour (one legend entry for all)."""
    drawn = False
    for r in base.iter_rows(named=True):
        if r["task"] in tasks:
            ax.axhline(r["baseline"], ls="--", lw=1.1, color=colors[r["task"]], alpha=0.85, zorder=2)
            drawn = True
    if drawn:  # a neutral legend entry: the lines themselves take each task's colour
        ax.plot([], [], ls="--", lw=1.1, color="#555555", label="baseline (task's colour)")


def _shared_legend(fig: Figure, row) -> Figure:
    """One legend at the right for every series drawn in the panels of ``row`` (each label once)."""
    handles, labels = row[0].get_legend_handles_labels()
    for ax in row[1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig


def _mark_events(ax, part: pl.DataFrame, events: pl.DataFrame, colors: dict[str, str]) -> None:
    values = {(r["task"], r["step"]): r["value"] for r in part.iter_rows(named=True)}
    first = True
    seen = set()
    for e in events.iter_rows(named=True):
        for task, marker, color, _sign in ((e["rose"], "^", RISE_COLOR, "↑"), (e["fell"], "v", FALL_COLOR, "↓")):
            key = (task, e["step_to"], marker)
            if key in seen or (task, e["step_to"]) not in values:
                continue
            seen.add(key)
            ax.scatter(
                [e["step_to"]],
                [values[(task, e["step_to"])]],
                marker=marker,
                s=90,
                zorder=5,
                facecolor=colors.get(task, color),
                edgecolor=color,
                linewidth=2,
                label=("seesaw: rose ▲ / fell ▼" if first else None),
            )
            first = False
        ax.axvline(e["step_to"], color=FALL_COLOR, lw=0.6, alpha=0.35, zorder=1)


def plot_hijack(
    frame: pl.DataFrame,
    splits: Sequence[str] | None = None,
    colors: dict[str, str] | None = None,
    expected: Sequence[str] = (),
    events: pl.DataFrame | None = None,
) -> Figure:
    """The first-token story: top row the share of prompts whose top-1 first token is a hijack word (yes/no),
    bottom row the median rank of the gold first token (log scale, 1 = top). Tasks in ``expected`` (whose answers
    do start with yes/no) are drawn dashed: a high hijack share is right for them. ``ft_hijack`` seesaw events are
    marked on the top row."""
    frame = single_run(frame)
    timeline = hijack_timeline(frame)
    splits = list(splits) if splits else list(dict.fromkeys(timeline["split"].to_list()))
    tasks = sorted(timeline["task"].unique().to_list())
    colors = colors or task_colors(tasks)
    bounds = stage_bounds(frame)
    fig, axes = plt.subplots(2, len(splits), figsize=(5.6 * len(splits), 6.2), sharex=True, squeeze=False)
    for col, split in enumerate(splits):
        part = timeline.filter(pl.col("split") == split)
        for row, metric in enumerate(("ft_hijack", "ft_rank_median")):
            ax = axes[row][col]
            shade_stages(ax, bounds, label=row == 0)
            for task in tasks:
                t = part.filter(pl.col("task") == task).drop_nulls(metric)
                if t.is_empty():
                    continue
                ax.plot(
                    t["step"],
                    t[metric],
                    marker="o",
                    ms=3,
                    lw=1.6,
                    color=colors[task],
                    ls="--" if task in expected else "-",
                    label=task + (" (yes/no answers)" if task in expected else ""),
                )
            if metric == "ft_hijack" and events is not None and not events.is_empty():
                rows = part.select("task", "step", "stage", pl.col("ft_hijack").alias("value"))
                _mark_events(ax, rows, events.filter(pl.col("metric") == "ft_hijack", pl.col("split") == split), colors)
            if metric == "ft_rank_median":
                ax.set_yscale("log")
                ax.invert_yaxis()
                ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
                ax.set_xlabel("step")
            else:
                ax.set_ylim(-0.03, 1.03)
                ax.set_title(SPLIT_TITLES.get(split, split), pad=14)
            if col == 0:
                ax.set_ylabel(
                    "gold first-token rank\n(median, 1 = top; up = better)"
                    if metric == "ft_rank_median"
                    else "first-token hijack\n(share of prompts, top-1 is yes/no)"
                )
    return _shared_legend(fig, axes[0])


def plot_training(frame: pl.DataFrame, colors: dict[str, str] | None = None) -> Figure:
    """Training: the loss (overall, and per task where logged), learning rate, gradient norm and update ratio."""
    frame = single_run(frame)
    train = frame.filter(pl.col("split") == "train")
    bounds = stage_bounds(frame)
    panels = [
        m for m in ("loss", "lr", "grad_norm", "update_ratio") if not train.filter(pl.col("metric") == m).is_empty()
    ]
    if not panels:
        raise AnalysisError("no training metrics in the store")
    tasks = sorted(train.filter(pl.col("metric") == "loss")["task"].drop_nulls().unique().to_list())
    colors = colors or task_colors(tasks)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.9 * len(panels), 3.2), squeeze=False)
    for ax, metric in zip(axes[0], panels):
        shade_stages(ax, bounds)
        rows = train.filter(pl.col("metric") == metric).sort("step")
        overall = rows.filter(pl.col("task").is_null())
        if metric == "loss":
            for task in tasks:
                t = rows.filter(pl.col("task") == task)
                ax.plot(t["step"], t["value"], lw=1.1, color=colors.get(task), label=task, alpha=0.85)
        ax.plot(overall["step"], overall["value"], lw=2.0, color="black", label="all" if metric == "loss" else None)
        ax.set_title(
            {
                "loss": "training loss (answer tokens)",
                "lr": "learning rate",
                "grad_norm": "gradient norm",
                "update_ratio": "update ratio ‖Δθ‖/‖θ‖",
            }[metric],
            pad=14,
        )
        ax.set_xlabel("step")
        if metric in ("update_ratio", "grad_norm") and (overall["value"] > 0).all() and overall.height:
            ax.set_yscale("log")
    if tasks:
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig


def plot_composition(frame: pl.DataFrame, colors: dict[str, str] | None = None) -> Figure:
    """The effective mixture of each stage: share of examples per task actually drawn (``mix_share``)."""
    frame = single_run(frame)
    mix = frame.filter(pl.col("metric") == "mix_share")
    if mix.is_empty():
        raise AnalysisError("no mix_share rows (composition is logged at each stage's end)")
    bounds = stage_bounds(frame).sort("index")
    stages = [s for s in bounds["stage"].to_list() if s in mix["stage"].to_list()]
    tasks = sorted(mix["task"].unique().to_list())
    colors = colors or task_colors(tasks)
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * len(stages) + 1.1))
    left = np.zeros(len(stages))
    for task in tasks:
        share = np.array([mix.filter(pl.col("stage") == s, pl.col("task") == task)["value"].sum() for s in stages])
        ax.barh(stages, share, left=left, color=colors[task], label=task, edgecolor="white")
        for y, (start, w) in enumerate(zip(left, share)):
            if w >= 0.07:
                ax.text(start + w / 2, y, f"{w:.0%}", ha="center", va="center", fontsize=8, color="white")
        left += share
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of training examples actually drawn")
    ax.grid(False)
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig


def plot_mixture_weights(frame: pl.DataFrame, colors: dict[str, str] | None = None) -> Figure:
    """An adaptive mixture's weight trajectory: each task's sampling weight (``mixture_weight``) at every update."""
    frame = single_run(frame)
    weights = frame.filter(pl.col("metric") == "mixture_weight", pl.col("split") == "train").sort("step")
    if weights.is_empty():
        raise AnalysisError("no mixture_weight rows (only adaptive mixtures log them)")
    tasks = sorted(weights["task"].unique().to_list())
    colors = colors or task_colors(tasks)
    fig, ax = plt.subplots(figsize=(7.5, 3.0))
    shade_stages(ax, stage_bounds(frame))
    for task in tasks:
        t = weights.filter(pl.col("task") == task)
        for stage in t["stage"].unique(maintain_order=True).to_list():  # one line per stage: no bridge between them
            part = t.filter(pl.col("stage") == stage)
            ax.step(
                part["step"],
                part["value"],
                where="post",
                lw=1.4,
                color=colors.get(task),
                label=task if stage == t["stage"][0] else None,
            )
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.set_ylabel("sampling weight")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig
