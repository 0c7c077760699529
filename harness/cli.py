"""The ``harness`` command line: validate, run, eval, schema.

Exit codes: 0 success; 2 invalid experiment file or task data (every error printed with its YAML path, no
traceback); 1 anything else.
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
):
    """Train and evaluate an experiment."""
    from harness.runner import DataError, default_run_dir, run_experiment

    exp = _load(file, set_)
    run_dir = out or default_run_dir(exp)
    try:
        run_experiment(exp, run_dir)
    except DataError as e:
        _fail(f"{file}: {e}")


@app.command()
def schema():
    """Print the experiment JSON Schema (for editor completion and checking)."""
    from harness.config import Experiment

    typer.echo(json.dumps(Experiment.model_json_schema(), indent=2))


def main() -> None:
    app(prog_name="harness")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
