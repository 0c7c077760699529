"""The report ``harness mixture`` prints from a :class:`~analysis.mixture_proposal.MixtureProposal`: the CV table,
the chosen form and its support, the proposal beside the in-sample winner, the held-out test when there is one, and
the interference matrix the law implies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from analysis.mixture_data import CV_FOLDS, LEAVE_ONE_OUT_ROWS
from analysis.mixture_interference import format_interference


def format_proposal(p: Any) -> str:
    """The report ``harness mixture`` prints for ``p``, a :class:`~analysis.mixture_proposal.MixtureProposal` (not
    imported here: that module imports this one): the CV table, the chosen form, the proposal beside the winner."""
    direction = "maximise" if p.maximize else "minimise"
    seeds = f", {p.seeds} seeds" if p.seeds else ""
    if p.source == "table":
        head = f"table {p.sweep_dir}: {p.n_trials} rows{seeds}; objective {p.objective} ({direction})"
    else:
        head = (
            f"sweep {p.sweep_dir}: {p.n_trials} complete trials{seeds}; objective {p.objective} of "
            f"{p.metric}/{p.split} at the end of {p.stage} ({direction}); weights of {p.path}"
        )
    label = "" if p.source == "table" else "trial "  # a table's row labels read "row 12"
    rows = "LOTO" if p.n_trials <= LEAVE_ONE_OUT_ROWS else f"{CV_FOLDS}-fold"
    lines = [
        head,
        "",
        f"{'form':<10} {rows + ' obj RMSE':>14} {rows + ' task RMSE':>15} {'LOSO obj RMSE':>14} {'LOSO task RMSE':>15}",
    ]
    for r in p.cv:
        mark = "  <- chosen" if r["chosen"] else ""
        lines.append(
            f"{r['form']:<10} {r['loto_objective']:>14.4f} {r['loto_targets']:>15.4f} "
            f"{r['loso_objective']:>14.4f} {r['loso_targets']:>15.4f}{mark}"
        )
    lines += [
        "",
        f"chosen: {p.chosen} (smallest {p.cv_by} error of the objective)"
        + (
            f"; better than the trials' mean by {p.support['gain']:.3g} [{p.support['low']:.3g}, "
            f"{p.support['high']:.3g}] in squared error over {p.support['folds']} folds"
            if p.support
            else ""
        )
        + ("" if p.supported else " — NOT SUPPORTED"),
        f"trust region: {p.trust_region}",
        "",
        f"{'':<10} {'objective':>10}  95% interval           mixture",
        f"{'proposal':<10} {p.predicted:>10.4f}  [{p.interval[0]:.4f}, {p.interval[1]:.4f}] (predicted; "
        f"mean [{p.mean_interval[0]:.4f}, {p.mean_interval[1]:.4f}])  {_mix(p.mixture)}",
        f"{'winner':<10} {p.winner['observed']:>10.4f}  ({label}{p.winner['number']}, observed in-sample; "
        f"predicted {p.winner['predicted']:.4f})  {_mix(p.winner['mixture'])}",
        f"predicted gain of the proposal over the winner's mixture: {p.gain_over_winner:+.4f} "
        f"[{p.gain_interval[0]:+.4f}, {p.gain_interval[1]:+.4f}] (bootstrap over trials, {p.bootstrap} resamples)",
    ]
    lines += _holdout_lines(p.holdout)
    lines += format_interference(p.interference)
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def _mix(m: Mapping[str, float]) -> str:
    return ", ".join(f"{t} {w:.3f}" for t, w in m.items())


def _holdout_lines(held: Mapping[str, Any]) -> list[str]:
    """The held-out test: Spearman ρ and RMSE of the chosen law on rows it was not fitted on, per target."""
    if not held:
        return []
    lines = [
        "",
        f"held-out mixtures ({held['n']} rows not fitted on; 95 % intervals: bootstrap over them, "
        f"{held['resamples']} resamples)",
        f"{'target':<24} {'Spearman rho':>12}  interval          {'RMSE':>8}  interval",
    ]
    for name, r in [("objective", held["objective"]), *held["targets"].items()]:
        lines.append(
            f"{name:<24} {r['rho']:>12.3f}  [{r['rho_low']:.3f}, {r['rho_high']:.3f}]  {r['rmse']:>8.4f}  "
            f"[{r['rmse_low']:.4f}, {r['rmse_high']:.4f}]"
        )
    return lines
