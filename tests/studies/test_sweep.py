"""Optuna sweeps: the sweep file, simplex sampling, trial states (COMPLETE / FAIL / PRUNED), parallel workers on one
journal storage, multi-objective Pareto fronts, and a worker killed mid-trial."""

from __future__ import annotations

import copy
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import polars as pl
import pytest
import yaml

from harness.config import ConfigError
from harness.studies.sweep import journal_lock, load_resolved, load_sweep, simplex_weights
from harness.studies.sweep.heartbeat import HEARTBEAT_ATTR, fail_stale_trials
from harness.studies.sweep.results import status_text
from harness.studies.sweep.worker import load_worker_study, run_sweep
from tests.conftest import ROOT, TINY, run_cli, write_yaml


def _experiment(tmp_path: Path, steps: int = 2) -> Path:
    exp = copy.deepcopy(TINY)
    exp["tasks"]["yesno"]["train"] = 80  # unequal pools: the natural seed trial differs from the uniform one
    exp["eval"]["every"] = 2
    for stage in exp["stages"]:
        stage["steps"] = steps
    return write_yaml(tmp_path / "tiny.yaml", exp)


def _sweep(tmp_path: Path, name: str, steps: int = 2, **fields) -> Path:
    _experiment(tmp_path, steps)
    data = {
        "experiment": "tiny.yaml",
        "study": {"name": name, "sampler": "random", "n_trials": 2, "seed": 0},
        "space": {"stages.b.mixture": {"simplex": ["repeat", "yesno", "math"]}},
        "objective": {"metric": "tf_first", "split": "heldout", "tasks": ["yesno", "math"], "reduce": "min"},
    }
    for key, value in fields.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict) and key != "space":
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return write_yaml(tmp_path / f"{name}.yaml", data)


def _study(sweep_dir: Path):
    return load_worker_study(load_resolved(sweep_dir), sweep_dir, 0)


# ----------------------------------------------------------------------------------------------------------------
# Pure parts
# ----------------------------------------------------------------------------------------------------------------


def test_simplex_weights_are_a_distribution():
    import random

    rng = random.Random(0)
    for n in (2, 3, 6):
        for _ in range(200):
            w = simplex_weights([rng.random() for _ in range(n)])
            assert all(x >= 0 for x in w) and math.isclose(sum(w), 1.0)
    assert simplex_weights([1.0, 1.0]) == [0.5, 0.5]  # every x = 0: uniform, not a division by zero
    assert simplex_weights([0.0, 0.5])[0] > 0.99  # u = 0 is clipped (x large but finite), not an error


