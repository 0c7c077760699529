"""Plots (matplotlib, Agg backend): curves across the curriculum, the first-token hijack, and the sweep views.

Every function returns a :class:`matplotlib.figure.Figure`; :func:`save` writes it as PNG. Tasks keep one colour
across every figure of a report (:func:`task_colors`). One namespace for three modules: the shared style and helpers
(:mod:`analysis.plot_style`), the plots of one run (:mod:`analysis.run_plots`) and of a sweep
(:mod:`analysis.sweep_plots`).
"""

from __future__ import annotations

from analysis.plot_style import (
    FALL_COLOR,
    METRIC_TITLES,
    RISE_COLOR,
    SPLIT_TITLES,
    STAGE_SHADES,
    column_label,
    save,
    shade_stages,
    task_colors,
)
from analysis.run_plots import (
    plot_composition,
    plot_curves,
    plot_hijack,
    plot_mixture_weights,
    plot_training,
)
from analysis.sweep_plots import plot_history, plot_interference, plot_pareto, plot_partial_dependence

__all__ = [
    "FALL_COLOR",
    "METRIC_TITLES",
    "RISE_COLOR",
    "SPLIT_TITLES",
    "STAGE_SHADES",
    "column_label",
    "plot_composition",
    "plot_curves",
    "plot_hijack",
    "plot_history",
    "plot_interference",
    "plot_mixture_weights",
    "plot_partial_dependence",
    "plot_pareto",
    "plot_training",
    "save",
    "shade_stages",
    "task_colors",
]
