"""The ``harness`` command line, ten commands:

- one experiment: ``validate``, ``run`` (``--resume`` a killed run), ``eval`` (a checkpoint alone), ``sanity``
  (overfit and inputs-matter checks), ``inspect`` (one row per module), ``schema`` (the experiment JSON Schema);
- sweeps: ``sweep`` (optuna workers on a shared storage), ``sweep-status``;
- analysis: ``report`` (report.html for a run or a sweep), ``compare`` (per-task deltas between two runs).

Exit codes: 0 success; 2 invalid experiment file or task data (every error printed with its YAML path, no
traceback); 3 stopped by the non-finite guard; 4 a special token's row would not train; 1 anything else.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Declarative multi-stage SFT experiments that make task-mixture interference measurable.")

SetOption = typer.Option(None, "--set", help="Override a field: key.path=value (YAML value), repeatable.")


def _fail(message: str, code: int = 2) -> None:
    typer.echo(message, err=True)
    raise typer.Exit(code)


def _load(file: Path, overrides: Optional[list[str]]):
    from harness.config import ConfigError, load_experiment

    try:
        return load_experiment(file, overrides)
    except ConfigError as e:
        _fail(str(e))


@app.command()
def validate(file: Path = typer.Argument(..., help="Experiment YAML."), set_: Optional[list[str]] = SetOption):
    """Check an experiment file; exit 2 listing every error by YAML path."""
    exp = _load(file, set_)
    stages = exp.resolved_stages()
    typer.echo(f"{file}: ok — {len(exp.tasks)} tasks, {len(stages)} stages "
               f"({', '.join(f'{s.name}:{s.steps}' for s in stages)})")


@app.command()
def run(
    file: Path = typer.Argument(..., help="Experiment YAML."),
    set_: Optional[list[str]] = SetOption,
    out: Optional[Path] = typer.Option(None, "--out", help="The run directory (default runs/<name>/<timestamp>)."),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the killed run in this directory."),
):
    """Train and evaluate an experiment (exit 3 when the non-finite guard stops it)."""
    from harness.adapters import SpecialTokenGradientError
    from harness.config import ConfigError
    from harness.guard import NonFiniteError
    from harness.prepare import DataError
    from harness.runner import default_run_dir, run_experiment

    exp = _load(file, set_)
    if resume and out and out != resume:
        _fail("--resume names the run directory; drop --out or give the same directory")
    run_dir = resume or out or default_run_dir(exp)
    try:
        run_experiment(exp, run_dir, resume=resume is not None)
    except (DataError, ConfigError) as e:
        _fail(f"{file}: {e}")
    except NonFiniteError as e:
        _fail(f"training stopped: {e}\nreport: {run_dir / 'nonfinite.json'}", code=3)
    except SpecialTokenGradientError as e:
        _fail(f"training stopped before the first update: {e}", code=4)


@app.command("eval")
def eval_(
    checkpoint: Path = typer.Argument(..., help="A checkpoint directory (e.g. RUN/checkpoints/<stage>)."),
    experiment: Path = typer.Option(..., "--experiment", help="Experiment YAML: tasks, eval settings, tracking."),
    set_: Optional[list[str]] = SetOption,
    out: Optional[Path] = typer.Option(None, "--out", help="Output directory (default runs/<name>/eval-<time>)."),
):
    """Evaluate a saved checkpoint alone, with the experiment's evaluators, probes and outputs."""
    from datetime import datetime

    from harness.config import ConfigError
    from harness.prepare import DataError
    from harness.runner import evaluate_checkpoint

    exp = _load(experiment, set_)
    run_dir = out or Path("runs") / exp.name / f"eval-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    try:
        evaluate_checkpoint(exp, checkpoint, run_dir)
    except (DataError, ConfigError) as e:
        _fail(str(e))


@app.command()
def sanity(
    file: Path = typer.Argument(..., help="Experiment YAML."),
    set_: Optional[list[str]] = SetOption,
    n: int = typer.Option(128, "--n", help="Examples the overfit check trains on."),
    threshold: float = typer.Option(0.95, help="tf_exact the overfit check must reach."),
    max_steps: int = typer.Option(500, help="Step budget of the overfit check."),
    checkpoint: Optional[Path] = typer.Option(None, help="Run the inputs-matter check on this checkpoint."),
    image_threshold: float = typer.Option(0.2, help="img_dependence the images-matter check needs (image tasks)."),
):
    """Overfit n examples, then check that predictions depend on the prompt (and, for image tasks, on the image).
    Exit 0 only if every check passes."""
    from harness.console import Console
    from harness.sanity import run_sanity

    exp = _load(file, set_)
    results = run_sanity(exp, n, threshold, max_steps, str(checkpoint) if checkpoint else None, Console(),
                         image_threshold)
    for result in results:
        typer.echo(result.line())
    raise typer.Exit(0 if all(r.passed for r in results) else 1)


@app.command()
def schema():
    """Print the experiment JSON Schema (for editor completion and checking)."""
    from harness.config import Experiment

    typer.echo(json.dumps(Experiment.model_json_schema(), indent=2))


# -- sweeps (harness/sweep/) ------------------------------------------------------------------------------------


