"""Which targets a mixing law can see, and a route from a low-noise target to the researcher's own (issue 52, item 1).

- :func:`snr`: a target's signal-to-noise ratio — its sd across mixtures (one value per trial of a sweep) against
  its sd across seeds at one fixed mixture (replicate runs of that mixture). The across-mixture sd carries the seed
  noise too, so a target the mixture does not move has a ratio near 1, not 0; a law has something to fit only where
  the ratio is well above 1. Its 95 % interval is the F interval of a ratio of sds (normal theory); a percentile
  bootstrap is offered and measured too narrow at a handful of seeds (:func:`snr`).
- :func:`fit_link`: a per-task monotone link from a loss target to a greedy rate, fitted across trials: a logistic
  in the loss, ``rate = 1 / (1 + exp(−(a + b·loss)))``, by least squares (``scipy.optimize.least_squares``). A
  logistic rather than isotonic regression (``scipy.optimize.isotonic_regression``): with a few dozen trials a
  step function leaves flat stretches and jumps between trials, and it cannot extrapolate past the trials'
  losses, where a proposal may lie; the logistic is monotone by construction, smooth, two parameters.
- :func:`route_errors`: the cross-validated error of predicting the greedy rate directly by a law fitted to it,
  against a law fitted to the loss whose prediction goes through the link (both refitted on the same folds:
  :func:`analysis.mixture_data.cv_folds`).
- :func:`snr_table`: the SNR of every target (greedy, loss, log-probability) per task from a sweep's trials and a
  seed group of replicates (``harness run --seeds``), and :func:`route_table`, the two routes per task, as
  ``harness mixture SWEEP_DIR --snr GROUP_DIR`` prints them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
from scipy import optimize, special, stats

from analysis.group import replicate_runs
from analysis.loading import AnalysisError, PathLike, load_samples, read_summary
from analysis.mixing_laws import fit_law
from analysis.mixture_data import cv_folds
from analysis.trials import complete, metric_columns, simplex_groups
from harness.core.metrics import PROPORTION_METRICS

RESAMPLES = 2000
#: The targets the SNR table reports, per task (each on its split: the loss pool's where the sweep has one).
SNR_METRICS = ("greedy", "eval_loss", "gold_logprob")


@dataclass(frozen=True)
class SNR:
    """``ratio`` = ``sd_mixtures / sd_seeds`` with its 95 % interval ``low``–``high`` (:func:`snr`)."""

    ratio: float
    low: float
    high: float
    sd_mixtures: float
    sd_seeds: float
    n_mixtures: int
    n_seeds: int


def snr(
    across_mixtures: Sequence[float],
    across_seeds: Sequence[float],
    resamples: int = RESAMPLES,
    seed: int = 0,
    interval: str = "f",
) -> SNR:
    """The SNR of one target: sd over ``across_mixtures`` (a value per trial) / sd over ``across_seeds`` (a value
    per replicate of one mixture), sample sds (ddof 1). NaN where either has fewer than two values; the ratio is
    inf where the seeds agree exactly (then the interval is NaN).

    ``interval``: ``"f"`` (default), the normal-theory interval of a ratio of sds (the squared ratio over the true
    one is F-distributed on (trials − 1, seeds − 1) degrees of freedom); ``"bootstrap"``, a percentile bootstrap
    resampling trials and seeds independently, which is too narrow at a handful of seeds (the sd of a resample of
    five values is biased low and varies little): on a normal null (32 trials, 5 seeds, 400 draws, seed 0) it held
    the true ratio 1 in 284 of 400 draws (0.71), the F interval in 383 of 400 (0.96); the test checks both."""
    m = np.asarray([v for v in across_mixtures if v is not None and math.isfinite(v)], dtype=float)
    s = np.asarray([v for v in across_seeds if v is not None and math.isfinite(v)], dtype=float)
    if len(m) < 2 or len(s) < 2:
        nan = math.nan
        return SNR(nan, nan, nan, float(m.std(ddof=1)) if len(m) > 1 else nan, nan, len(m), len(s))
    sd_m, sd_s = float(m.std(ddof=1)), float(s.std(ddof=1))
    if sd_s == 0:
        return SNR(math.inf if sd_m > 0 else math.nan, math.nan, math.nan, sd_m, sd_s, len(m), len(s))
    ratio = sd_m / sd_s
    if interval == "f":
        upper_f, lower_f = stats.f.ppf([0.975, 0.025], len(m) - 1, len(s) - 1)
        return SNR(ratio, ratio / math.sqrt(upper_f), ratio / math.sqrt(lower_f), sd_m, sd_s, len(m), len(s))
    if interval != "bootstrap":
        raise ValueError(f"interval {interval!r}: f or bootstrap")
    rng = np.random.default_rng(seed)
    bm = m[rng.integers(0, len(m), (resamples, len(m)))].std(axis=1, ddof=1)
    bs = s[rng.integers(0, len(s), (resamples, len(s)))].std(axis=1, ddof=1)
    ratios = bm[bs > 0] / bs[bs > 0]  # a resample of identical seeds has no ratio
    low, high = np.percentile(ratios, [2.5, 97.5]) if len(ratios) else (math.nan, math.nan)
    return SNR(ratio, float(low), float(high), sd_m, sd_s, len(m), len(s))


# ----------------------------------------------------------------------------------------------------------------
# The link from a loss to a greedy rate, and the two routes' CV error
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """``rate = expit(a + b·loss)``; ``b`` < 0 for a loss (lower loss, higher rate), > 0 for a log-probability."""

    a: float
    b: float

    def __call__(self, loss: np.ndarray) -> np.ndarray:
        return special.expit(self.a + self.b * np.asarray(loss, dtype=float))


def fit_link(loss: Sequence[float], rate: Sequence[float]) -> Link:
    """The logistic link fitted across trials by least squares on the rates (see the module docstring); started
    from the line through the clipped rates' logits, so a fit starts on the right side of the sign of ``b``."""
    x, y = np.asarray(loss, dtype=float), np.asarray(rate, dtype=float)
    if len(x) < 3 or np.ptp(x) == 0:
        raise ValueError("a link needs three or more trials whose losses differ")
    z = special.logit(np.clip(y, 0.01, 0.99))
    b0, a0 = np.polyfit(x, z, 1)
    fit = optimize.least_squares(lambda p: special.expit(p[0] + p[1] * x) - y, x0=[a0, b0], method="lm")
    return Link(float(fit.x[0]), float(fit.x[1]))


