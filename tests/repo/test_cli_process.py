"""The tests' ``run_cli`` (tests/cli_process.py): a process forked from the preloaded forkserver answers as a fresh
``python -m harness`` does, and a call whose environment may change what is read at import gets a fresh one."""

from __future__ import annotations

import os

from tests import cli_process
from tests.cli_process import fresh_process, harness_process, needs_fresh_interpreter
from tests.conftest import ROOT, TINY, write_yaml


def test_a_forked_process_answers_as_a_fresh_interpreter(tmp_path):
    bad = dict(TINY, train={**TINY["train"], "optim": {"lr": "fast"}})
    ok, refused = write_yaml(tmp_path / "ok.yaml", TINY), write_yaml(tmp_path / "bad.yaml", bad)
    env = {**os.environ, "HARNESS_CACHE": str(tmp_path / "cache")}
    codes = []
    for args in (["validate", str(ok)], ["validate", str(refused)], ["run", "missing.yaml"], ["no-such-command"]):
        forked, fresh = harness_process(args, tmp_path, env, timeout=300), fresh_process(args, tmp_path, env, 300)
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
        codes.append(forked.returncode)
    assert codes == [0, 2, 2, 2]  # valid; a bad value; a missing file; a usage error


def test_the_working_directory_and_environment_are_the_calls_own(tmp_path):
    write_yaml(tmp_path / "here.yaml", TINY)  # a relative path resolves against the call's cwd
    result = harness_process(["validate", "here.yaml"], tmp_path, {**os.environ}, timeout=300)
    assert result.returncode == 0, result.stderr


def test_only_variables_read_at_run_time_may_differ_from_the_forkservers():
    base = dict(cli_process._server_env or os.environ)  # what the forkserver starts (or started) with
    assert not needs_fresh_interpreter({**base, "HARNESS_CACHE": "/elsewhere", "WANDB_MODE": "disabled"})
    assert needs_fresh_interpreter({**base, "CXX": "/nonexistent/cc"})  # Inductor reads it at import
    threads = "2" if base.get("OMP_NUM_THREADS") == "1" else "1"
    assert needs_fresh_interpreter({**base, "OMP_NUM_THREADS": threads})  # OpenMP reads it when torch loads
    assert needs_fresh_interpreter({**base, "PYTHONPATH": str(ROOT / "nowhere")})  # sys.path is made at start-up