def test_invalid_sweep_file_exits_2_naming_each_path(tmp_path):
    path = _sweep(
        tmp_path,
        "bad",
        study={"sampler": "tpee"},
        space={
            "stages.b.mixture": {"simplex": ["repeat", "yesno"]},
            "train.optim.lrr": {"float": [1e-4, 1e-2], "lg": True},
        },
    )
    result = run_cli("sweep", str(path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert "study.sampler: unknown value 'tpee' (did you mean 'tpe'?)" in err
    assert "space.train.optim.lrr.lg: unknown key 'lg' (did you mean 'log'?)" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "journal.log").exists()


def test_semantic_errors_name_paths_with_suggestions(tmp_path):
    path = _sweep(
        tmp_path,
        "sem",
        space={
            "stages.bb.mixture": {"simplex": ["repeat", "yesno"]},
            "stages.a.mixture": {"simplex": ["repeat", "yesnoo"]},
            "train.optim.lrr": {"float": [1e-4, 1e-2], "log": True},
            "train.batch_size": {"int": [0, 4]},
        },
        objective={"metric": "greedyy", "split": "heldout", "tasks": ["yesno"], "stage": "c"},
    )
    with pytest.raises(ConfigError) as e:
        load_sweep(path)
    errors = dict(e.value.errors)
    assert "did you mean 'b'" in errors["space.stages.bb.mixture"]
    assert "unknown task 'yesnoo' (did you mean 'yesno'?)" in errors["space.stages.a.mixture.simplex[1]"]
    assert "unknown key 'lrr' (did you mean 'lr'?)" in errors["space.train.optim.lrr"]
    assert "with 0" in errors["space.train.batch_size"]
    assert "did you mean 'greedy'" in errors["objective.metric"]
    assert "unknown stage 'c'" in errors["objective.stage"]


@pytest.mark.parametrize("name", [".", ".."])
def test_study_names_dot_and_dotdot_are_rejected(tmp_path, name):
    """runs/sweeps/<name>: "." would be runs/sweeps itself, ".." would be runs/."""
    path = _sweep(tmp_path, "dots")
    raw = yaml.safe_load(path.read_text())
    raw["study"]["name"] = name
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as e:
        load_sweep(path)
    assert dict(e.value.errors)["study.name"].startswith(f"study name {name!r} is not allowed")
    del raw["study"]["name"]  # the default, the file's stem: "...yaml" has the stem ".."
    stem = tmp_path / "...yaml"
    stem.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as e:
        load_sweep(stem)
    assert "study name '..' is not allowed" in dict(e.value.errors)["study.name"]
    assert "set study.name" in dict(e.value.errors)["study.name"]
    raw["study"]["name"] = "v1.2..x"  # dots inside a name are fine
    path.write_text(yaml.safe_dump(raw))
    assert load_sweep(path).name == "v1.2..x"


# ----------------------------------------------------------------------------------------------------------------
# Trials
# ----------------------------------------------------------------------------------------------------------------


def test_two_workers_share_one_journal_and_weights_reach_the_runs(tmp_path):
    path = _sweep(tmp_path, "par", study={"n_trials": 3})  # the two seed trials, then one the sampler draws
    out = tmp_path / "out"
    result = run_cli("sweep", str(path), "--workers", "2", "--out", str(out))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "best trials" in result.stdout

    study = _study(out)
    trials = study.get_trials()
    assert sorted(t.number for t in trials) == [0, 1, 2]
    assert {t.state.name for t in trials} == {"COMPLETE"}
    assert sorted(p.name for p in (out / "workers").iterdir()) == ["0.log", "1.log"]
    frame = pl.read_parquet(out / "trials.parquet")
    assert frame.height == 3 and sorted(frame["number"].to_list()) == [0, 1, 2]
    assert {"number", "state", "objective", "duration_s", "trial_dir", "fail_reason", "pruned_step"} <= set(
        frame.columns
    )
    assert "metric/b/heldout/yesno/tf_first" in frame.columns

    tasks = ["repeat", "yesno", "math"]
    for t in trials:
        weights = {task: t.user_attrs[f"stages.b.mixture.{task}"] for task in tasks}
        assert all(w >= 0 for w in weights.values()) and math.isclose(sum(weights.values()), 1.0)
        resolved = yaml.safe_load((Path(t.user_attrs["trial_dir"]) / "config.resolved.yaml").read_text())
        assert resolved["stages"][1]["mixture"] == {"weights": pytest.approx(weights)}
        assert resolved["tracking"]["wandb"]["group"] == "par"
        row = frame.filter(pl.col("number") == t.number).row(0, named=True)
        assert row["param/stages.b.mixture.yesno"] == pytest.approx(weights["yesno"])
        assert row["objective"] == pytest.approx(t.value)
    # Seed trials first: uniform weights, then the natural distribution (∝ pool sizes 40, 80, 40).
    by_number = {t.number: t for t in trials}
    assert by_number[0].user_attrs["stages.b.mixture.yesno"] == pytest.approx(1 / 3)
    assert by_number[1].user_attrs["stages.b.mixture.yesno"] == pytest.approx(0.5)

    status = run_cli("sweep-status", str(out))
    assert status.returncode == 0, status.stderr
    assert "best trials" in status.stdout and "trial 0" in status.stdout


def test_failed_trial_is_recorded_and_the_study_goes_on(tmp_path):
    path = _sweep(
        tmp_path,
        "fail",
        space={"stages.b.mixture": {"simplex": ["repeat", "yesno"]}, "train.max_length": {"choice": [256, 8]}},
        seed_trials=False,
    )
    sweep = load_sweep(path)
    out = tmp_path / "out"
    from harness.studies.sweep import prepare_study

    study = prepare_study(sweep, out)
    study.enqueue_trial({"train.max_length": 8})  # every example is longer than 8 tokens: a DataError
    study.enqueue_trial({"train.max_length": 256})
    run_sweep(sweep, out, in_process=True, echo=lambda m: None)

    trials = sorted(_study(out).get_trials(), key=lambda t: t.number)
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    assert "DataError" in trials[0].user_attrs["fail_reason"] and "max_length=8" in trials[0].user_attrs["fail_reason"]
    frame = pl.read_parquet(out / "trials.parquet").sort("number")
    assert frame["state"].to_list() == ["FAIL", "COMPLETE"]
    assert "max_length=8" in frame["fail_reason"][0] and frame["fail_reason"][1] is None
    assert frame["param/train.max_length"].to_list() == [8, 256]
    assert (Path(trials[0].user_attrs["trial_dir"]) / "error.txt").exists()


class _AlwaysPrune(optuna.pruners.BasePruner):
    def prune(self, study, trial) -> bool:
        return True


def test_pruned_trial_is_recorded_with_its_step(tmp_path, monkeypatch):
    import harness.studies.sweep.worker as worker

    monkeypatch.setattr(worker, "make_pruner", lambda sweep: _AlwaysPrune())
    path = _sweep(tmp_path, "prune", study={"n_trials": 1, "pruner": "median"}, seed_trials=False)
    out = tmp_path / "out"
    run_sweep(load_sweep(path), out, in_process=True, echo=lambda m: None)

    (trial,) = _study(out).get_trials()
    # Only stage b is swept, so the pruner first hears at b's first own evaluation (step 4), and stops it there.
    assert trial.state.name == "PRUNED" and trial.user_attrs["pruned_step"] == 4
    assert list(trial.intermediate_values) == [4]
    frame = pl.read_parquet(out / "trials.parquet")
    assert frame["state"].to_list() == ["PRUNED"] and frame["pruned_step"].to_list() == [4]
    assert frame["objective"][0] == pytest.approx(trial.intermediate_values[4])
    assert "pruning saved" in status_text(_study(out), load_resolved(out))


def test_multi_objective_study_gives_a_pareto_front(tmp_path):
    path = _sweep(
        tmp_path,
        "multi",
        study={"n_trials": 3, "sampler": "nsga2", "pruner": "hyperband"},
        objective=None,
        objectives=[
            {"metric": "tf_first", "split": "heldout", "tasks": ["yesno"]},
            {"metric": "eval_loss", "split": "heldout", "tasks": ["math"]},
        ],
    )
    sweep = load_sweep(path)
    assert sweep.directions == ["maximize", "minimize"]
    assert any("pruner: hyperband is turned off" in note for note in sweep.notes)
    out = tmp_path / "out"
    run_sweep(sweep, out, in_process=True, echo=lambda m: None)

    study = _study(out)
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(complete) == 3
    front = study.best_trials
    assert front

    def dominates(a, b):
        return a.values[0] >= b.values[0] and a.values[1] <= b.values[1] and a.values != b.values

    assert not any(dominates(t, f) for t in complete for f in front)
    frame = pl.read_parquet(out / "trials.parquet")
    assert {"objective_0", "objective_1"} <= set(frame.columns) and "objective" not in frame.columns
    assert "Pareto front" in status_text(study, sweep)


def test_stale_trials_are_failed(tmp_path):
    path = _sweep(tmp_path, "stale")
    sweep = load_sweep(path)
    from harness.studies.sweep import prepare_study

    study = prepare_study(sweep, tmp_path / "out")
    old, fresh = study.ask(), study.ask()
    study._storage.set_trial_system_attr(old._trial_id, HEARTBEAT_ATTR, time.time() - 500)
    study._storage.set_trial_system_attr(fresh._trial_id, HEARTBEAT_ATTR, time.time())
    assert fail_stale_trials(study, grace=60) == [old.number]
    states = {t.number: t for t in study.get_trials()}
    assert states[old.number].state.name == "FAIL" and "no heartbeat" in states[old.number].user_attrs["fail_reason"]
    assert states[fresh.number].state.name == "RUNNING"


@pytest.mark.slow  # a worker killed mid-trial, then the sweep finished (~28 s); a killed lock holder and a cut
# journal line stay in the default suite (test_journal_lock_is_released_when_its_holder_is_killed, test_sweep_faults)
def test_killed_worker_leaves_the_study_consistent(tmp_path):
    # Long enough trials (several seconds each) that the poll below catches one mid-training on a fast machine.
    path = _sweep(tmp_path, "kill", steps=80, study={"n_trials": 3, "heartbeat": {"interval": 1, "grace": 30}})
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "sweep", str(path), "--workers", "2", "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ},
    )
    try:
        victim, deadline = None, time.time() + 240
        while victim is None and time.time() < deadline:  # a trial that is training (it has reported)
            time.sleep(0.2)
            if not (out / "sweep.resolved.yaml").exists():
                continue
            for t in _study(out).get_trials(states=(optuna.trial.TrialState.RUNNING,)):
                if t.intermediate_values and "worker" in t.user_attrs:
                    victim = t
                    break
        assert victim is not None, "no trial started training"
        os.kill(int(victim.user_attrs["worker"].rsplit(":", 1)[1]), signal.SIGKILL)
        stdout, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stdout[-3000:]
    trials = _study(out).get_trials()
    assert len(trials) == 3
    # The trial the killed worker was running (the victim, unless it finished in the instant before the kill) is
    # FAIL with the reason; the other worker completed the rest of the budget.
    (failed,) = [t for t in trials if t.state.name == "FAIL"]
    assert failed.user_attrs["worker"] == victim.user_attrs["worker"]
    assert "killed by SIGKILL" in failed.user_attrs["fail_reason"]
    assert sum(t.state.name == "COMPLETE" for t in trials) == 2
    frame = pl.read_parquet(out / "trials.parquet")
    assert frame.height == 3 and set(frame["state"]) == {"FAIL", "COMPLETE"}