@dataclass(frozen=True)
class RouteErrors:
    """The CV RMSE of the greedy rate by the two routes, on the same folds (``folds`` names them)."""

    direct: float
    via_loss: float
    form: str
    folds: str
    n: int


def route_errors(
    W: np.ndarray,
    loss: Sequence[float],
    rate: Sequence[float],
    form: str = "loglinear",
    seeds: np.ndarray | None = None,
) -> RouteErrors:
    """Held-out error of one task's greedy rate: ``direct``, ``form`` fitted to the rates (a proportion: the
    log-linear law through its logit); ``via_loss``, ``form`` fitted to the loss and its prediction mapped through
    the link fitted on the same training trials. Each held-out group is predicted from the other trials only."""
    W = np.asarray(W, dtype=float)
    loss_v, rate_v = np.asarray(loss, dtype=float), np.asarray(rate, dtype=float)
    groups, name = cv_folds(len(W), seeds)
    direct, via = np.full(len(W), np.nan), np.full(len(W), np.nan)
    for g in np.unique(groups):
        test, train = groups == g, groups != g
        direct[test] = fit_law(form, W[train], rate_v[train, None], [True]).predict(W[test])[:, 0]
        predicted_loss = fit_law(form, W[train], loss_v[train, None], [False]).predict(W[test])[:, 0]
        via[test] = fit_link(loss_v[train], rate_v[train])(predicted_loss)

    def rmse(p: np.ndarray) -> float:
        return float(np.sqrt(np.mean((p - rate_v) ** 2)))

    return RouteErrors(rmse(direct), rmse(via), form, name, len(W))


# ----------------------------------------------------------------------------------------------------------------
# From a sweep's trials and a seed group's replicates
# ----------------------------------------------------------------------------------------------------------------


def _stage_values(run_dir: Path, stage: str | None) -> dict[str, dict[str, dict[str, float]]]:
    stages = read_summary(run_dir).get("stages") or []
    chosen = next((s for s in stages if s["name"] == stage), stages[-1] if stages else {})
    return chosen.get("metrics") or {}


def _item_counts(run_dir: Path | None) -> dict[tuple[str, str], int]:
    """``{(split, task): items}`` of the run's last evaluation step (read once, for every row of the table)."""
    samples = load_samples(run_dir) if run_dir is not None else pl.DataFrame()
    if samples.is_empty():
        return {}
    last = samples.filter(pl.col("step") == samples["step"].max()).group_by("split", "task").len()
    return {(split, task): n for split, task, n in last.iter_rows()}


