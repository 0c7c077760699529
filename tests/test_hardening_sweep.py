"""Issue 17's sweep faults created end to end: a storage password (never shown or saved), a cut journal line (the
study stays usable), SIGTERM to the launcher (the workers stop too)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from harness.redact import STORAGE_ENV
from harness.sweep import load_resolved, load_sweep
from harness.sweep.worker import load_worker_study, run_sweep
from tests.conftest import ROOT, run_cli
from tests.test_sweep import _sweep

SECRET = "s3cr3tpw"
URL = f"postgresql://alice:{SECRET}@dbhost:5432/sweeps"


def _files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_storage_password_is_in_no_output_file_and_not_on_the_console(tmp_path, monkeypatch):
    import harness.sweep.study as study_module
    import harness.sweep.worker as worker_module
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
    status = run_cli("sweep-status", str(out))
    assert status.returncode == 0, status.stderr[-2000:]


def test_sigterm_to_the_launcher_stops_its_workers(tmp_path):
    path = _sweep(tmp_path, "term", steps=400, study={"n_trials": 2})
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "sweep", str(path), "--workers", "1", "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        worker_pid, deadline = None, time.time() + 240
        while worker_pid is None and time.time() < deadline:  # wait for a trial that is training
            time.sleep(0.3)
            if not (out / "sweep.resolved.yaml").exists():
                continue
            for t in load_worker_study(load_resolved(out), out, 0).get_trials(
                    states=(optuna.trial.TrialState.RUNNING,)):
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
