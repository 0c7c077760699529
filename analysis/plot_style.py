"""What every plot shares: the Agg backend (files only; notebooks keep their inline backend), the style, one colour
per task across every figure of a report (:func:`task_colors`), titles of splits, metrics and trials columns,
the stages shaded behind a curve, and :func:`save` (PNG). The plots themselves: :mod:`analysis.run_plots` (one run)
and :mod:`analysis.sweep_plots` (a sweep); :mod:`analysis.plots` gathers them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import matplotlib

if "MPLBACKEND" not in os.environ and "ipykernel" not in sys.modules:
    matplotlib.use("Agg")  # files only (reports, scripts); notebooks keep their inline backend
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from analysis.loading import AnalysisError  # noqa: E402

STAGE_SHADES = ("#f2f2f2", "#ffffff")
RISE_COLOR, FALL_COLOR = "#1a9850", "#d73027"
SPLIT_TITLES = {"heldout": "held-out items", "heldout_template": "held-out templates", "train": "training items"}
METRIC_TITLES = {
    "greedy": "greedy exact match",
    "mode_ok": "mode ok (answer has the task's form)",
    "tf_first": "gold first token is the argmax (teacher forced)",
    "tf_exact": "every gold token is the argmax",
    "loss": "answer-token loss",
    "eval_loss": "answer-token loss (teacher forced)",
    "ft_hijack": "first-token hijack (top-1 is yes/no)",
    "ft_rank_median": "gold first-token rank (median, 1 = top)",
    "ft_rank_mean": "gold first-token rank (mean)",
    "ft_mrr": "gold first-token MRR",
}

plt.rcParams.update(
    {
        "figure.dpi": 100,
        "savefig.dpi": 110,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.grid": True,
        "grid.alpha": 0.25,
        "font.size": 9,
        "axes.titlesize": 10,
        "legend.fontsize": 8,
        "legend.frameon": False,
    }
)


def task_colors(tasks: Sequence[str]) -> dict[str, str]:
    """A stable colour per task (sorted names → tab10, then tab20)."""
    names = sorted(dict.fromkeys(tasks))
    palette = list(plt.get_cmap("tab10").colors) + list(plt.get_cmap("tab20").colors[1::2])
    return {t: matplotlib.colors.to_hex(palette[i % len(palette)]) for i, t in enumerate(names)}


def column_label(column: str) -> str:
    """A trials column in words: ``metric/mix/heldout/yesno/greedy`` → ``yesno greedy (heldout, end of mix)``."""
    parts = column.split("/")
    if len(parts) == 5 and parts[0] == "metric":
        _, stage, split, task, metric = parts
        return f"{task} {metric} ({split}, end of {stage})"
    if column.startswith("param/"):
        return column[len("param/") :]
    return column


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as PNG to ``path`` and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", bbox_inches="tight")
    plt.close(fig)
    return path


def single_run(frame: pl.DataFrame) -> pl.DataFrame:
    """The frame of one run; AnalysisError when it holds several."""
    if "run_id" in frame.columns and frame["run_id"].n_unique() > 1:
        raise AnalysisError("this plot shows one run; filter the frame to one run_id first")
    return frame


def shade_stages(ax, bounds: pl.DataFrame, label: bool = True) -> None:
    """Alternate grey bands for the stages of one run, with the stage names on top."""
    for i, r in enumerate(bounds.sort("index").iter_rows(named=True)):
        ax.axvspan(r["start"], r["end"], color=STAGE_SHADES[i % 2], zorder=0, lw=0)
        if i:
            ax.axvline(r["start"], color="#999999", lw=0.8, ls="--", zorder=1)
        if label:
            ax.text(
                (r["start"] + r["end"]) / 2,
                1.01,
                r["stage"],
                transform=ax.get_xaxis_transform(),
                ha="center",
                va="bottom",
                fontsize=8,
                color="#555555",
            )
