"""Issue 17's sweep faults created end to end: a storage password (never shown or saved), a cut journal line (the
study stays usable), SIGTERM to the launcher (the workers stop too), a trial hung in a step (it goes stale)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
import yaml

from harness.core.redact import STORAGE_ENV
from harness.studies.sweep import load_resolved, load_sweep
from harness.studies.sweep.worker import load_worker_study, run_sweep
from tests.conftest import ROOT, run_cli
from tests.studies.test_sweep import _sweep

SECRET = "s3cr3tpw"
URL = f"postgresql://alice:{SECRET}@dbhost:5432/sweeps"


def _files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_storage_password_is_in_no_output_file_and_not_on_the_console(tmp_path, monkeypatch):
    import harness.studies.sweep.study as study_module
    import harness.studies.sweep.worker as worker_module
    from analysis.report import write_report

    opened: list[str] = []
    real_db = f"sqlite:///{tmp_path / 'stand-in.db'}"  # no PostgreSQL here: the URL opens a SQLite file instead

    def stand_in_storage(url: str):
        opened.append(url)
        return optuna.storages.RDBStorage(real_db)

    monkeypatch.setattr(study_module, "make_storage", stand_in_storage)
    monkeypatch.setattr(worker_module, "make_storage", stand_in_storage)
    # the trial budget's lock would open the PostgreSQL URL itself (an advisory lock): the sweep directory's flock
    real_lock = study_module.budget_lock
    monkeypatch.setattr(worker_module, "budget_lock", lambda sweep_dir, url, name: real_lock(sweep_dir, real_db, name))
    monkeypatch.delenv(STORAGE_ENV, raising=False)
    path = _sweep(tmp_path, "secret", study={"n_trials": 1, "storage": URL}, seed_trials=False)
    out = tmp_path / "out"
    console: list[str] = []
    run_sweep(load_sweep(path), out, in_process=True, echo=console.append)
    assert opened and set(opened) == {URL}  # the workers still reach the storage with its password
    assert STORAGE_ENV not in os.environ  # set for the in-process worker only
    write_report(out, None)
    assert (out / "trials.parquet").exists() and list(out.rglob("report.html"))
    assert _files_containing(out, SECRET) == []
    assert SECRET not in "\n".join(console)
    assert "alice:***@dbhost" in (out / "sweep.resolved.yaml").read_text()


def test_unreachable_password_storage_is_one_masked_line_exit_2(tmp_path):
    path = _sweep(tmp_path, "unreachable", study={"n_trials": 1, "storage": URL})
    result = run_cli("sweep", str(path), "--out", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert SECRET not in result.stdout + result.stderr and "Traceback" not in result.stderr
    assert "study.storage: cannot open postgresql://alice:***@dbhost:5432/sweeps" in result.stderr
    assert _files_containing(tmp_path / "out", SECRET) == []


def test_cut_journal_line_leaves_the_study_usable(tmp_path):
    path = _sweep(tmp_path, "cut", study={"n_trials": 2}, seed_trials=False)
    out = tmp_path / "out"
    sweep = load_sweep(path)
    run_sweep(sweep, out, in_process=True, echo=lambda m: None)
    journal = out / "journal.log"
    with open(journal, "ab") as f:  # a disk filled mid-append: half a record, no newline
        f.write(b'{"op_code": 5, "worker_id": "x", "trial_id": 0, "user_attr": {"ha')
    grown = load_sweep(path, ["study.n_trials=3"])
    with pytest.warns(UserWarning, match="unfinished last line"):
        run_sweep(grown, out, in_process=True, echo=lambda m: None)
    study = load_worker_study(load_resolved(out), out, 0)
    assert [t.state.name for t in study.get_trials()] == ["COMPLETE"] * 3
    # the continued launch samples afresh: its sampler does not replay the first launch's seeded proposals
    params = [t.params for t in study.get_trials()]
    assert params[2] not in params[:2]
    status = run_cli("sweep-status", str(out))
    assert status.returncode == 0, status.stderr[-2000:]


def test_pretraining_its_own_base_keeps_a_trial_alive(tiny, tmp_path, monkeypatch):
    from harness.config import load_experiment
    from harness.runs.planning.prepare import build_task_data, load_base
    from tests.conftest import write_yaml

    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))  # a cold base: it pretrains here
    exp = load_experiment(write_yaml(tmp_path / "x.yaml", tiny), [])
    pulses = []
    load_base(exp, build_task_data(exp), None, on_progress=lambda: pulses.append(1))
    assert len(pulses) == tiny["model"]["pretrain"]["steps"], "one heartbeat chance per pretraining step"


def test_sampler_seeds_of_a_new_and_a_continued_launch():
    from harness.studies.sweep.study import sampler_seed

    assert [sampler_seed(7, i) for i in range(3)] == [7, 8, 9]  # a new sweep: as documented, reproducible
    continued = {sampler_seed(7, i, launch) for i in range(3) for launch in (1, 2, 5)}
    assert len(continued) == 9 and not continued & {7, 8, 9}
    assert sampler_seed(7, 0, 2) == sampler_seed(7, 0, 2)


def test_sigterm_to_the_launcher_stops_its_workers(tmp_path):
    path = _sweep(tmp_path, "term", steps=400, study={"n_trials": 2})
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "sweep", str(path), "--workers", "1", "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        worker_pid, deadline = None, time.time() + 240
        while worker_pid is None and time.time() < deadline:  # wait for a trial that is training
            time.sleep(0.3)
            if not (out / "sweep.resolved.yaml").exists():
                continue
            for t in load_worker_study(load_resolved(out), out, 0).get_trials(
                states=(optuna.trial.TrialState.RUNNING,)
            ):
                if "worker" in t.user_attrs:
                    worker_pid = int(t.user_attrs["worker"].rsplit(":", 1)[1])
        assert worker_pid is not None, "no trial started"
        time.sleep(3)  # into its 800 steps
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
        if worker_pid is not None:  # never leave a stray worker behind when the test fails
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker_pid, signal.SIGKILL)
    assert proc.returncode != 0 and "interrupted: stopping the workers" in stdout, stdout[-3000:]
    with pytest.raises(ProcessLookupError):
        os.kill(worker_pid, 0)  # the worker is gone (reaped by the launcher)
    (trial,) = [t for t in load_worker_study(load_resolved(out), out, 0).get_trials() if t.state.name != "WAITING"]
    assert trial.state.name == "FAIL"


class _Storage:
    """Records heartbeat writes (a stand-in for an optuna storage)."""

    def __init__(self):
        self.writes = []

    def set_trial_system_attr(self, trial_id, key, value):
        self.writes.append((trial_id, key))


def test_heartbeat_pulses_are_rate_limited_to_one_write_per_interval():
    from harness.studies.sweep.heartbeat import HEARTBEAT_ATTR, Heartbeat

    now = [100.0]
    storage = _Storage()
    with Heartbeat(storage, 7, interval=15, clock=lambda: now[0]) as heartbeat:
        assert storage.writes == [(7, HEARTBEAT_ATTR)]  # the trial is alive from its start
        for _ in range(50):  # 50 steps in 10 s: no write
            now[0] += 0.2
            heartbeat.pulse()
        assert len(storage.writes) == 1
        now[0] += 5.0  # 15 s since the last write
        heartbeat.pulse()
        heartbeat.pulse()
        assert len(storage.writes) == 2


@pytest.mark.parametrize("hangs", [True, False])
def test_a_trial_hung_in_a_step_goes_stale_and_a_progressing_one_does_not(tmp_path, monkeypatch, hangs):
    """The heartbeat comes from the run's progress: a step that never returns (monkeypatched) leaves the trial's
    heartbeat to age past ``grace`` (a timer thread would keep it fresh); steps that keep finishing keep it fresh."""
    import harness.training.loop as train
    from harness.studies.sweep import prepare_study
    from harness.studies.sweep.heartbeat import fail_stale_trials
    from harness.studies.sweep.worker import run_trial

    grace = 6.0  # longer than a tiny stage-edge evaluation on a loaded machine; shorter than the progressing part
    path = _sweep(tmp_path, "hang", steps=20, study={"n_trials": 1, "heartbeat": {"interval": 0.2, "grace": grace}})
    experiment = yaml.safe_load((tmp_path / "tiny.yaml").read_text())
    experiment["eval"]["every"] = 1000  # evaluations at the stage edges only
    experiment["train"]["stage_cache"] = False  # every step trains (a cached stage would not call the patch)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(experiment))
    sweep = load_sweep(path)
    study = prepare_study(sweep, tmp_path / "out")
    trial = study.ask()
    real, steps, reached, release = train.batch_loss, [0], threading.Event(), threading.Event()

    def step(model, batch, *args, **kwargs):
        if batch.tasks[0] != "pretrain":  # the tiny base may be pretrained here first
            steps[0] += 1
            if steps[0] == 5:
                reached.set()
                if hangs:
                    release.wait(120)  # the hung step
            time.sleep(0.25)  # ~9 s of steady progress after the fifth step: longer than grace
        return real(model, batch, *args, **kwargs)

    monkeypatch.setattr(train, "batch_loss", step)
    outcome = {}
    worker = threading.Thread(target=lambda: outcome.update(state=run_trial(study, trial, sweep, tmp_path / "out")))
    worker.start()
    try:
        assert reached.wait(300), "the trial never reached its fifth step"
        hung_at, failed = time.time(), []
        while worker.is_alive() and not failed and time.time() - hung_at < 60:
            failed = fail_stale_trials(study, grace)
            time.sleep(0.1)
        if hangs:
            assert failed == [trial.number] and time.time() - hung_at >= grace - 0.3
        else:
            assert failed == [] and steps[0] == 40
    finally:
        release.set()
        worker.join(300)
    final = study._storage.get_trial(trial._trial_id)
    if hangs:
        assert outcome["state"] == "FAIL" and final.state.name == "FAIL"
        assert "no heartbeat" in final.user_attrs["fail_reason"] and "hung" in final.user_attrs["fail_reason"]
    else:
        assert outcome["state"] == final.state.name == "COMPLETE"