def test_journal_lock_is_released_when_its_holder_is_killed(tmp_path):
    # optuna's default symlink lock would block every other process for its 30 s grace period here.
    path = str(tmp_path / "journal.log")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom harness.studies.sweep import journal_lock\n"
            "journal_lock(sys.argv[1]).acquire()\nprint('held', flush=True)\ntime.sleep(600)",
            path,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        acquired = threading.Event()
        lock = journal_lock(path)
        waiter = threading.Thread(target=lambda: (lock.acquire(), lock.release(), acquired.set()), daemon=True)
        waiter.start()
        assert not acquired.wait(1.0), "the lock did not exclude: acquired while another process held it"
        holder.send_signal(signal.SIGKILL)
        assert acquired.wait(10.0), "the lock stayed held after its holder was killed"
    finally:
        holder.kill()
        holder.wait()


def test_fraction_and_named_stage_paths_apply_to_the_experiment(tmp_path):
    exp = copy.deepcopy(TINY)
    exp["stages"][1]["mixture"] = {"counts": {"repeat": 8, "math": 4}}
    exp["stages"][1].pop("steps")
    write_yaml(tmp_path / "tiny.yaml", exp)
    path = write_yaml(
        tmp_path / "dmt.yaml",
        {
            "experiment": "tiny.yaml",
            "space": {
                "stages.b.mixture.counts.math": {"fraction": [0.1, 1.0], "log": True},
                "stages[0].optim.lr": {"float": [1e-4, 1e-2], "log": True},
            },
            "objective": {"metric": "eval_loss", "tasks": ["math", "repeat"]},
        },
    )
    sweep = load_sweep(path)
    assert sweep.directions == ["minimize"] and sweep.first_swept_stage == 0
    raw = sweep.experiment_raw({"stages.b.mixture.counts.math": 0.5, "stages[0].optim.lr": 1e-3}, trial_number=7)
    assert raw["stages"][1]["mixture"]["counts"] == {"repeat": 8, "math": 20}  # half of the 40-example pool
    assert raw["stages"][0]["optim"]["lr"] == 1e-3
    assert raw["tracking"]["console"] is False and "trial:7" in raw["tracking"]["wandb"]["tags"]
    assert all(stage["checkpoint"] is False for stage in raw["stages"])
    from harness.config import validate_data

    assert validate_data(raw).resolved_stages()[1].steps == 7  # (8 + 20) / batch 4


