"""Sweeps on a real PostgreSQL server: the fixture starts a throwaway PostgreSQL (``initdb`` / ``pg_ctl`` as an
unprivileged user, a Unix socket in a temporary directory, password authentication) and the test runs two
``harness sweep`` processes against it — two workers on "machine A" and one on "machine B" (``--worker-offset``,
its own run directory) — then checks that the study holds exactly ``n_trials`` trials, none lost or duplicated,
and that the storage password appears in no file and no output."""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest

from harness.studies.sweep import load_resolved
from harness.studies.sweep.worker import device_groups, load_worker_study
from tests.conftest import ROOT
from tests.studies.test_sweep import _sweep

PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"
PG_USER = "harness"


def _pg_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl`` (Debian's layout, else the PATH)."""
    for d in sorted(glob.glob(PG_BIN_GLOB), reverse=True):
        if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists():
            return Path(d)
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("pg_ctl") else None


def _server_user() -> str | None:
    """PostgreSQL refuses to run as root: under root, the ``postgres`` (else ``nobody``) account runs it."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name).pw_name
        except KeyError:
            continue
    pytest.skip("running as root and neither a postgres nor a nobody account exists to run PostgreSQL")


@pytest.fixture(scope="module")
def postgres_url():
    """A fresh PostgreSQL server for this module; yields its URL (with a random password), stops and deletes it."""
    bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    pytest.importorskip("psycopg", reason="optuna's RDB storage on PostgreSQL needs psycopg[binary]")
    user = _server_user()
    # Not pytest's tmp_path: it is private to root, and the server's account must reach its directories.
    root = Path(tempfile.mkdtemp(prefix="harness-pg-"))
    os.chmod(root, 0o755)
    data, sock = root / "data", root / "sock"
    password = secrets.token_hex(12)
    pwfile = root / "pw"
    pwfile.write_text(password + "\n")
    for path in (data, sock):
        path.mkdir()
    if user:
        for path in (root, data, sock, pwfile):
            shutil.chown(path, user)
    os.chmod(pwfile, 0o600)

    def run(*args):
        return subprocess.run(args, user=user, check=True, capture_output=True, text=True, timeout=120)

    run(
        str(bin_dir / "initdb"),
        "-D",
        str(data),
        "-U",
        PG_USER,
        "--auth=scram-sha-256",
        f"--pwfile={pwfile}",
        "--no-sync",
    )
    port = "5432"  # a Unix socket only (listen_addresses empty), in a private directory: no clash with others
    run(
        str(bin_dir / "pg_ctl"),
        "-D",
        str(data),
        "-l",
        str(root / "server.log"),
        "-w",
        "-t",
        "60",
        "-o",
        f"-k {sock} -p {port} -c listen_addresses='' -c fsync=off",
        "start",
    )
    try:
        yield f"postgresql://{PG_USER}:{password}@/postgres?host={sock}&port={port}"
    finally:
        subprocess.run(
            [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"],
            user=user,
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


def _wait_for(path: Path, text: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise AssertionError(f"machine A exited early ({proc.returncode}):\n{path.read_text()[-3000:]}")
        time.sleep(0.5)
    raise AssertionError(f"no {text!r} in {path} after {timeout} s")


def test_gpus_are_dealt_in_consecutive_groups():
    assert device_groups([str(i) for i in range(8)], 2) == ["0,1,2,3", "4,5,6,7"]
    assert device_groups(["0", "1", "2", "3"], 4) == ["0", "1", "2", "3"]
    assert device_groups(["0", "1"], 3) == ["0", "1", "0"]  # fewer devices than workers: shared round-robin
    assert device_groups([], 2) == []


@pytest.mark.slow  # three worker processes train (~40 s); PostgreSQL stays in the default suite through
# tests/studies/test_launch_slurm.py (a SLURM sweep on a PostgreSQL study)
def test_two_machines_share_one_postgres_study(tmp_path, postgres_url, monkeypatch):
    n_trials = 4  # more than the three workers: one trial at least goes to whichever worker frees up first
    path = _sweep(tmp_path, "pg", study={"n_trials": n_trials})
    env = {**os.environ, "HARNESS_STORAGE": postgres_url, "PYTHONPATH": str(ROOT)}
    password = postgres_url.split(":")[2].split("@")[0]
    out_a, out_b = tmp_path / "machine_a", tmp_path / "machine_b"
    log_a, log_b = tmp_path / "a.txt", tmp_path / "b.txt"
    command = [sys.executable, "-m", "harness", "sweep", str(path)]
    with open(log_a, "w") as fa, open(log_b, "w") as fb:
        a = subprocess.Popen(
            command + ["--workers", "2", "--out", str(out_a)], cwd=ROOT, env=env, stdout=fa, stderr=subprocess.STDOUT
        )
        # B starts once A has created the study and pretrained the shared base model (both use one cache).
        _wait_for(log_a, "workers started", a)
        b = subprocess.Popen(
            command + ["--workers", "1", "--worker-offset", "2", "--out", str(out_b)],
            cwd=ROOT,
            env=env,
            stdout=fb,
            stderr=subprocess.STDOUT,
        )
        assert a.wait(timeout=900) == 0, log_a.read_text()[-4000:]
        assert b.wait(timeout=900) == 0, log_b.read_text()[-4000:]

    study = optuna.load_study(study_name="pg", storage=postgres_url)
    trials = study.get_trials()
    assert sorted(t.number for t in trials) == list(range(n_trials))  # the budget held across both machines
    assert {t.state.name for t in trials} == {"COMPLETE"}
    dirs = [Path(t.user_attrs["trial_dir"]) for t in trials]
    assert len(set(dirs)) == n_trials and all(d.is_dir() for d in dirs)  # each trial ran once, somewhere
    assert {d.parent.parent for d in dirs} <= {out_a.resolve(), out_b.resolve()}
    assert len({t.user_attrs["worker"] for t in trials}) >= 2
    # every trial ran to its end: its store exists in exactly one machine's directory
    for t in trials:
        found = [o for o in (out_a, out_b) if (o / "trials" / str(t.number) / "summary.json").exists()]
        assert len(found) == 1, (t.number, found)
    # a worker reads the study from the server named by HARNESS_STORAGE (no journal file anywhere)
    assert not (out_a / "journal.log").exists() and not (out_b / "journal.log").exists()
    monkeypatch.setenv("HARNESS_STORAGE", postgres_url)
    assert len(load_worker_study(load_resolved(out_b), out_b, 0).get_trials()) == n_trials

    outputs = log_a.read_text() + log_b.read_text()
    assert "postgresql://harness:***@" in outputs
    for out in (out_a, out_b):
        for f in out.rglob("*"):
            if f.is_file():
                assert password.encode() not in f.read_bytes(), f
    assert password not in outputs
