"""The ``harness mixture SWEEP_DIR`` command, a plain function :mod:`harness.cli.app` registers: the mixing-law fits
of a finished sweep with their cross-validated errors, the chosen form, and the mixture it proposes inside the
explored convex hull with its predicted value and bootstrap interval, next to the sweep's in-sample winner
(:mod:`analysis.mixture_proposal`); ``proposal.json`` is written in the sweep directory. ``--verify K`` then trains
the proposal and the winner on K fresh seeds, here or through a launcher, and writes ``verify.json``
(:mod:`harness.studies.mixture_verify`). Nothing heavy is imported before the command runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from harness.cli.launching import DetachOption, LauncherOption, SlurmOption, choose_launcher, raise_usage


def mixture(
    sweep_dir: Path = typer.Argument(..., help="A sweep directory (trials.parquet, sweep.resolved.yaml)."),
    bootstrap: int = typer.Option(
        200, "--bootstrap", min=10, help="Resamples of the trials for the intervals (each refits the chosen form)."
    ),
    form: Optional[list[str]] = typer.Option(
        None,
        "--form",
        help="Forms to fit, repeatable: constant, scheffe, scheffe2, loglinear, gp (default all; constant is the "
        "reference a form must beat).",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap and of the search in the hull."),
    verify: Optional[int] = typer.Option(
        None,
        "--verify",
        help="Train the proposal and the in-sample winner on K fresh seeds (SWEEP_DIR/verify/) and compare them on "
        "the same held-out items; write SWEEP_DIR/verify.json.",
    ),
    budget: Optional[list[int]] = typer.Option(
        None,
        "--budget",
        help="With --verify: the budget curve, repeatable (--budget 4 --budget 8): the mixture proposed from the "
        "sweep's first k trials, trained on the same fresh seeds and compared with the full sweep's winner; write "
        "SWEEP_DIR/budget.json.",
    ),
    steer: Optional[list[str]] = typer.Option(
        None,
        "--steer",
        help="With --verify: train an adaptive method instead of a fixed mixture (one run per seed, from the uniform "
        "start; groupdro steers by the sweep's objective on a steering split), repeatable, and compare it with the "
        "winner on the same seeds; write SWEEP_DIR/steer.json.",
    ),
    jobs: int = typer.Option(1, "--jobs", min=1, help="With --verify: runs at once on this machine (processes)."),
    launcher: Optional[str] = LauncherOption,
    slurm: Optional[list[str]] = SlurmOption,
    detach: bool = DetachOption,
):
    """Fit mixing laws to a sweep's trials, choose one by cross-validated error and propose the mixture that
    optimises the sweep's objective inside the explored mixtures; write SWEEP_DIR/proposal.json."""
    from analysis.loading import AnalysisError, is_sweep_dir, load_sweep, read_sweep_config
    from analysis.mixing_laws import FORMS
    from analysis.mixture_proposal import PROPOSAL_NAME, budget_choice, budget_row, format_proposal, propose
    from harness.core.store import atomic_write_text

    if not is_sweep_dir(sweep_dir):
        raise_usage(f"harness mixture: {sweep_dir}: not a sweep directory (no trials.parquet)")
    choice = _verify_choice(sweep_dir, verify, jobs, launcher, slurm, detach)
    if budget and verify is None:
        raise_usage("harness mixture: --budget trains each budget's mixture: it needs --verify K")
    _check_steer(steer, verify)
    trials, config = load_sweep(sweep_dir), read_sweep_config(sweep_dir)
    too_many = [k for k in budget or [] if not 1 <= k < len(trials)]
    if too_many:
        raise_usage(
            f"harness mixture: --budget {too_many[0]}: a budget is fewer trials than the sweep's {len(trials)} (all "
            "of them is the full sweep's row)"
        )
    unknown = [f for f in form or [] if f not in FORMS]
    if unknown:
        raise_usage(f"harness mixture: --form {', '.join(unknown)}: use {', '.join(FORMS)}")
    options = {"forms": form or FORMS, "bootstrap": bootstrap, "seed": seed}
    try:
        proposal = propose(trials, config, **options, sweep_dir=str(sweep_dir))
    except AnalysisError as e:
        raise_usage(f"harness mixture: {e}")
    typer.echo(format_proposal(proposal))
    out = Path(sweep_dir) / PROPOSAL_NAME
    atomic_write_text(out, json.dumps(proposal.to_json(), indent=2) + "\n")
    typer.echo(f"proposal → {out}")
    if verify is None:
        return
    rows = [budget_choice(trials, config, k, **options) for k in sorted(set(budget or []))]
    for row in rows:
        mixture = ", ".join(f"{t} {w:.3f}" for t, w in (row["mixture"] or {}).items()) or "nothing to train"
        typer.echo(f"first {row['k']} trials: {row['basis']} ({row['why']}) → {mixture}")
    if rows:
        rows.append(budget_row(proposal.to_json(), "all"))
    _verify(sweep_dir, proposal.to_json(), trials.to_dicts(), verify, jobs, choice, detach, rows, steer or [])


