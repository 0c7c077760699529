"""The ``harness mixture SWEEP_DIR`` command, a plain function :mod:`harness.cli.app` registers: the mixing-law fits
of a finished sweep with their cross-validated errors, the chosen form, and the mixture it proposes inside the
explored convex hull with its predicted value and bootstrap interval, next to the sweep's in-sample winner
(:mod:`analysis.mixture_proposal`); ``proposal.json`` is written in the sweep directory. Nothing heavy is imported
before the command runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from harness.cli.launching import raise_usage


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
):
    """Fit mixing laws to a sweep's trials, choose one by cross-validated error and propose the mixture that
    optimises the sweep's objective inside the explored mixtures; write SWEEP_DIR/proposal.json."""
    from analysis.loading import AnalysisError, is_sweep_dir, load_sweep, read_sweep_config
    from analysis.mixing_laws import FORMS
    from analysis.mixture_proposal import PROPOSAL_NAME, format_proposal, propose
    from harness.core.store import atomic_write_text

    if not is_sweep_dir(sweep_dir):
        raise_usage(f"harness mixture: {sweep_dir}: not a sweep directory (no trials.parquet)")
    unknown = [f for f in form or [] if f not in FORMS]
    if unknown:
        raise_usage(f"harness mixture: --form {', '.join(unknown)}: use {', '.join(FORMS)}")
    try:
        proposal = propose(
            load_sweep(sweep_dir),
            read_sweep_config(sweep_dir),
            forms=form or FORMS,
            bootstrap=bootstrap,
            seed=seed,
            sweep_dir=str(sweep_dir),
        )
    except AnalysisError as e:
        raise_usage(f"harness mixture: {e}")
    typer.echo(format_proposal(proposal))
    out = Path(sweep_dir) / PROPOSAL_NAME
    atomic_write_text(out, json.dumps(proposal.to_json(), indent=2) + "\n")
    typer.echo(f"proposal → {out}")