@app.command()
def sweep(
    file: Path = typer.Argument(..., help="Sweep YAML (experiments/sweeps/*.yaml)."),
    workers: int = typer.Option(1, "--workers", min=1, help="Worker processes on this machine."),
    out: Optional[Path] = typer.Option(None, "--out", help="The sweep directory (default runs/sweeps/<study>)."),
    set_: Optional[list[str]] = typer.Option(None, "--set", help="Override a field of the sweep file: key.path=value "
                                             "(space.<path>=… and overrides.<path>=… keep <path> whole)."),
    worker_offset: int = typer.Option(0, "--worker-offset", help="First worker index (sampler seed = study.seed + "
                                      "index): give each machine its own range."),
):
    """Run an optuna sweep: N workers on one shared storage, until the study's trial budget is used."""
    from harness.config import ConfigError
    from harness.sweep import load_sweep
    from harness.sweep.results import status_text
    from harness.sweep.worker import load_worker_study, run_sweep

    try:
        spec = load_sweep(file, set_)
        sweep_dir = out or Path("runs") / "sweeps" / spec.name
        typer.echo(f"sweep {spec.name} → {sweep_dir} (storage {spec.storage_url(sweep_dir)})")
        result = run_sweep(spec, sweep_dir, workers=workers, worker_offset=worker_offset, echo=typer.echo)
    except ConfigError as e:
        _fail(str(e))
    typer.echo(status_text(load_worker_study(spec, sweep_dir, worker_offset), spec))
    typer.echo(f"trials: {sweep_dir / 'trials.parquet'}")
    if not result["budget_done"] and not spec.spec.study.timeout:
        _fail("the workers stopped before the trial budget was used (see the worker logs)", 1)


@app.command("sweep-status")
def sweep_status(
    sweep_dir: Path = typer.Argument(..., help="A sweep directory (holding sweep.resolved.yaml)."),
    top: int = typer.Option(5, "--top", help="Best trials shown."),
):
    """Best trials (or the Pareto front) and parameter importances; rewrites trials.parquet from the storage."""
    from harness.config import ConfigError
    from harness.sweep import RESOLVED_NAME, load_resolved
    from harness.sweep.results import status_text, write_trials
    from harness.sweep.worker import load_worker_study

    if not (sweep_dir / RESOLVED_NAME).is_file():
        _fail(f"{sweep_dir}: no {RESOLVED_NAME} here; give the directory of a sweep (harness sweep --out)")
    try:
        spec = load_resolved(sweep_dir)
    except ConfigError as e:
        _fail(str(e))
    study = load_worker_study(spec, sweep_dir, 0)
    write_trials(study, spec, sweep_dir)
    typer.echo(status_text(study, spec, top=top))


# ---- analysis: report and compare (the analysis package) ------------------------------------------------------


@app.command()
def report(
    path: Path = typer.Argument(..., help="A run directory (metrics.parquet) or a sweep directory (trials.parquet)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Where report.html and the PNGs go (default PATH/report)."),
    metric: Optional[str] = typer.Option(None, "--metric", help="The metric the report is about (default greedy; "
                                                                "for a sweep, its objective's metric)."),
    split: Optional[str] = typer.Option(None, "--split", help="Sweeps: the split the interference fit reads "
                                                              "(default the objective's, else heldout)."),
    delta: Optional[float] = typer.Option(None, "--delta", help="Runs: the seesaw threshold (default the run's "
                                                                "eval.seesaw_delta)."),
):
    """Write report.html (self-contained, PNGs embedded and written beside it) for a run or a sweep."""
    from analysis.loading import AnalysisError, is_sweep_dir
    from analysis.report import write_report

    if is_sweep_dir(path):
        options = {"metric": metric, "split": split}
    else:
        options = {"delta": delta, **({"metric": metric} if metric else {})}
    try:
        html_path = write_report(path, out, **options)
    except AnalysisError as e:
        _fail(f"harness report: {e}")
    typer.echo(f"report → {html_path}")


@app.command()
def compare(
    run_a: Path = typer.Argument(..., help="Run directory A."),
    run_b: Path = typer.Argument(..., help="Run directory B (deltas are B − A)."),
    metric: Optional[list[str]] = typer.Option(None, "--metric", help="Metric(s) to compare, repeatable "
                                                                       "(default greedy, mode_ok, tf_first, "
                                                                       "ft_rank_median, ft_hijack)."),
    split: Optional[list[str]] = typer.Option(None, "--split", help="Split(s), repeatable (default all)."),
):
    """Print per-task deltas at each stage end between two runs."""
    from analysis.frames import COMPARE_METRICS, compare as compare_runs, format_compare
    from analysis.loading import AnalysisError, load_run

    try:
        a, b = load_run(run_a), load_run(run_b)
        deltas = compare_runs(a, b, metric or COMPARE_METRICS, split or None)
    except AnalysisError as e:
        _fail(f"harness compare: {e}")
    typer.echo(format_compare(deltas, f"{run_a} ({a['run_id'][0]})", f"{run_b} ({b['run_id'][0]})"), nl=False)


@app.command("inspect")
def inspect_command(
    target: Path = typer.Argument(..., help="Experiment YAML, or a checkpoint directory (HF format)."),
    set_: Optional[list[str]] = SetOption,
    stage: Optional[str] = typer.Option(None, "--stage", help="Stage whose trainable set to apply (default: first)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list of module rows instead of a table."),
):
    """One row per module: name, type, parameters, trainable, output shape and dtype on a sample batch."""
    from harness.config import ConfigError
    from harness.inspection import inspect_target, render

    if not target.exists():
        _fail(f"{target}: no such file or directory")
    try:
        result = inspect_target(target, set_, stage)
    except ConfigError as e:
        _fail(str(e))
    except ValueError as e:
        _fail(f"{target}: {e}")
    if as_json:
        typer.echo(json.dumps(result.rows, indent=1))
    else:
        render(result)


def main() -> None:
    app(prog_name="harness")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
