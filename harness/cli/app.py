"""The ``harness`` command line, thirteen commands:

- one experiment: ``validate``, ``run`` (``--resume`` a killed run), ``eval`` (a checkpoint alone), ``sanity``
  (overfit and inputs-matter checks), ``inspect`` (one row per module), ``schema`` (the experiment JSON Schema);
- sweeps: ``sweep`` (optuna workers on a shared storage), ``sweep-status``, ``mixture`` (mixing laws fitted to a
  sweep's trials and the mixture they propose: :mod:`harness.cli.mixture`);
- reproductions: ``repro`` (a published finding's arms × seeds → table and figure, experiments/repro/);
  these two live in :mod:`harness.cli.studies`; they, ``run --seeds`` and ``mixture --verify K`` take ``--launcher
  local|slurm`` (this machine, or one SLURM job array: :mod:`harness.studies.launch`);
- analysis: ``report`` (report.html for a run or a sweep), ``compare`` (per-task deltas between two runs);
- ``cache ls | du | prune``: the stage cache (:mod:`harness.runs.execution.stage_cache`).

Exit codes: 0 success; 2 invalid input: experiment / sweep file (every error printed with its YAML path), a
``--set`` value, task data, a run directory that is not empty or in use; 3 stopped by the non-finite guard; 4 a
special token's row would not train; 5 the file system refused (permission, disk full); 1 anything else (cluster
jobs that failed among them). Errors are one line, no traceback (``--debug`` anywhere on the line shows it):
:mod:`harness.cli.errors`.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import typer

from harness.cli import mixture, studies
from harness.cli.launching import DetachOption, LauncherOption, SlurmOption, choose_launcher

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Declarative multi-stage SFT experiments that make task-mixture interference measurable.",
)

SetOption = typer.Option(None, "--set", help="Override a field: key.path=value (YAML value), repeatable.")


def _fail(message: str, code: int = 2) -> None:
    typer.echo(message, err=True)
    raise typer.Exit(code)


def _load(file: Path, overrides: list[str] | None):
    from harness.config import ConfigError, load_experiment

    try:
        return load_experiment(file, overrides)
    except ConfigError as e:
        _fail(str(e))


@app.command()
def validate(file: Path = typer.Argument(..., help="Experiment YAML."), set_: list[str] | None = SetOption):
    """Check an experiment file and its task data; exit 2 listing every error by YAML path. Prints each eval pool's
    size and the smallest change it can detect."""
    exp = _load(file, set_)  # first: a broken file is reported without importing torch
    from harness.checks.pools import pool_report
    from harness.data.task_data import DataError

    stages = exp.resolved_stages()
    try:
        pools = pool_report(exp)
    except (DataError, ValueError) as e:  # ValueError: an image-text model's processor that cannot render
        _fail(f"{file}: {e}")
    typer.echo(
        f"{file}: ok — {len(exp.tasks)} tasks, {len(stages)} stages "
        f"({', '.join(f'{s.name}:{s.steps}' for s in stages)})"
    )
    typer.echo("\n".join(pools))


@app.command()
def run(
    file: Path = typer.Argument(..., help="Experiment YAML."),
    set_: list[str] | None = SetOption,
    out: Path | None = typer.Option(
        None,
        "--out",
        help="The run directory, claimed for this run: refused when "
        "not empty or in use (default runs/<name>/<time>-<random>).",
    ),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the killed run in this directory."),
    nproc: int = typer.Option(
        1,
        "--nproc",
        min=1,
        help="Data-parallel ranks on this machine (through torchrun; batch_size stays the global batch).",
    ),
    seeds: str | None = typer.Option(
        None,
        "--seeds",
        help="Comma-separated seeds: one replicate per seed under <run dir>/seed-<s>/ (overrides the file's seeds).",
    ),
    jobs: int = typer.Option(1, "--jobs", min=1, help="Replicates run at once (subprocesses) with --seeds."),
    force: bool = typer.Option(
        False, "--force", help="Start over in a non-empty --out (its earlier run's outputs are deleted)."
    ),
    nodes: int = typer.Option(
        1,
        "--nodes",
        min=1,
        help="Nodes of a data-parallel run inside a SLURM allocation (one srun task per node; --nproc ranks "
        "each): torchrun's rendezvous is read from SLURM's environment.",
    ),
    launcher: str | None = LauncherOption,
    slurm: list[str] | None = SlurmOption,
    detach: bool = DetachOption,
):
    """Train and evaluate an experiment (exit 3 when the non-finite guard stops it)."""
    exp = _load(file, set_)  # first: a broken file is reported without importing torch
    from harness.config import ConfigError
    from harness.data.task_data import DataError
    from harness.runs.execution import process_ranks
    from harness.runs.execution.runner import default_run_dir, run_experiment
    from harness.training.checkpoint import WorldSizeError
    from harness.training.guard import NonFiniteError
    from harness.training.parallel import ParallelError
    from harness.training.special_tokens import SpecialTokenGradientError

    choice = choose_launcher(None, launcher, slurm)
    seed_list = _run_refusals(exp, seeds, out, resume, force, nproc, nodes, jobs, choice.kind, detach)
    run_dir = resume or out or default_run_dir(exp)
    if (nproc > 1 or nodes > 1) and not process_ranks.launched_by_torchrun():
        argv = [a for a in sys.argv[1:]] + ([] if out or resume else ["--out", str(run_dir)])  # one dir for all
        try:
            code = process_ranks.launch(nproc, argv, nodes=nodes)
        except process_ranks.RendezvousError as e:
            _fail(str(e))
        raise typer.Exit(code)
    session = (
        process_ranks.rank_session(exp, run_dir, resume=resume is not None)
        if process_ranks.launched_by_torchrun()
        else None
    )
    try:
        if seed_list:
            _run_seeds(exp, file, set_, run_dir, seed_list, jobs, choice, detach)
        else:
            with session or contextlib.nullcontext((exp, run_dir)) as (exp, run_dir):
                run_experiment(exp, run_dir, resume=resume is not None, force=force)
    except (DataError, ConfigError, ParallelError) as e:
        _fail(f"{file}: {e}")
    except WorldSizeError as e:
        _fail(str(e))
    except NonFiniteError as e:
        _fail(f"training stopped: {e}\nreport: {run_dir / 'nonfinite.json'}", code=3)
    except SpecialTokenGradientError as e:
        _fail(f"training stopped before the first update: {e}", code=4)


def _run_refusals(exp, seeds, out, resume, force, nproc, nodes, jobs, kind: str, detach: bool) -> list[int] | None:  # noqa: C901 — each refusal is one independent check, in the order a user meets them
    """The seeds ``harness run`` replicates over (None: one run), after refusing what its options cannot do
    together (one line, exit 2)."""
    import os

    from harness.runs.execution import process_ranks
    from harness.studies.replicates import SeedsError, parse_seeds
    from harness.training.checkpoint import WorldSizeError, check_resume_world

    if resume and out and out != resume:
        _fail("--resume names the run directory; drop --out or give the same directory")
    if resume and force:
        _fail("--resume continues the run in the directory, --force starts over in it: give one")
    if resume:
        try:  # the ranks check again (a torchrun by hand); here it fails before any rank starts
            world = int(os.environ["WORLD_SIZE"]) if process_ranks.launched_by_torchrun() else nproc * nodes
            check_resume_world(resume, world)
        except WorldSizeError as e:
            _fail(str(e))
    try:
        seed_list = parse_seeds(seeds) if seeds is not None else exp.seeds
    except SeedsError as e:
        _fail(str(e))
    if jobs > 1 and not seed_list:
        _fail("--jobs runs seed replicates at once: give --seeds (or seeds: in the file)")
    if seed_list and resume:
        _fail("--resume continues one run: give a replicate's directory (<group>/seed-<s>) without --seeds")
    if seed_list and (nproc > 1 or nodes > 1):
        _fail("--seeds with --nproc is not supported yet: run each seed with --set seed=<s> --nproc N")
    if nodes > 1 and not (out or resume):
        _fail("--nodes: give --out on a file system every node reaches (each node would name its own directory)")
    if kind == "slurm" and not seed_list:
        _fail("--launcher slurm runs seed replicates as jobs: give --seeds (one run: see docs/distributed.md)")
    if kind == "slurm" and jobs > 1:
        _fail("--jobs is for this machine; on SLURM each replicate is a job (--slurm array_parallelism=N: N at once)")
    if detach and kind != "slurm":
        _fail("--detach leaves SLURM jobs running: it needs --launcher slurm")
    return seed_list


def _run_seeds(exp, file: Path, set_, group_dir: Path, seeds: list[int], jobs: int, choice, detach: bool) -> None:
    """``harness run --seeds``: the replicates here (in this process, or ``--jobs`` subprocesses) or as SLURM jobs."""
    from harness.studies.launch import JobsFailed, make_launcher
    from harness.studies.replicates import run_group

    cluster = None
    if choice.kind == "slurm":
        cluster = make_launcher(
            choice, group_dir / "slurm", echo=typer.echo, job_name=f"harness-seeds-{exp.name}", detach=detach
        )
    command = ["run", str(file), *(arg for value in set_ or [] for arg in ("--set", value))]
    try:
        codes = run_group(exp, group_dir, seeds, jobs=jobs, command=command, echo=typer.echo, launcher=cluster)
    except JobsFailed as e:
        _fail(str(e), 1)
    if cluster is not None and not codes:
        typer.echo("the jobs run on: this command again follows them")
        return
    failed = {s: c for s, c in codes.items() if c}
    if failed:
        _fail(f"replicates failed: {failed} (see {group_dir}/seed-<s>.log)", next(iter(failed.values())))


@app.command("eval")
def eval_(
    checkpoint: Path = typer.Argument(..., help="A checkpoint directory (e.g. RUN/checkpoints/<stage>)."),
    experiment: Path = typer.Option(..., "--experiment", help="Experiment YAML: tasks, eval settings, tracking."),
    set_: list[str] | None = SetOption,
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Output directory; a non-empty one (a run) gets a new "
        "eval-<time>-<random> subdirectory (default runs/<name>/eval-<time>-<random>).",
    ),
):
    """Evaluate a saved checkpoint alone, with the experiment's evaluators, probes and outputs."""
    from harness.config import ConfigError
    from harness.data.task_data import DataError
    from harness.runs.execution.checkpoint_eval import eval_output_dir, evaluate_checkpoint

    exp = _load(experiment, set_)
    run_dir = eval_output_dir(out, exp)
    try:
        evaluate_checkpoint(exp, checkpoint, run_dir)
    except (DataError, ConfigError) as e:
        _fail(str(e))
    typer.echo(f"evaluation → {run_dir}")


