"""The report of one sweep: findings, best trials, optimisation history, the interference matrix with its fit
quality and the predicted best mixture, weight → metric partial dependence, the Pareto front, failed / pruned
trials and the best trial's curves."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from html import escape
from pathlib import Path

import polars as pl

from analysis import frames as F
from analysis import plots as P
from analysis import sweep as S
from analysis.loading import AnalysisError, PathLike, load_run, load_sweep, read_config, read_sweep_config
from analysis.report.page import Page, facts_table, fmt, table


@dataclass
class SweepData:
    """One sweep as every section of its report reads it, loaded once."""

    sweep_dir: Path
    trials: pl.DataFrame
    config: dict
    objective: dict  # the sweep file's (first) objective, defaults filled in
    metric: str  # the metric and split the interference fits and curves analyse
    split: str
    objectives: list[str]  # the trials' objective columns
    directions: list[str]  # max / min per objective column
    done: pl.DataFrame  # the complete trials
    states: Counter
    maximize: bool  # the analysed metric's direction
    name: str


def load_sweep_data(sweep_dir: Path, metric: str | None, split: str | None) -> SweepData:
    """Read the trials and the sweep file; ``metric`` and ``split`` default to the objective's."""
    trials = load_sweep(sweep_dir)
    config = read_sweep_config(sweep_dir)
    obj = S.sweep_objective(config)
    metric = metric or obj["metric"]
    objectives = S.objective_columns(trials)
    states = Counter(trials["state"].to_list()) if "state" in trials.columns else Counter({"COMPLETE": trials.height})
    maximize = obj["direction"] == "maximize" if obj.get("direction") else not F.lower_is_better(metric)
    return SweepData(
        sweep_dir=sweep_dir,
        trials=trials,
        config=config,
        objective=obj,
        metric=metric,
        split=split or obj["split"],
        objectives=objectives,
        directions=S.objective_directions(config, objectives),
        done=S.complete(trials),
        states=states,
        maximize=maximize,
        name=(config.get("study") or {}).get("name") or sweep_dir.name,
    )


def _fits(sweep: SweepData) -> tuple[list[S.Interference], list[str]]:
    """One interference fit per simplex parameter, optimising the study's objective; the errors of those that
    cannot be fitted, as ``path: why``."""
    trials, obj = sweep.trials, sweep.objective
    fits, fit_errors = [], []
    for path in S.simplex_groups(trials, sweep.config.get("space")):
        try:
            targets = [
                t
                for t in S.metric_columns(trials)
                .filter(pl.col("metric") == sweep.metric, pl.col("split") == sweep.split)["task"]
                .unique()
            ]
            fit = S.interference(
                trials,
                sweep.metric,
                sweep.split,
                path=path,
                stage=obj.get("stage"),
                space=sweep.config.get("space"),
                maximize=sweep.maximize,
                **S.fit_objective(obj, sorted(targets)),
            )
            fits.append(fit)
        except AnalysisError as err:
            fit_errors.append(f"{path}: {err}")
    return fits, fit_errors


