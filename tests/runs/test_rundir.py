"""Run directories: claimed once, locked for the run's life, refused when they hold another run's files."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.runs.execution.rundir import LOCK_FILE, RunDirError, claim_run_dir, unique_run_name

ROOT = Path(__file__).resolve().parents[2]

# A process that claims DIR, writes a file into it, says "claimed" and then waits (for the test to kill it).
HOLDER = textwrap.dedent("""
    import sys, time
    from harness.runs.execution.rundir import RunDirError, claim_run_dir
    try:
        claim = claim_run_dir(sys.argv[1], resume=False, force=False)
    except RunDirError as e:
        print("refused:", e, flush=True)
        sys.exit(2)
    open(sys.argv[1] + "/metrics.parquet", "w").write(sys.argv[2])
    print("claimed", flush=True)
    time.sleep(float(sys.argv[3]))
""")


def _holder(path: Path, tag: str, sleep: float = 60.0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), tag, str(sleep)], stdout=subprocess.PIPE, text=True, env=env
    )


def test_second_claimant_is_refused_naming_the_holder(tmp_path):
    run = tmp_path / "run"
    holder = _holder(run, "first")
    try:
        assert holder.stdout.readline().strip() == "claimed"
        with pytest.raises(RunDirError) as info:
            claim_run_dir(run, resume=True, force=False)  # even a resume may not share a live run's directory
        assert str(info.value) == f"run directory {run} is in use by pid {holder.pid}"
        with pytest.raises(RunDirError, match="in use by pid"):
            claim_run_dir(run, resume=False, force=True)
    finally:
        holder.kill()
        holder.wait()


def test_runs_started_at_once_on_one_directory_exactly_one_wins(tmp_path):
    run = tmp_path / "run"
    procs = [_holder(run, f"run{i}", sleep=3.0) for i in range(4)]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2, 2, 2], outputs
    winner = codes.index(0)
    assert (run / "metrics.parquet").read_text() == f"run{winner}"  # nothing of the losers was written
    for code, out in zip(codes, outputs):
        if code:
            # Refused either while the winner holds the lock, or after it exited (the directory is then not empty).
            assert re.match(
                rf"refused: run directory {re.escape(str(run))} (is in use by (pid \d+|another run)|is not empty)", out
            ), out


def test_non_empty_directory_refused_unless_resume_or_force(tmp_path):
    run = tmp_path / "run"
    with claim_run_dir(run, resume=False, force=False) as claim:
        assert claim.held and (run / LOCK_FILE).read_text().strip() == str(os.getpid())
        (run / "samples.jsonl").write_text("{}\n")
    assert not claim.held
    with pytest.raises(RunDirError) as info:
        claim_run_dir(run, resume=False, force=False)
    message = str(info.value)
    assert "\n" not in message and str(run) in message and "samples.jsonl" in message and "--resume" in message
    with claim_run_dir(run, resume=True, force=False):
        pass
    with claim_run_dir(run, resume=False, force=True):
        pass


def test_empty_existing_directory_and_only_a_stale_lock_file_are_claimable(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_FILE).write_text("999999\n")  # left by a run that died: no flock on it any more
    with claim_run_dir(run, resume=False, force=False):
        pass


def test_lock_released_when_the_holder_is_sigkilled(tmp_path):
    run = tmp_path / "run"
    holder = _holder(run, "killed")
    assert holder.stdout.readline().strip() == "claimed"
    with pytest.raises(RunDirError, match="in use"):
        claim_run_dir(run, resume=True, force=False)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with claim_run_dir(run, resume=True, force=False) as claim:
        assert claim.held
    with pytest.raises(RunDirError, match="not empty"):  # its files are still there: only resume/force may reuse it
        claim_run_dir(run, resume=False, force=False)


def test_unreadable_parent_is_a_one_line_error(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions")
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        with pytest.raises(RunDirError, match=r"run directory .*ro/run: cannot create it"):
            claim_run_dir(parent / "run", resume=False, force=False)
    finally:
        parent.chmod(0o700)


def test_unique_run_names_differ_within_one_second():
    names = {unique_run_name("tiny", now=1_700_000_000.0) for _ in range(200)}
    assert len(names) == 200
    assert all(re.fullmatch(r"tiny-\d{8}-\d{6}-[0-9a-f]{6}", n) for n in names)