@app.command()
def sanity(
    file: Path = typer.Argument(..., help="Experiment YAML."),
    set_: list[str] | None = SetOption,
    n: int = typer.Option(128, "--n", help="Examples the overfit check trains on."),
    threshold: float = typer.Option(0.95, help="tf_exact the overfit check must reach."),
    max_steps: int = typer.Option(500, help="Step budget of the overfit check."),
    checkpoint: Path | None = typer.Option(None, help="Run the inputs-matter check on this checkpoint."),
    image_threshold: float = typer.Option(0.2, help="img_dependence the images-matter check needs (image tasks)."),
):
    """Overfit n examples, then check that predictions depend on the prompt (and, for image tasks, on the image).
    Exit 0 only if every check passes."""
    from harness.checks.sanity import run_sanity
    from harness.runs.execution.console import Console

    exp = _load(file, set_)
    results = run_sanity(
        exp, n, threshold, max_steps, str(checkpoint) if checkpoint else None, Console(), image_threshold
    )
    for result in results:
        typer.echo(result.line())
    raise typer.Exit(0 if all(r.passed for r in results) else 1)


@app.command()
def schema(
    file: Path | None = typer.Argument(None, help="An experiment whose plugins: modules are imported first."),
):
    """Print the experiment JSON Schema (for editor completion and checking), with every registered plug-in's
    params schema by kind under x-plugins (recipes, evaluators, probes, mixture_controllers, model_checks)."""
    from harness.config import Experiment
    from harness.config.load import import_experiment_plugins, resolve_plugin_paths
    from harness.config.yaml_io import load_raw
    from harness.core.plugins import plugin_schemas

    if file is not None:
        raw = resolve_plugin_paths(load_raw(file), file.resolve().parent)
        import_experiment_plugins(raw.get("plugins", []), str(file))
    out = Experiment.model_json_schema()
    out["x-plugins"] = plugin_schemas()
    typer.echo(json.dumps(out, indent=2))


