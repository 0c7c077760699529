"""One plan per run (issue 51): the experiment is compiled once into a frozen :class:`RunPlan`, and below the planner
nothing takes the whole experiment — not a module of the layers under ``runs`` (training, evaluation, models, data),
and in ``runs.execution`` only the functions that claim a run directory and name the run around planning (listed
below, each with why). Read from the source (every parameter annotated ``Experiment`` or named ``exp``), and shown
failing on a planted function that takes one.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from harness.runs.planning.plan import RunPlan
from tests.conftest import ROOT

BELOW_THE_PLANNER = ("harness/training", "harness/evaluation", "harness/models", "harness/data")
EXECUTION = "harness/runs/execution"
#: "module::function" of runs.execution that may take the experiment -> why (each claims or names a run; none executes)
OPENS_A_RUN = {
    "runner.py::new_run_id": "names a run by the experiment's name",
    "runner.py::default_run_dir": "places a run under the experiment's name",
    "runner.py::run_experiment": "the entry: claims the directory, then plans and executes",
    "runner.py::_run_claimed": "reopens the run or names a new one, calls the planner, then writes the run's files",
    "runner.py::run_files": "config.resolved.yaml and run.json: the resolved experiment and its name",
    "runner.py::open_run": "writes harness eval's run files (it plans nothing)",
    "runner.py::_reopen_run": "refuses to resume a run of another experiment",
    "runner.py::changed_sections": "compares the experiment with the one a run was started with",
    "checkpoint_eval.py::eval_output_dir": "places harness eval's directory under the experiment's name",
    "checkpoint_eval.py::evaluate_checkpoint": "the entry of harness eval (no training, so no stage plans)",
    "checkpoint_eval.py::_evaluate_claimed": "harness eval's body: task data and eval items for a checkpoint",
    "process_ranks.py::rank_session": "a distributed run's rank session, which runs the whole experiment",
}


def _takes_experiment(arg: ast.arg) -> bool:
    return arg.arg == "exp" or (arg.annotation is not None and "Experiment" in ast.unparse(arg.annotation))


def experiment_takers(root: Path, folder: str) -> set[str]:
    """``"module::function"`` (module relative to ``folder``) for every function under ``folder`` with a parameter
    that is the experiment."""
    found = set()
    for path in sorted((root / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                if any(_takes_experiment(a) for a in args.posonlyargs + args.args + args.kwonlyargs):
                    found.add(f"{path.relative_to(root / folder).as_posix()}::{node.name}")
    return found


def test_nothing_below_the_planner_takes_the_experiment():
    for folder in BELOW_THE_PLANNER:
        assert not experiment_takers(ROOT, folder), f"{folder} takes the whole experiment: pass its slice"
    unlisted = experiment_takers(ROOT, EXECUTION) - set(OPENS_A_RUN)
    assert not unlisted, f"runs.execution takes the experiment (read the RunPlan instead): {sorted(unlisted)}"
    stale = set(OPENS_A_RUN) - experiment_takers(ROOT, EXECUTION)
    assert not stale, f"listed but no longer taking the experiment (remove them): {sorted(stale)}"


def test_the_check_finds_a_planted_function_that_takes_the_experiment(tmp_path):
    folder = tmp_path / "harness" / "training"
    folder.mkdir(parents=True)
    (folder / "planted.py").write_text(
        "def step(model, exp: 'Experiment'):\n    pass\n\ndef ok(model, spec):\n    pass\n"
    )
    assert experiment_takers(tmp_path, "harness/training") == {"planted.py::step"}


def test_the_plan_is_frozen():
    plan = RunPlan(**{f.name: None for f in dataclasses.fields(RunPlan)})
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.stage_plans = ()