@pytest.mark.parametrize("path", sorted((ROOT / "experiments" / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_sweep_file_loads_and_names_tasks_of_its_base(path):
    sweep = load_sweep(path)
    tasks = set(sweep.base.tasks)
    for objective in sweep.objectives:
        assert set(objective.tasks) <= tasks, (path.name, objective.tasks)
    for param in sweep.params:
        if param.kind == "simplex":
            assert set(param.spec.simplex) <= tasks, (path.name, param.spec.simplex)


def test_a_proxy_applies_after_the_overrides_and_never_shares_a_full_size_study(tmp_path):
    """``proxy:`` makes every trial a cheap stand-in; ``--set proxy=null`` is the full-size sweep of the same space,
    which must not continue the proxy study (their trials would be mixed in one law)."""
    from harness.studies.sweep.study import prepare_study

    path = _sweep(tmp_path, "px", overrides={"stages.b.steps": 6}, proxy={"stages.b.steps": 3, "tasks.math.eval": 8})
    proxy = load_sweep(path)
    assert proxy.base_raw["stages"][1]["steps"] == 3 and proxy.base_raw["tasks"]["math"]["eval"] == 8
    full = load_sweep(path, ["proxy=null"])
    assert full.base_raw["stages"][1]["steps"] == 6 and full.spec.proxy is None
    assert proxy.fingerprint() != full.fingerprint()
    prepare_study(proxy, tmp_path / "sweep")
    again = load_resolved(tmp_path / "sweep")  # what workers read: the proxy recorded, applied once more (same values)
    assert again.spec.proxy == proxy.spec.proxy and again.base_raw["stages"][1]["steps"] == 3
    with pytest.raises(ConfigError, match="another space, objectives or proxy"):
        prepare_study(full, tmp_path / "sweep")
    with pytest.raises(ConfigError, match=r"proxy\.stages\.zz\.steps"):
        load_sweep(_sweep(tmp_path, "bad", proxy={"stages.zz.steps": 3}))
    with pytest.raises(ConfigError, match=r"proxy\.stages\.b\.mixture\.math: also set by space\.stages\.b\.mixture"):
        load_sweep(_sweep(tmp_path, "swept", proxy={"stages.b.mixture.math": 1.0}))


def test_harness_mixture_says_which_trials_are_proxies(capsys):
    from harness.cli.mixture import _say_proxies

    proxy = {"proxy": {"stages.b.steps": 3, "eval.every": 100}}
    _say_proxies(proxy, {})
    _say_proxies({}, proxy)
    _say_proxies({}, None)
    assert capsys.readouterr().out.splitlines() == [
        "fitted on: proxy trials (stages.b.steps=3, eval.every=100)",
        "held out: full-size trials (no proxy)",
        "held out: proxy trials (stages.b.steps=3, eval.every=100)",
    ]
