"""Fixtures of the study tests: a fake SLURM on PATH (:mod:`tests.studies.fake_slurm`) and a throwaway PostgreSQL
(``postgres_url``, defined beside its own tests)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.studies import fake_slurm
from tests.studies.test_sweep_postgres import postgres_url  # noqa: F401 — the fixture: a throwaway PostgreSQL


class FakeSlurm:
    """The fake cluster's state, as the tests read it."""

    def __init__(self, state: Path):
        self.state = state

    def calls(self, command: str | None = None) -> list[list[str]]:
        path = self.state / "calls.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [c["args"] for c in lines if command is None or c["command"] == command]

    def script(self, job_id: str) -> str:
        return (self.state / "scripts" / f"{job_id}.sh").read_text()

    def job(self, key: str) -> dict:
        path = self.state / "jobs" / f"{key}.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def env(self, key: str, attempt: int = 0) -> dict:
        return json.loads((self.state / "env" / f"{key}.{attempt}.json").read_text())

    def wait_state(self, key: str, state: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.job(key).get("state") != state:
            assert time.monotonic() < deadline, f"job {key} is {self.job(key)}, not {state}"
            time.sleep(0.2)

    def kill_all(self) -> None:
        """Whatever still runs when a test ends."""
        for path in (self.state / "jobs").glob("*.json"):
            job = json.loads(path.read_text())
            if job.get("state") in ("RUNNING", "PENDING") and "batch_pid" in job:
                try:
                    os.killpg(job["batch_pid"], signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


@pytest.fixture
def fake_slurm_cluster(tmp_path, monkeypatch):
    """sbatch, sacct, squeue, scancel, scontrol and srun on PATH, each running its job on this machine."""
    state, bin_dir = tmp_path / "fake-slurm", tmp_path / "fake-bin"
    fake_slurm.install(bin_dir, state)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_DIR", str(state))
    cluster = FakeSlurm(state)
    yield cluster
    cluster.kill_all()