# -- sweeps and reproductions (harness/cli/studies.py) ----------------------------------------------------------------

app.command()(studies.sweep)
app.command("sweep-status")(studies.sweep_status)
app.command()(studies.repro)
app.command()(mixture.mixture)


# ---- analysis: report and compare (the analysis package) ------------------------------------------------------


@app.command()
def report(
    path: Path = typer.Argument(
        ...,
        help="A run directory (metrics.parquet), a sweep directory (trials.parquet) or a "
        "seed group (group.json, from run --seeds).",
    ),
    out: Path | None = typer.Option(None, "--out", help="Where report.html and the PNGs go (default PATH/report)."),
    metric: str | None = typer.Option(
        None, "--metric", help="The metric the report is about (default greedy; for a sweep, its objective's metric)."
    ),
    split: str | None = typer.Option(
        None, "--split", help="Sweeps: the split the interference fit reads (default the objective's, else heldout)."
    ),
    delta: float | None = typer.Option(
        None, "--delta", help="Runs: the seesaw threshold (default the run's eval.seesaw_delta)."
    ),
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
    metric: list[str] | None = typer.Option(
        None,
        "--metric",
        help="Metric(s) to compare, repeatable (default greedy, mode_ok, tf_first, ft_rank_median, ft_hijack).",
    ),
    split: list[str] | None = typer.Option(None, "--split", help="Split(s), repeatable (default all)."),
):
    """Print per-task deltas at each stage end between two runs."""
    from analysis.frames import COMPARE_METRICS, format_compare
    from analysis.frames import compare as compare_runs
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
    set_: list[str] | None = SetOption,
    stage: str | None = typer.Option(None, "--stage", help="Stage whose trainable set to apply (default: first)."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list of module rows instead of a table."),
    tokens: bool = typer.Option(
        False,
        "--tokens",
        help="List the special-token rows instead: norms, under-trained "
        "or not, and why (the base model as the run loads it).",
    ),
):
    """One row per module: name, type, parameters, trainable, output shape and dtype on a sample batch."""
    from harness.checks.inspection import inspect_target, inspect_tokens, render, render_tokens
    from harness.config import ConfigError
    from harness.data.task_data import DataError

    if not target.exists():
        _fail(f"{target}: no such file or directory")
    try:
        result = inspect_tokens(target, set_) if tokens else inspect_target(target, set_, stage)
    except ConfigError as e:
        _fail(str(e))
    except (ValueError, DataError) as e:
        _fail(f"{target}: {e}")
    if tokens:
        if as_json:
            typer.echo(json.dumps([r.as_dict() for r in result.reports], indent=1))
        else:
            render_tokens(result)
        return
    if as_json:
        typer.echo(json.dumps(result.rows, indent=1))
    else:
        render(result)


