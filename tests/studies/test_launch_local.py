"""The cluster launcher on submitit's local executor (real subprocesses, real pickling of the calls and of their
results, the same job code as on SLURM): seed replicates as jobs, a failing job, and a job stopped by submitit's
signal that requeues itself and resumes its run from the resume point."""

from __future__ import annotations

import json
import operator
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from harness.config import validate_data
from harness.studies.launch import JobsFailed, LauncherSpec, Task
from harness.studies.launch.run_job import RunJob
from harness.studies.replicates import run_group

pytest.importorskip("submitit")

from harness.studies.launch.cluster import SubmititLauncher  # noqa: E402 — needs submitit


def _launcher(folder: Path, lines: list) -> SubmititLauncher:
    spec = LauncherSpec(kind="slurm", poll=0.1, max_requeues=1)
    return SubmititLauncher(spec, folder, echo=lines.append, job_name="harness-test", cluster="local")


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def test_replicates_and_a_failing_task_run_as_pickled_local_jobs(tmp_path, tiny):
    lines: list[str] = []
    exp = validate_data(tiny, "tiny")
    codes = run_group(exp, tmp_path / "group", [0, 1], echo=lines.append, launcher=_launcher(tmp_path / "jobs", lines))
    assert codes == {0: 0, 1: 0}
    for seed in (0, 1):
        assert (tmp_path / "group" / f"seed-{seed}" / "summary.json").is_file()
    assert json.loads((tmp_path / "group" / "group.json").read_text())["status"] == {"0": "done", "1": "done"}
    assert any(line.startswith("submitted 2 jobs") for line in lines)

    with pytest.raises(JobsFailed, match=r"job \d+ \(broken\): ZeroDivisionError: division by zero"):
        _launcher(tmp_path / "jobs2", lines).run([Task("broken", operator.truediv, (1, 0))])
    assert any("failed: ZeroDivisionError" in line and "| ZeroDivisionError" in line for line in lines)


def test_a_job_warned_by_its_signal_requeues_itself_and_resumes_its_run(tmp_path, tiny):
    # stage 0 long enough to be stopped after its first resume point (step 10) and well before its end; stage 1 short:
    # the resume is what is tested, not the second stage
    tiny["stages"][0]["steps"], tiny["stages"][1]["steps"] = 150, 2
    tiny["eval"]["every"] = 75
    tiny["train"].update(checkpoint_every=10, stage_cache=False)
    run_dir = tmp_path / "run"
    launcher = _launcher(tmp_path / "jobs", [])
    warned: list[int] = []

    def warn_once_a_resume_point_exists() -> None:
        points = run_dir / "checkpoints" / "resume"
        # a complete resume point: one being written is a hidden temporary directory until it is renamed into place
        # (warned on that, the first attempt stopped before it was complete, and the second started over: seen once
        # at OMP_NUM_THREADS=1, where the tiny run trains fast)
        if warned or not (points.is_dir() and any(p.name.startswith("step-") for p in points.iterdir())):
            return
        controller = int(json.loads((tmp_path / "jobs" / "jobs.json").read_text())["jobs"][0]["job_id"])
        for task in _children(controller):  # the job's process (the local executor's controller starts it)
            os.kill(task, signal.SIGUSR2)  # submitit's "stop soon" (time limit or preemption)
            warned.append(task)

    launcher.spec = launcher.spec.model_copy(update={"poll": 0.05})
    done = []
    launcher.run(
        [Task("run", RunJob(1), (validate_data(tiny, "tiny"), run_dir))],
        on_done=lambda task, value: done.append(value),
        tick=warn_once_a_resume_point_exists,
    )
    assert warned and done == [str(run_dir)]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"].startswith("step-")  # the second attempt continued from the resume point
    log = next((tmp_path / "jobs").glob("*_0_log.out")).read_text()
    assert f"attempt 2: resuming {run_dir}" in log


def test_a_failure_report_waits_for_the_traceback_printed_after_the_result(tmp_path):
    # submitit writes a failed job's result, then re-raises: the traceback reaches the log after the result does (under
    # load, after the launcher has read it: the report then lacked it). The tail waits for the traceback's last line.
    from types import SimpleNamespace

    from harness.studies.launch.cluster import settled_log_tail

    stderr = tmp_path / "job.err"
    stderr.write_text("progress 1\nprogress 2\n")
    job = SimpleNamespace(paths=SimpleNamespace(stderr=stderr, stdout=tmp_path / "job.out"))

    def print_traceback_late() -> None:
        time.sleep(0.5)
        with stderr.open("a") as log:
            log.write("Traceback (most recent call last):\nZeroDivisionError: division by zero\n")

    late = threading.Thread(target=print_traceback_late)
    late.start()
    tail = settled_log_tail(job, "ZeroDivisionError: division by zero", settle=10.0, poll=0.05)
    late.join()
    assert tail.splitlines()[-1] == "ZeroDivisionError: division by zero"
    started = time.monotonic()  # a line that never comes: the tail as it is, after the settle time
    assert settled_log_tail(job, "KeyError: 'x'", settle=0.3, poll=0.05).endswith("division by zero")
    assert 0.3 <= time.monotonic() - started < 5.0