def _findings(sweep: SweepData, fits: list[S.Interference], fit_errors: list[str]) -> list[str]:
    """What a reader should look at first: trial states, the best trial, a flat objective, the strongest
    interference and the predicted best mixture per fit."""
    trials, obj, objectives, done = sweep.trials, sweep.objective, sweep.objectives, sweep.done
    findings = [
        f"{trials.height} trials: " + ", ".join(f"{n} {s.lower()}" for s, n in sweep.states.most_common()) + "."
    ]
    if objectives and done.height:
        best = S.best_trials(trials, 1, objectives[0], sweep.directions[0] == "max").row(0, named=True)
        findings.append(
            f"Best trial <b>#{best.get('number')}</b>: {escape(objectives[0])} = "
            f"<b>{fmt(best[objectives[0]])}</b>"
            + (
                f" ({escape(obj['reduce'])} of {escape(sweep.metric)} over "
                f"{escape(', '.join(obj['tasks']))} on {escape(sweep.split)})"
                if obj.get("tasks")
                else ""
            )
            + "."
        )
        values = done[objectives[0]].drop_nulls()
        if values.len() > 1 and values.max() - values.min() < 1e-12:
            findings.append(
                f"<b>Every complete trial has the same objective ({fmt(values[0])})</b>: the sweep did "
                "not tell the mixtures apart (too few steps or evaluation items, or a metric stuck at "
                "its floor); nothing below can rank mixtures by it."
            )
    for fit in fits:
        cells = [
            (fit.effect.filter(pl.col("weight") == w)[t].item(), w, t)
            for w in fit.weights
            for t in fit.targets
            if w != t
        ]
        if cells and fit.verdict in ("good", "fair"):
            worst = min(cells) if sweep.maximize else max(cells)
            findings.append(
                f"Strongest interference ({escape(fit.path)}): raising <b>{escape(worst[1])}</b> by "
                f"{fit.per:g} moves <b>{escape(worst[2])}</b> {escape(fit.metric)} by "
                f"<b>{worst[0]:+.3f}</b> ({fit.verdict} fit)."
            )
        findings.append("Fit: " + escape(fit.quality))
        findings.append(
            (
                "Predicted best mixture ("
                if fit.verdict in ("good", "fair")
                else "Predicted best mixture — <b>not to be trusted, the fit is " + fit.verdict + "</b> ("
            )
            + escape(fit.objective)
            + "): "
            + ", ".join(f"{escape(w)} {v:.2f}" for w, v in fit.best_mixture.items())
            + f" → predicted {fit.best_objective:.3f}; best observed trial "
            f"#{fit.best_observed['number']}: {fit.best_observed['objective']:.3f}."
        )
    findings.extend(escape(x) for x in fit_errors)
    return findings


def _param_names(columns: list[str]) -> dict[str, str]:
    """``param/<path>`` columns renamed to ``<path>`` for a table's header."""
    return {c: c[len("param/") :] for c in columns}


def _best_trials_section(page: Page, sweep: SweepData) -> None:
    page.section("Best trials", "best")
    trials, objectives = sweep.trials, sweep.objectives
    if not (objectives and sweep.done.height):
        page.p("(no complete trial with an objective yet)", "note")
        return
    maximize = sweep.directions[0] == "max"
    top = S.best_trials(trials, 10, objectives[0], maximize)
    params = [c for c in trials.columns if c.startswith("param/")]
    keep = ["number", *objectives, *params, "duration_s"]
    shown = top.select([c for c in keep if c in top.columns])
    page.raw(table(shown.rename(_param_names(params))))
    page.figure(
        lambda: P.plot_history(trials, objectives[0], maximize),
        "history.png",
        "Objective per trial in order; the red step is the best so far.",
    )


def _interference_section(page: Page, sweep: SweepData, fits: list[S.Interference], fit_errors: list[str]) -> None:
    page.section("Interference", "interference")
    if not fits:
        page.p("(no fit: " + escape("; ".join(fit_errors) or "no mixture weights in the trials") + ")", "note")
    for i, fit in enumerate(fits):
        suffix = "" if len(fits) == 1 else f"_{i}"
        page.h3(f"{fit.path}: {fit.metric} ({fit.split}) at the end of {fit.stage}")
        page.figure(
            lambda fit=fit: P.plot_interference(fit),
            f"interference{suffix}.png",
            f"Row: a task's weight raised by {fit.per:g} (taken from the others in proportion, at the sweep's "
            "mean mixture); column: the change in each task's metric predicted by a linear mixture model "
            "fitted over the complete trials (RegMix-style). Negative off-diagonal cells are the seesaw.",
        )
        page.p(escape(fit.quality))
        observed = fit.best_observed
        mix = pl.DataFrame(
            {
                "task": fit.weights,
                "sweep mean": [fit.mean_mixture[w] for w in fit.weights],
                "sweep range": [f"{fit.weight_range[w][0]:.2f}–{fit.weight_range[w][1]:.2f}" for w in fit.weights],
                f"best observed (#{observed['number']})": [observed["mixture"][w] for w in fit.weights],
                "predicted best": [fit.best_mixture[w] for w in fit.weights],
            }
        )
        page.raw("<h3>Mixtures</h3>" + table(mix))
        pred = pl.DataFrame(
            {
                "task": fit.targets,
                f"observed at #{observed['number']}": [observed["metrics"][t] for t in fit.targets],
                "predicted at the best mixture": [fit.best_predicted[t] for t in fit.targets],
                "R²": [fit.r2[t] for t in fit.targets],
                "LOO R²": [fit.loo_r2[t] for t in fit.targets],
            }
        )
        page.raw(f"<h3>{escape(fit.metric)} per task</h3>" + table(pred))
        page.raw(
            "<details><summary>Scheffé coefficients (the predicted metric for a stage of one task alone — "
            "an extrapolation)</summary>" + table(fit.coef) + "</details>"
        )
        page.figure(
            lambda fit=fit: P.plot_partial_dependence(sweep.trials, fit),
            f"partial_dependence{suffix}.png",
            "Weight → metric: dots are trials; lines move one weight across the range the sweep tried, the "
            "others keeping their mean proportions (the fitted model). Dotted: the predicted best mixture.",
        )


