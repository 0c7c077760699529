"""`harness report` / `harness compare` on a real tiny run and a synthetic sweep, and both notebooks executed top to
bottom against them."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
from pathlib import Path

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

import analysis as A
from harness.cli.app import app
from tests.analysis.test_analysis import make_trials, write_sweep
from tests.conftest import ROOT, TINY, run_cli

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
NOTEBOOKS = ROOT / "analysis" / "notebooks"


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """The tiny experiment with three stages (the last restarts from the base weights) and the train split
    evaluated too: a real run directory in seconds."""
    from harness.config import validate_data
    from harness.runs.execution.runner import run_experiment

    data = copy.deepcopy(TINY)
    data["eval"]["splits"] = ["heldout", "train"]
    data["stages"].append({"name": "c", "steps": 4, "init": "base", "mixture": {"math": 0.5, "yesno": 0.5}})
    out = tmp_path_factory.mktemp("tiny") / "run"
    run_experiment(validate_data(data), out)
    return out


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory, tiny_run) -> Path:
    """A synthetic sweep (the trials.parquet schema) whose trials all point at the tiny run."""
    return write_sweep(tmp_path_factory.mktemp("sweep") / "sweep", make_trials(24, noise=0.02, run_dir=tiny_run))


def check_report(out: Path, html_path: Path) -> str:
    """report.html references every PNG written next to it, embeds as many images, and every PNG is valid."""
    import matplotlib.image

    assert html_path == out / "report.html" and html_path.is_file()
    text = html_path.read_text(encoding="utf-8")
    pngs = sorted(out.glob("*.png"))
    assert pngs, "no figures written"
    for png in pngs:
        assert f'href="{png.name}"' in text, f"{png.name} is not referenced by report.html"
        assert png.read_bytes()[:8] == PNG_SIGNATURE
        image = matplotlib.image.imread(png)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert text.count('src="data:image/png;base64,') == len(pngs)
    assert "<script" not in text and not re.search(r'src="(?!data:)', text)  # self-contained
    return text


def test_report_cli_on_a_real_run(tiny_run, tmp_path):
    out = tmp_path / "report"
    result = run_cli("report", str(tiny_run), "--out", str(out), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "report.html" in result.stdout
    text = check_report(out, out / "report.html")
    for name in ("curves_greedy.png", "first_token.png", "training.png", "composition.png"):
        assert (out / name).is_file()
    for section in (
        "Findings",
        "Curriculum",
        "Stage-end table",
        "Curves",
        "First token",
        "Seesaw events",
        "Worst failures",
        "Training",
        "config.resolved.yaml",
    ):
        assert section in text
    # The stage table holds the stage-end values of the store.
    table = A.stage_table(A.load_run(tiny_run), "greedy", "heldout")
    assert table["stage"].to_list() == ["a", "b", "c"]
    # The events the analysis finds are the ones the run found itself.
    summary = json.loads((tiny_run / "summary.json").read_text())
    delta = A.read_config(tiny_run)["eval"]["seesaw_delta"]
    assert A.seesaw_events(A.load_run(tiny_run), delta).drop("run_id").to_dicts() == summary["seesaw_events"]


def test_report_of_a_run_in_progress_and_errors(tiny_run, tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(tiny_run, partial, ignore=shutil.ignore_patterns("checkpoints", "wandb"))
    (partial / "summary.json").unlink()
    text = check_report(tmp_path / "r", A.write_report(partial, tmp_path / "r"))
    assert "has not finished" in text
    result = CliRunner().invoke(app, ["report", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "neither a run directory" in result.output


def test_the_report_counts_every_family_of_the_runs_events_as_the_console_does(tiny_run, tmp_path):
    """A run whose events include one of the task against the forgetting probe's reference text (stored as the run
    stores it: in summary.json and as a ``seesaw`` row): the report's findings count it and name its family, as the
    console's line does, and its events table is the run's list."""
    from analysis.report.run_data import load_run_data
    from analysis.report.run_findings import findings
    from harness.core.seesaw_families import REF_FAMILY, describe_counts
    from harness.runs.execution.console import _seesaw_header

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("checkpoints", "wandb"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["seesaw"]["test"] == "paired"
    event = {"metric": REF_FAMILY, "split": REF_FAMILY, "step_from": 4, "step_to": 8, "stage_from": "b",
             "stage_to": "b", "rose": "yesno/heldout", "rose_by": 0.5, "fell": "ref:world", "fell_by": 0.3,
             "p_value": 0.001, "test": "permutation"}  # fmt: skip
    summary["seesaw_events"].append(event)
    (run / "summary.json").write_text(json.dumps(summary))
    frame = pl.read_parquet(run / "metrics.parquet")
    marker = frame.filter(pl.col("metric") == "seesaw_tests")
    stored = marker.with_columns(
        pl.lit("seesaw").alias("metric"),
        pl.lit(event["rose"]).alias("task"),
        pl.lit(event["split"]).alias("split"),
        pl.lit(event["rose_by"]).alias("value"),
        pl.lit(json.dumps(event)).alias("text"),
    )
    pl.concat([frame, stored.select(frame.columns)]).write_parquet(run / "metrics.parquet")

    report = load_run_data(run, "greedy", None)
    found = " ".join(findings(report))
    n, counts = len(summary["seesaw_events"]), describe_counts(summary["seesaw_events"])
    assert "No seesaw events" not in found
    assert f"{n} seesaw event{'s' if n > 1 else ''}</b> at δ" in found and counts in found
    assert "task–reference text, step 4 → 8: ↑ yesno/heldout ↓ ref:world" in found
    assert counts in _seesaw_header(summary) and "task–reference text" in counts  # the console says the same
    assert report.events.drop("run_id").to_dicts() == summary["seesaw_events"]  # one list: the run's own


def test_compare_cli(tiny_run, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(tiny_run, other, ignore=shutil.ignore_patterns("checkpoints", "wandb"))
    frame = pl.read_parquet(other / "metrics.parquet")
    bumped = frame.with_columns(
        pl.when((pl.col("metric") == "greedy") & (pl.col("task") == "yesno") & (pl.col("stage") == "c"))
        .then(pl.col("value") + 0.25)
        .otherwise(pl.col("value"))
        .alias("value"),
        pl.lit("other-run").alias("run_id"),
    )
    bumped.write_parquet(other / "metrics.parquet")
    result = CliRunner().invoke(app, ["compare", str(tiny_run), str(other), "--metric", "greedy", "--split", "heldout"])
    assert result.exit_code == 0, result.output
    assert "greedy · heldout" in result.output and "other-run" in result.output
    yesno = next(line for line in result.output.splitlines() if line.strip().startswith("yesno"))
    assert yesno.rstrip().endswith("(+0.250) ▲") and yesno.count("(+0.000)") == 2


def test_sweep_report(sweep_dir, tmp_path):
    out = tmp_path / "sweep-report"
    text = check_report(out, A.write_report(sweep_dir, out))
    for name in ("interference.png", "partial_dependence.png", "pareto.png", "history.png", "best_trial_curves.png"):
        assert (out / name).is_file(), name
    for section in (
        "Best trials",
        "Interference",
        "Pareto front",
        "Failed and pruned trials",
        "good fit",
        "Predicted best mixture",
        "non-finite loss at step 12",
    ):
        assert section in text


def test_sweep_report_two_objectives(tmp_path, tiny_run):
    """A multi-objective study: the Pareto front is drawn over its objectives, each in its direction."""
    trials = make_trials(16, run_dir=tiny_run)
    trials = trials.rename({"objective": "objective_0"}).with_columns(
        pl.col("metric/mix/heldout/assistant_qa/ft_hijack").alias("objective_1")
    )
    sweep = write_sweep(tmp_path / "multi", trials)
    config = yaml.safe_load((sweep / "sweep.resolved.yaml").read_text())
    config["objectives"] = [
        config.pop("objective"),
        {"metric": "ft_hijack", "split": "heldout", "tasks": ["assistant_qa"], "direction": "minimize"},
    ]
    (sweep / "sweep.resolved.yaml").write_text(yaml.safe_dump(config))
    text = check_report(tmp_path / "r", A.write_report(sweep, tmp_path / "r"))
    assert "The study&#x27;s first two objectives" in text or "The study's first two objectives" in text
    front = A.pareto(
        trials, ["objective_0", "objective_1"], A.objective_directions(config, ["objective_0", "objective_1"])
    )
    for number in front.filter(pl.col("pareto"))["number"].to_list():
        assert f"#{number}" in text or f">{number}<" in text


@pytest.mark.parametrize("name, variable", [("seesaw", "HARNESS_RUN_DIR"), ("sweep", "HARNESS_SWEEP_DIR")])
def test_notebook_executes(name, variable, tiny_run, sweep_dir, monkeypatch):
    import nbclient
    import nbformat

    monkeypatch.setenv(variable, str(tiny_run if name == "seesaw" else sweep_dir))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit notebooks without outputs"
    first_code = next(c for c in nb.cells if c.cell_type == "code")
    assert variable in first_code.source  # the directory comes from one variable at the top
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()
    figures = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(figures) >= 3