def snr_table(
    trials: pl.DataFrame,
    group_dir: PathLike,
    stage: str | None = None,
    splits: Sequence[str] = ("heldout",),
    resamples: int = RESAMPLES,
) -> pl.DataFrame:
    """One row per task × split × metric of :data:`SNR_METRICS` found in both the sweep's complete trials (at the
    end of ``stage``, default the last stage with that column) and the group's replicates: ``snr``, ``low``,
    ``high``, ``sd_mixtures``, ``sd_seeds``, ``trials``, ``seeds``, ``items`` (per replicate). The loss targets
    are read from the loss pool (``loss_<split>``) where the runs have one, else from the split itself."""
    runs = list(replicate_runs(group_dir).values())
    replicates = [_stage_values(d, stage) for d in runs]
    items = _item_counts(runs[0] if runs else None)
    done = complete(trials)
    parsed = metric_columns(done)
    rows: list[dict[str, Any]] = []
    for split in splits:
        for metric in SNR_METRICS:
            read = split if metric == "greedy" else f"loss_{split}"
            if metric != "greedy" and not parsed.filter(pl.col("split") == read).height:
                read = split
            chosen = parsed.filter(pl.col("metric") == metric, pl.col("split") == read)
            if stage is not None:
                chosen = chosen.filter(pl.col("stage") == stage)
            elif chosen.height:
                chosen = chosen.filter(pl.col("stage") == chosen["stage"][-1])
            for r in chosen.iter_rows(named=True):
                seeds = [v.get(read, {}).get(r["task"], {}).get(metric) for v in replicates]
                result = snr(done[r["column"]].to_list(), seeds, resamples)
                rows.append(
                    {
                        "task": r["task"],
                        "split": read,
                        "metric": metric,
                        "proportion": metric in PROPORTION_METRICS,
                        "snr": result.ratio,
                        "low": result.low,
                        "high": result.high,
                        "sd_mixtures": result.sd_mixtures,
                        "sd_seeds": result.sd_seeds,
                        "trials": result.n_mixtures,
                        "seeds": result.n_seeds,
                        "items": items.get((read, r["task"])),
                    }
                )
    if not rows:
        raise AnalysisError(f"no {', '.join(SNR_METRICS)} columns in the trials for splits {', '.join(splits)}")
    return pl.DataFrame(rows)


def format_snr_table(table: pl.DataFrame) -> str:
    """The table as text: one line per task × target, the ratio with its 95 % interval, the two sds, n."""
    lines = ["SNR = sd across mixtures / sd across seeds at one mixture (95 % F interval)"]
    for r in table.sort("task", "metric").iter_rows(named=True):
        lines.append(
            f"  {r['task']:<14} {r['metric']:<13} {r['split']:<22} {r['snr']:7.2f} [{r['low']:.2f}, {r['high']:.2f}]"
            f"  sd {r['sd_mixtures']:.4g} / {r['sd_seeds']:.4g}  trials {r['trials']}, seeds {r['seeds']}, "
            f"items {r['items'] if r['items'] is not None else '?'}"
        )
    return "\n".join(lines)


def route_table(trials: pl.DataFrame, space: dict | None = None, form: str = "loglinear") -> pl.DataFrame:
    """Per task with a greedy rate and an ``eval_loss`` in the sweep's complete trials (the loss pool's where
    there is one; the last stage with both): :func:`route_errors` over the sweep's simplex (its last one)."""
    done = complete(trials)
    groups = simplex_groups(done, space)
    if not groups:
        raise AnalysisError("no mixture weights in the trials (expected param/<path>.<task> columns summing to 1)")
    path, weights = list(groups.items())[-1]
    parsed = metric_columns(done)
    rows = []
    for r in parsed.filter(pl.col("metric") == "greedy").iter_rows(named=True):
        losses = parsed.filter(
            pl.col("metric") == "eval_loss",
            pl.col("task") == r["task"],
            pl.col("stage") == r["stage"],
            pl.col("split").is_in([f"loss_{r['split']}", r["split"]]),
        ).sort("split", descending=True)  # loss_<split> before <split>
        if not losses.height or r["stage"] != parsed["stage"][-1]:
            continue
        data = done.drop_nulls([r["column"], losses["column"][0]] + [f"param/{path}.{w}" for w in weights])
        W = data.select([f"param/{path}.{w}" for w in weights]).to_numpy().astype(float)
        try:
            e = route_errors(W / W.sum(axis=1, keepdims=True), data[losses["column"][0]], data[r["column"]], form)
        except ValueError as why:  # too few trials, or losses that do not vary
            raise AnalysisError(f"{r['task']}: {why}") from None
        rows.append({"task": r["task"], "loss_split": losses["split"][0], "greedy_split": r["split"], **vars(e)})
    if not rows:
        raise AnalysisError("no task has both a greedy and an eval_loss column at the last stage")
    return pl.DataFrame(rows)


def format_route_table(table: pl.DataFrame) -> str:
    lines = ["greedy rate, cross-validated RMSE: the law fitted to it directly | to eval_loss, then the link"]
    for r in table.iter_rows(named=True):
        lines.append(
            f"  {r['task']:<14} {r['direct']:.4f} | {r['via_loss']:.4f}  ({r['form']}, {r['folds']}, "
            f"n {r['n']}; loss from {r['loss_split']})"
        )
    return "\n".join(lines)