def _pareto_and_failed_sections(page: Page, sweep: SweepData, fits: list[S.Interference]) -> None:
    trials, objectives = sweep.trials, sweep.objectives
    page.section("Pareto front", "pareto")
    pair = S.tradeoff_pair(trials, objectives, sweep.metric, sweep.split, fits[0].stage if fits else None)
    if pair is None:
        page.p("(needs two objectives, or two task metrics, over complete trials)", "note")
    else:
        x, y, why = pair
        front = S.pareto(trials, [x, y], sweep.directions if [x, y] == objectives[:2] else None)
        page.p(escape(why))
        page.figure(
            lambda: P.plot_pareto(front, x, y),
            "pareto.png",
            "Complete trials on two metrics; red: not beaten on both by any other trial.",
        )
        params = [c for c in trials.columns if c.startswith("param/")]
        page.raw(
            table(
                front.filter(pl.col("pareto"))
                .select([c for c in ("number", x, y, *params) if c in front.columns])
                .rename(_param_names(params))
            )
        )

    page.section("Failed and pruned trials", "failed")
    if "state" in trials.columns:
        bad = trials.filter(pl.col("state").is_in(["FAIL", "PRUNED"]))
        cols = [c for c in ("number", "state", "pruned_step", "fail_reason", "duration_s") if c in bad.columns]
        page.raw(table(bad.select(cols), wrap=("fail_reason",)))


def _best_run_section(page: Page, sweep: SweepData) -> None:
    page.section("Best trial's curves", "best-run")
    maximize = sweep.directions[0] == "max" if sweep.directions else sweep.maximize
    best_dir = S.best_trial_dir(sweep.trials, sweep.sweep_dir, maximize)
    if best_dir is None:
        page.p("(the best trial's run directory is not available)", "note")
        return
    run_frame = load_run(best_dir)
    page.p(
        f"Trial run directory: <code>{escape(str(best_dir))}</code> — <code>harness report "
        f"{escape(str(best_dir))}</code> for its full report."
    )
    delta = float((read_config(best_dir).get("eval") or {}).get("seesaw_delta", 0.15))
    run_events = F.seesaw_events(run_frame, delta)
    page.figure(
        lambda: P.plot_curves(run_frame, sweep.metric, None, run_events),
        "best_trial_curves.png",
        f"The best trial's per-task {escape(sweep.metric)} across its curriculum.",
    )


def sweep_report(
    sweep_dir: PathLike, out: PathLike | None = None, *, metric: str | None = None, split: str | None = None
) -> Path:
    """Write ``report.html`` and its PNGs for a sweep into ``out`` (default ``SWEEP_DIR/report``)."""
    sweep_dir = Path(sweep_dir)
    out = Path(out) if out is not None else sweep_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    sweep = load_sweep_data(sweep_dir, metric, split)
    page = Page(out, f"{sweep.name} — sweep report")
    fits, fit_errors = _fits(sweep)  # first: the findings read them

    page.section("Findings", "findings")
    page.findings(_findings(sweep, fits, fit_errors))
    _best_trials_section(page, sweep)
    _interference_section(page, sweep, fits, fit_errors)
    _pareto_and_failed_sections(page, sweep, fits)
    _best_run_section(page, sweep)

    page.section("Sweep", "sweep")
    page.raw(
        facts_table(
            {
                "sweep directory": str(sweep_dir.resolve()),
                "trials": str(sweep.trials.height),
                "report": f"harness report {sweep_dir} --out {out}",
            }
        )
    )
    page.file_details(sweep_dir / "sweep.resolved.yaml")
    subtitle = (
        f"{sweep.trials.height} trials · {sweep.done.height} complete · objective "
        f"{escape(', '.join(sweep.objectives) or '–')} · analysed metric {escape(sweep.metric)} on "
        f"{escape(sweep.split)}"
    )
    return page.write(subtitle)