# ---- the stage cache ($HARNESS_CACHE/stages, harness.runs.execution.stage_cache) ---------------------------

cache_app = typer.Typer(no_args_is_help=True, help="The stage cache under $HARNESS_CACHE/stages: ls, du, prune.")
app.add_typer(cache_app, name="cache")


@cache_app.command("ls")
def cache_ls():
    """Every entry, least recently used first: key, size, last use, experiment/stage."""
    from datetime import datetime

    from harness.runs.execution.cache_housekeeping import human_size, list_entries
    from harness.runs.execution.stage_cache import stages_root

    for e in list_entries(stages_root()):
        used = datetime.fromtimestamp(e.last_used).strftime("%Y-%m-%d %H:%M")
        typer.echo(f"{e.path.name[:16]}  {human_size(e.size):>9}  {used}  {e.label}")


@cache_app.command("du")
def cache_du():
    """Entries and total size of the stage cache."""
    from harness.runs.execution.cache_housekeeping import human_size, list_entries
    from harness.runs.execution.stage_cache import stages_root

    entries = list_entries(stages_root())
    typer.echo(f"{stages_root()}: {len(entries)} entries, {human_size(sum(e.size for e in entries))}")


@cache_app.command("prune")
def cache_prune(
    older_than: str | None = typer.Option(None, "--older-than", help="Remove entries unused this long (7d, 12h)."),
    max_size: str | None = typer.Option(
        None, "--max-size", help="Then remove the least recently used until the cache is at most this big (20GB)."
    ),
):
    """Remove old entries, corrupt ones, and the least recently used beyond a size (exit 2 on a bad value)."""
    from harness.runs.execution.cache_housekeeping import human_size, parse_age, parse_size, prune
    from harness.runs.execution.stage_cache import stages_root

    try:
        age = parse_age(older_than) if older_than else None
        size = parse_size(max_size) if max_size else None
    except ValueError as e:
        _fail(f"harness cache prune: {e}")
    removed = prune(stages_root(), age, size)
    typer.echo(f"removed {len(removed)} entries ({human_size(sum(e.size for e in removed))})")


def main() -> None:
    from harness.cli.errors import run_cli

    run_cli(lambda: app(prog_name="harness"))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
