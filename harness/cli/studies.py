"""The study commands of the ``harness`` app — ``sweep`` (optuna workers on a shared storage, here or as SLURM jobs),
``sweep-status`` and ``repro`` (a published finding's arms × seeds) — as plain functions that
:mod:`harness.cli.app` registers (it imports this module, never the reverse). Nothing heavy is imported before a
command runs."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.cli.launching import DetachOption, LauncherOption, SlurmOption, choose_launcher, raise_usage


def sweep(
    file: Path = typer.Argument(..., help="Sweep YAML (experiments/sweeps/*.yaml)."),
    workers: int = typer.Option(1, "--workers", min=1, help="Worker processes on this machine, or SLURM jobs."),
    out: Path | None = typer.Option(None, "--out", help="The sweep directory (default runs/sweeps/<study>)."),
    set_: list[str] | None = typer.Option(
        None,
        "--set",
        help="Override a field of the sweep file: key.path=value "
        "(space.<path>=… and overrides.<path>=… keep <path> whole).",
    ),
    worker_offset: int = typer.Option(
        0,
        "--worker-offset",
        help="First worker index (sampler seed = study.seed + index): give each machine its own range.",
    ),
    gpus: str | None = typer.Option(
        None,
        "--gpus",
        help="Devices to deal among the workers, e.g. 0,1,2,3 "
        "(each worker's CUDA_VISIBLE_DEVICES: equal consecutive groups).",
    ),
    launcher: str | None = LauncherOption,
    slurm: list[str] | None = SlurmOption,
    detach: bool = DetachOption,
):
    """Run an optuna sweep: N workers on one shared storage, until the study's trial budget is used."""
    from harness.config import ConfigError
    from harness.core.redact import mask_url
    from harness.studies.launch import JobsFailed, LauncherError
    from harness.studies.sweep import load_sweep
    from harness.studies.sweep.results import status_text
    from harness.studies.sweep.spec import proxy_text
    from harness.studies.sweep.worker import load_worker_study, run_sweep, stop_on_sigterm

    stop_on_sigterm()  # SIGTERM stops the workers as Ctrl-C does (they would otherwise run on alone)
    try:
        spec = load_sweep(file, set_)
    except ConfigError as e:
        raise_usage(str(e))
    choice = choose_launcher(spec.spec.launcher, launcher, slurm)
    if choice.kind == "slurm" and gpus:
        raise_usage("--gpus deals this machine's devices; a SLURM job asks for its own: --slurm gpus_per_job=N")
    if detach and choice.kind != "slurm":
        raise_usage("--detach leaves SLURM jobs running: it needs --launcher slurm")
    sweep_dir = out or Path("runs") / "sweeps" / spec.name
    typer.echo(f"sweep {spec.name} → {sweep_dir} (storage {mask_url(spec.storage_url(sweep_dir))})")
    if spec.spec.proxy:
        typer.echo(f"proxy trials: {proxy_text(spec.spec.proxy)}")
    try:
        if choice.kind == "slurm":
            from harness.studies.sweep.cluster import run_sweep_on_cluster  # submitit: only for the cluster

            result = run_sweep_on_cluster(spec, sweep_dir, choice, workers, worker_offset, typer.echo, detach)
        else:
            devices = [g.strip() for g in gpus.split(",") if g.strip()] if gpus else None
            result = run_sweep(spec, sweep_dir, workers, worker_offset, typer.echo, gpus=devices)
    except (ConfigError, LauncherError) as e:
        raise_usage(str(e))
    if result.get("detached"):
        typer.echo(f"the jobs run on: harness sweep-status {sweep_dir} shows the study; this command again follows")
        return
    typer.echo(status_text(load_worker_study(spec, sweep_dir, worker_offset), spec))
    typer.echo(f"trials: {sweep_dir / 'trials.parquet'}")
    if result.get("failed"):
        raise_usage(str(JobsFailed(result["failed"])), 1)
    if not result["budget_done"] and not spec.spec.study.timeout:
        raise_usage("the workers stopped before the trial budget was used (see the worker logs)", 1)