def _check_steer(steer: Optional[list[str]], verify: Optional[int]) -> None:
    """One line, exit 2, for --steer without --verify or with a method that is not a controller."""
    if not steer:
        return
    if verify is None:
        raise_usage("harness mixture: --steer trains each method on the fresh seeds: it needs --verify K")
    from harness.core.registry import MIXTURE_CONTROLLERS, suggest

    known = MIXTURE_CONTROLLERS.names()
    for method in steer:
        if method not in MIXTURE_CONTROLLERS:
            raise_usage(
                f"harness mixture: --steer {method}: unknown method{suggest(method, known)}; known: {', '.join(known)}"
            )


def _verify_choice(sweep_dir: Path, verify, jobs: int, launcher, slurm, detach: bool):
    """The launcher of ``--verify`` (None without it); one line, exit 2, for options that cannot be used."""
    if verify is None:
        if jobs > 1 or launcher or slurm or detach:
            raise_usage("harness mixture: --jobs, --launcher, --slurm and --detach launch the runs of --verify K")
        return None
    if verify < 1:
        raise_usage(f"harness mixture: --verify {verify}: give the number of fresh seeds, at least 1")
    from harness.config import ConfigError
    from harness.studies.sweep import load_resolved

    try:
        section = load_resolved(sweep_dir).spec.launcher
    except ConfigError as e:
        raise_usage(f"harness mixture: --verify needs the sweep's experiment: {e}")
    choice = choose_launcher(section, launcher, slurm)
    if choice.kind == "slurm" and jobs > 1:
        raise_usage(
            "harness mixture: --jobs is for this machine: on SLURM each run is a job (--slurm array_parallelism=N)"
        )
    if detach and choice.kind != "slurm":
        raise_usage("harness mixture: --detach leaves SLURM jobs running: it needs --launcher slurm")
    return choice


def _verify(
    sweep_dir: Path,
    proposal: dict,
    trials: list[dict],
    k: int,
    jobs: int,
    choice,
    detach: bool,
    rows: list[dict],
    steer: list[str],
) -> None:
    """Train both arms on ``k`` fresh seeds, print the comparison, write ``verify.json``; with budget ``rows``,
    train each row's mixture on the same seeds too and write ``budget.json``; with ``steer`` methods, each steered
    arm, and write ``steer.json``."""
    from harness.config import ConfigError
    from harness.studies.launch import JobsFailed, make_launcher
    from harness.studies.mixture_budget import BUDGET_NAME, format_budget, verify_budget
    from harness.studies.mixture_steer import STEER_NAME, format_steering, steering_plan, verify_steering
    from harness.studies.mixture_verify import VERIFY_DIR, VERIFY_NAME, format_verification, verify
    from harness.studies.sweep import load_resolved

    sweep = load_resolved(sweep_dir)
    folder = Path(sweep_dir) / VERIFY_DIR / "slurm"
    runs = make_launcher(
        choice, folder, jobs=jobs, echo=typer.echo, job_name=f"harness-verify-{sweep.name}", detach=detach
    )
    written = ", ".join(["verify.json"] + (["budget.json"] if rows else []) + (["steer.json"] if steer else []))
    try:
        plan = steering_plan(sweep, proposal, trials, steer, k) if steer else None  # refused now, before training
        report = verify(sweep, Path(sweep_dir), proposal, trials, k, runs, typer.echo)
        if report is not None:
            typer.echo(format_verification(report))
            typer.echo(f"verification → {Path(sweep_dir) / VERIFY_NAME}")
        # the budget's arms after the verification's two (reused here): verify.json is written even if one fails
        curve = (
            verify_budget(sweep, Path(sweep_dir), proposal, rows, trials, k, runs, typer.echo)
            if report and rows
            else None
        )
        steered = (
            verify_steering(sweep, Path(sweep_dir), proposal, plan, trials, runs, typer.echo)
            if report and steer
            else None
        )
    except (ConfigError, ValueError) as e:
        raise_usage(f"harness mixture --verify: {e}")
    except JobsFailed as e:
        raise_usage(f"harness mixture --verify: {e}", 1)
    if report is None or (rows and curve is None) or (steer and steered is None):
        typer.echo(f"the jobs run on: this command again follows them, then writes {written}")
        return
    if curve is not None:
        typer.echo(format_budget(curve))
        typer.echo(f"budget curve → {Path(sweep_dir) / BUDGET_NAME}")
    if steered is not None:
        typer.echo(format_steering(steered))
        typer.echo(f"steering → {Path(sweep_dir) / STEER_NAME}")
