"""An experiment with ``plugins:`` through every launcher path (issue 51): a sweep whose files are read from another
directory (plug-in and data paths relative to the experiment file, not to where the command starts), the jobs a
launcher runs in fresh interpreters (``harness mixture --verify K --jobs N``, ``harness run --seeds --jobs N``, the
fake SLURM) and sweep workers. Each fresh process must import the experiment's plug-ins before a name is looked up.

The plug-in is the documented example (docs/extending/my_plugins.py: the ``count_letters`` recipe), copied into a
directory of the test's own beside a JSON-lines data file the experiment names by a relative path."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from harness.config import validate_data
from harness.core.store import read_metrics
from harness.studies.sweep import load_resolved, load_sweep
from harness.studies.sweep.study import prepare_study
from tests.conftest import ROOT, TINY, invoke, run_cli, write_yaml
from tests.core.test_plugins import _registries_restored  # noqa: F401 — autouse: each test's plug-ins forgotten after

SPACE = "stages.b.mixture"
TASKS = ["repeat", "yesno", "math"]
JOBS = ["--verify", "2", "--jobs", "2"]


@pytest.fixture
def lab(tmp_path) -> Path:
    """``lab/``: the plug-in file, a data file, an experiment training on both, and a sweep of it — every path in
    the files relative to ``lab/``. The test then works from ``elsewhere/``."""
    lab = tmp_path / "lab"
    (lab / "data").mkdir(parents=True)
    shutil.copy(ROOT / "docs" / "extending" / "my_plugins.py", lab / "my_plugins.py")
    rows = [{"q": f"What is {i} plus one?", "a": str(i + 1)} for i in range(40)]
    (lab / "data" / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    exp = copy.deepcopy(TINY)
    exp["plugins"] = ["my_plugins.py"]
    exp["tasks"]["letters"] = {"recipe": "count_letters", "train": 20, "eval": 4}
    exp["tasks"]["qa"] = {"recipe": "jsonl", "train": 20, "eval": 4, "params": {"path": "data/qa.jsonl"}}
    exp["tasks"]["qa"]["params"].update(prompt="q", answer="a")
    exp["eval"]["every"] = 2
    exp["stages"] = [
        {"name": "a", "steps": 2, "mixture": {"letters": 0.4, "qa": 0.3, "repeat": 0.3}},
        {"name": "b", "steps": 2, "mixture": {"repeat": 0.5, "yesno": 0.5}},
    ]
    write_yaml(lab / "tiny.yaml", exp)
    sweep = {
        "experiment": "tiny.yaml",
        "study": {"name": "plugged", "sampler": "random", "n_trials": 1, "seed": 0},
        "space": {SPACE: {"simplex": TASKS}},
        "objective": {"metric": "tf_first", "split": "heldout", "tasks": ["yesno", "math"], "reduce": "mean"},
    }
    write_yaml(lab / "sweep.yaml", sweep)
    (tmp_path / "elsewhere").mkdir()
    return lab


def _trained_on_the_plugin_and_the_data(run_dir: Path) -> None:
    store = read_metrics(run_dir)
    train = store.filter((store["metric"] == "loss") & (store["split"] == "train"))
    assert {"letters", "qa"} <= set(train["task"]), run_dir  # the plug-in recipe's and the data file's examples


def _synthetic_trials(sweep_dir: Path, n: int = 8) -> None:
    """``trials.parquet`` with ``n`` trials of noise (no law beats the mean: the proposal is the winner's mixture)."""
    rng = np.random.default_rng(5)
    weights, scores = rng.dirichlet(np.ones(len(TASKS)), size=n), rng.normal(0.5, 0.1, size=(n, 2))
    data = {"number": list(range(n)), "state": ["COMPLETE"] * n, "objective": scores.mean(axis=1)}
    data.update({f"param/{SPACE}.{t}": weights[:, i] for i, t in enumerate(TASKS)})
    data.update({f"metric/b/heldout/{t}/tf_first": scores[:, j] for j, t in enumerate(["yesno", "math"])})
    data["trial_dir"] = [f"trials/{i}" for i in range(n)]
    pl.DataFrame(data).write_parquet(sweep_dir / "trials.parquet")


def test_a_sweep_read_from_another_directory_resolves_plugins_and_data_against_its_experiment(lab, monkeypatch):
    monkeypatch.chdir(lab.parent / "elsewhere")
    sweep = load_sweep(Path("../lab/sweep.yaml"))  # today's cwd-relative plug-in path: "no plug-in file"
    assert sweep.base_raw["plugins"] == [str(lab / "my_plugins.py")]
    assert sweep.base_raw["tasks"]["qa"]["params"]["path"] == str(lab / "data" / "qa.jsonl")
    assert sweep.base.plugins == [str(lab / "my_plugins.py")]

    sweep_dir = lab.parent / "sweep"
    prepare_study(sweep, sweep_dir)  # what the workers read: the base experiment copied beside the resolved sweep
    monkeypatch.chdir(lab.parent)  # a worker started somewhere else again
    again = load_resolved(sweep_dir)
    trial = validate_data(again.experiment_raw({SPACE: dict.fromkeys(TASKS, 1 / 3)}, 0), "trial 0")
    assert trial.plugins == [str(lab / "my_plugins.py")]
    assert trial.tasks["qa"].params["path"] == str(lab / "data" / "qa.jsonl")


def test_mixture_verify_runs_plugin_experiments_in_spawned_jobs(lab, monkeypatch):
    """``harness mixture SWEEP_DIR --verify 2 --jobs 2``: the runs go to two spawned processes (the launcher path of
    ``harness repro --jobs`` and of every SLURM job: :class:`~harness.studies.launch.run_job.RunJob`), which train
    the plug-in's task; the sweep was read from another directory than the experiment's."""
    monkeypatch.chdir(lab.parent / "elsewhere")
    sweep_dir = lab.parent / "sweep"
    prepare_study(load_sweep(Path("../lab/sweep.yaml")), sweep_dir)
    _synthetic_trials(sweep_dir)
    monkeypatch.chdir(lab.parent)
    result = invoke("mixture", str(sweep_dir), "--bootstrap", "10", "--form", "constant", "--form", "scheffe", *JOBS)
    assert result.exit_code == 0, result.output
    report = json.loads((sweep_dir / "verify.json").read_text())
    runs = report["arms"]["winner"]["runs"]
    assert len(runs) == 2 and {run["how"] for run in runs.values()} == {"trained"}
    for run_dir in (sweep_dir / "verify").glob("*/seed-*"):
        _trained_on_the_plugin_and_the_data(run_dir)


@pytest.mark.slow  # four processes import torch: two replicates' harness run, the launch and its SLURM job (~30 s)
def test_plugin_replicates_run_as_subprocesses_and_as_slurm_jobs(lab, tmp_path, fake_slurm_cluster):
    pytest.importorskip("submitit")
    elsewhere, experiment = tmp_path / "elsewhere", "../lab/tiny.yaml"
    local = run_cli("run", experiment, "--seeds", "0,1", "--jobs", "2", "--out", str(tmp_path / "local"), cwd=elsewhere)
    assert local.returncode == 0, (local.stdout + local.stderr)[-3000:]
    slurm = ["run", experiment, "--seeds", "0", "--out", str(tmp_path / "slurm"), "--launcher", "slurm"]
    cluster = run_cli(*slurm, "--slurm", "poll=0.3", cwd=elsewhere)
    assert cluster.returncode == 0, (cluster.stdout + cluster.stderr)[-3000:]
    for run_dir in (tmp_path / "local" / "seed-0", tmp_path / "local" / "seed-1", tmp_path / "slurm" / "seed-0"):
        _trained_on_the_plugin_and_the_data(run_dir)


@pytest.mark.slow  # the sweep's worker process imports torch and trains (~15 s)
def test_a_plugin_sweep_launched_from_another_directory_runs_its_trials(lab, tmp_path):
    out = tmp_path / "sweep"
    result = run_cli("sweep", "../lab/sweep.yaml", "--workers", "1", "--out", str(out), cwd=tmp_path / "elsewhere")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    trials = pl.read_parquet(out / "trials.parquet")
    assert trials["state"].to_list() == ["COMPLETE"]
    _trained_on_the_plugin_and_the_data(out / trials["trial_dir"][0])