def sweep_status(
    sweep_dir: Path = typer.Argument(..., help="A sweep directory (holding sweep.resolved.yaml)."),
    top: int = typer.Option(5, "--top", help="Best trials shown."),
):
    """Best trials (or the Pareto front) and parameter importances; rewrites trials.parquet from the storage."""
    from harness.config import ConfigError
    from harness.studies.sweep import RESOLVED_NAME, load_resolved
    from harness.studies.sweep.results import status_text, write_trials
    from harness.studies.sweep.worker import load_worker_study

    if not (sweep_dir / RESOLVED_NAME).is_file():
        raise_usage(f"{sweep_dir}: no {RESOLVED_NAME} here; give the directory of a sweep (harness sweep --out)")
    try:
        spec = load_resolved(sweep_dir)
    except ConfigError as e:
        raise_usage(str(e))
    study = load_worker_study(spec, sweep_dir, 0)
    write_trials(study, spec, sweep_dir)
    typer.echo(status_text(study, spec, top=top))


def repro(
    name: str | None = typer.Argument(None, help="A reproduction under experiments/repro/ (or its directory)."),
    scale: float = typer.Option(1.0, "--scale", min=0.0, help="Multiply the reproduction's size fields (steps)."),
    seeds: str = typer.Option("0,1,2", "--seeds", help="Comma-separated seeds, one run per arm each."),
    out: Path | None = typer.Option(None, "--out", help="Output directory (default runs/repro/NAME)."),
    arms: str | None = typer.Option(None, "--arms", help="Comma-separated arms to run (default all)."),
    micro: bool = typer.Option(False, "--micro", help="The micro size of the reproduction (seconds; tests)."),
    jobs: int = typer.Option(
        1,
        "--jobs",
        min=1,
        help="Runs at once, each in its own process (torch threads split between them unless OMP_NUM_THREADS is set).",
    ),
    list_: bool = typer.Option(False, "--list", help="List the reproductions and exit."),
    launcher: str | None = LauncherOption,
    slurm: list[str] | None = SlurmOption,
    detach: bool = DetachOption,
):
    """Run a published finding's arms for several seeds; write NAME.md (table with intervals) and NAME.png."""
    from harness.config import ConfigError
    from harness.studies.launch import JobsFailed, make_launcher
    from harness.studies.repro.plan import available, load_repro, parse_seeds, run_repro
    from harness.studies.repro.report import write_outputs
    from harness.training.guard import NonFiniteError
    from harness.training.special_tokens import SpecialTokenGradientError

    if not list_ and not name:
        raise_usage("harness repro: give a NAME (harness repro --list shows them)")
    try:
        if list_:
            for known in available():
                typer.echo(f"{known:<24} {load_repro(known).spec.title}")
            return
        spec = load_repro(name)
        choice = choose_launcher(spec.spec.launcher, launcher, slurm)
        if choice.kind == "slurm" and jobs > 1:
            raise_usage("--jobs is for this machine: on SLURM each run is a job (--slurm array_parallelism=N)")
        seed_list = parse_seeds(seeds)
        out_dir = out or Path("runs") / "repro" / spec.name
        cluster = None
        if choice.kind == "slurm":
            cluster = make_launcher(
                choice, out_dir / "slurm", echo=typer.echo, job_name=f"harness-repro-{spec.name}", detach=detach
            )
        outcomes = run_repro(
            spec,
            seed_list,
            out_dir,
            scale,
            micro,
            arms.split(",") if arms else None,
            typer.echo,
            jobs=jobs,
            launcher=cluster,
        )
    except (ConfigError, ValueError) as e:  # ValueError: bad --seeds, and LauncherError
        raise_usage(f"harness repro: {e}")
    except JobsFailed as e:
        raise_usage(f"harness repro: {e}", 1)
    except NonFiniteError as e:  # the exit codes of harness run
        raise_usage(f"harness repro: training stopped: {e}", 3)
    except SpecialTokenGradientError as e:
        raise_usage(f"harness repro: training stopped before the first update: {e}", 4)
    if outcomes is None:
        typer.echo("the jobs run on: this command again follows them, then writes the table")
        return
    command = " ".join(
        ["harness repro", spec.name, f"--seeds {seeds}"]
        + ([f"--scale {scale:g}"] if scale != 1 else [])
        + (["--micro"] if micro else [])
    )
    typer.echo(f"table → {write_outputs(spec, outcomes, out_dir, command)}")
