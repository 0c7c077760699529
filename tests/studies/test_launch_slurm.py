"""The SLURM launcher against a fake SLURM (:mod:`tests.studies.fake_slurm`: sbatch, sacct, scancel, scontrol and
srun on PATH, running each job here): the job script's directives, the environment each job gets, results handed
back, a failing job reported with its id and log tail, Ctrl-C cancelling exactly the submitted jobs, re-attaching
to jobs a stopped launch left running, and a preempted run requeued and resumed from its resume point."""

from __future__ import annotations

import json
import operator
import re
import subprocess
import sys
import time

import optuna
import pytest

from harness.studies.launch import JobsFailed, LauncherSpec, Task
from tests.conftest import ROOT, run_cli, write_yaml
from tests.studies.test_sweep import _sweep

pytest.importorskip("submitit")

from harness.studies.launch.cluster import JOBS_FILE, SubmititLauncher  # noqa: E402 — needs submitit

SECRET = "s3cr3t-pw"


def _launcher(tmp_path, lines: list, **fields) -> SubmititLauncher:
    spec = LauncherSpec.model_validate({"kind": "slurm", "poll": 0.3, **fields})
    return SubmititLauncher(spec, tmp_path / "jobs", echo=lines.append, job_name="harness-test")


def test_the_script_asks_for_what_the_spec_says_and_jobs_get_the_environment(tmp_path, fake_slurm_cluster):
    lines, values = [], {}
    launcher = _launcher(
        tmp_path,
        lines,
        partition="gpu",
        time="1:30:00",
        cpus_per_task=3,
        gpus_per_job=2,
        mem_gb=16,
        account="lab",
        sbatch={"qos": "high", "constraint": "a100"},
        setup=["export FROM_SETUP=1"],
    )
    launcher.env = {"HARNESS_STORAGE": f"postgresql://u:{SECRET}@db/x", "PYTHONUNBUFFERED": "1"}
    tasks = [Task("add", operator.add, (1, 2)), Task("mul", operator.mul, (3, 4))]
    assert launcher.run(tasks, on_done=lambda task, value: values.update({task.name: value}))
    assert values == {"add": 3, "mul": 12}

    [sbatch] = fake_slurm_cluster.calls("sbatch")
    script = fake_slurm_cluster.script("1000")
    for directive in (
        "--partition=gpu",
        "--time=90",
        "--cpus-per-task=3",
        "--gpus-per-node=2",
        "--mem=16GB",
        "--account=lab",
        "--array=0-1%2",  # one job array, both tasks at once
        "--requeue",
        "--signal=USR2@90",  # submitit's warning before the time limit: checkpoint, then requeue
        "--qos=high",
        "--constraint=a100",
        "--job-name=harness-test",
    ):
        assert re.search(rf"^#SBATCH {re.escape(directive)}$", script, re.M), (directive, script)
    assert "export FROM_SETUP=1" in script
    assert SECRET not in script  # the storage URL goes through the environment only
    env = fake_slurm_cluster.env("1000_1")
    assert env["HARNESS_STORAGE"] == f"postgresql://u:{SECRET}@db/x" and env["PYTHONUNBUFFERED"] == "1"
    assert env["SLURM_ARRAY_JOB_ID"] == "1000" and env["SLURM_ARRAY_TASK_ID"] == "1"
    assert env["SLURM_CPUS_PER_TASK"] == "3" and env["SUBMITIT_EXECUTOR"] == "slurm"
    for f in (tmp_path / "jobs").rglob("*"):
        if f.is_file():
            assert SECRET.encode() not in f.read_bytes(), f  # nor into a pickled call or a log
    assert "HARNESS_STORAGE" not in __import__("os").environ  # set only while the jobs were submitted
    assert any("submitted 2 jobs (1000_0, 1000_1)" in line for line in lines)


def test_a_failing_job_is_reported_with_its_id_and_log_tail(tmp_path, fake_slurm_cluster):
    lines, done = [], []
    launcher = _launcher(tmp_path, lines)
    tasks = [Task("fine", operator.add, (1, 1)), Task("broken", operator.truediv, (1, 0))]
    with pytest.raises(JobsFailed) as failed:
        launcher.run(tasks, on_done=lambda task, value: done.append(task.name))
    assert done == ["fine"]  # the other job ran to its end
    assert str(failed.value) == "1 job failed: job 1000_1 (broken): ZeroDivisionError: division by zero"
    report = next(line for line in lines if line.startswith("job 1000_1 (broken) failed"))
    assert "1000_1_0_log.err" in report and "| ZeroDivisionError: division by zero" in report  # the log's tail


def test_ctrl_c_cancels_the_submitted_jobs_and_no_other(tmp_path, fake_slurm_cluster):
    other = tmp_path / "other.sh"
    other.write_text("#!/bin/bash\nsleep 60\n")
    subprocess.run(["sbatch", str(other)], check=True, capture_output=True)  # someone else's job: 1000
    lines = []
    launcher = _launcher(tmp_path, lines)
    tasks = [Task(f"sleep {i}", time.sleep, (60,)) for i in range(2)]

    def interrupt():
        if all(fake_slurm_cluster.job(f"1001_{i}").get("step_pid") for i in range(2)):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launcher.run(tasks, tick=interrupt)
    assert fake_slurm_cluster.calls("scancel") == [["1001_0", "1001_1"]]
    for key in ("1001_0", "1001_1"):
        fake_slurm_cluster.wait_state(key, "CANCELLED", timeout=30)
    assert fake_slurm_cluster.job("1000")["state"] == "RUNNING"
    assert "interrupted: cancelling jobs 1001_0, 1001_1" in lines


def test_ctrl_c_before_the_jobs_file_is_written_cancels_what_was_submitted(tmp_path, fake_slurm_cluster, monkeypatch):
    lines = []
    launcher = _launcher(tmp_path, lines)

    def interrupted(followed):
        raise KeyboardInterrupt  # as if Ctrl-C came right after sbatch returned

    monkeypatch.setattr(launcher, "_record", interrupted)
    with pytest.raises(KeyboardInterrupt):
        launcher.run([Task(f"sleep {i}", time.sleep, (60,)) for i in range(2)])
    assert fake_slurm_cluster.calls("scancel") == [["1000_0", "1000_1"]]  # else they ran on, in no jobs file


def test_a_stopped_launch_is_reattached_not_submitted_again(tmp_path, fake_slurm_cluster):
    tasks = [Task("nap", time.sleep, (2,))]
    first = _launcher(tmp_path, [])
    first.detach = True
    assert first.run(tasks) is False  # submitted, left running
    assert (tmp_path / "jobs" / JOBS_FILE).is_file()
    lines, done = [], []
    assert _launcher(tmp_path, lines).run(tasks, on_done=lambda task, value: done.append(task.name))
    assert len(fake_slurm_cluster.calls("sbatch")) == 1 and done == ["nap"]
    assert "re-attached to job 1000 (nap), submitted by an earlier launch" in lines


@pytest.mark.slow  # three processes import torch: the launch and the job's two attempts (20-35 s)
def test_a_preempted_replicate_is_requeued_and_resumes_from_its_resume_point(tmp_path, tiny, fake_slurm_cluster):
    """``harness run --seeds 0 --launcher slurm``: SLURM warns the job (SIGTERM, then submitit's USR2, as
    submitit's own ``_interrupt`` does) once the run has written a resume point; the job checkpoints, requeues
    itself, and its second attempt continues the run from that point to the end."""
    tiny["stages"][0]["steps"] = tiny["stages"][1]["steps"] = 300  # long enough to be stopped half way
    tiny["eval"]["every"] = 100
    tiny["train"].update(checkpoint_every=20, stage_cache=False)
    path = write_yaml(tmp_path / "tiny.yaml", tiny)
    group = tmp_path / "group"
    command = [sys.executable, "-m", "harness", "run", str(path), "--seeds", "0", "--out", str(group)]
    command += ["--launcher", "slurm", "--slurm", "poll=0.5", "--slurm", "max_requeues=1"]
    with open(tmp_path / "console.txt", "w") as console:
        launch = subprocess.Popen(command, cwd=ROOT, stdout=console, stderr=subprocess.STDOUT)
        try:
            resume = group / "seed-0" / "checkpoints" / "resume"
            deadline = time.monotonic() + 300
            while not (resume.is_dir() and any(resume.iterdir())):
                assert launch.poll() is None and time.monotonic() < deadline, (tmp_path / "console.txt").read_text()
                time.sleep(0.05)
            for sig in ("SIGTERM", "USR2"):  # a preemption, as SLURM and submitit signal it
                subprocess.run(["scancel", "1000", "--signal", sig], check=True)
            assert launch.wait(timeout=300) == 0, (tmp_path / "console.txt").read_text()
        finally:
            if launch.poll() is None:
                launch.kill()
    console_text = (tmp_path / "console.txt").read_text()
    assert fake_slurm_cluster.calls("scontrol") == [["requeue", "1000"]]  # submitit requeued it, once
    assert fake_slurm_cluster.job("1000")["restarts"] == 1
    log = (group / "slurm" / "1000_0_log.out").read_text()
    assert f"attempt 2: resuming {group.resolve() / 'seed-0'}" in log, log  # the second attempt continued the run
    summary = json.loads((group / "seed-0" / "summary.json").read_text())
    assert summary["resumed_from"].startswith("step-")
    assert json.loads((group / "group.json").read_text())["status"] == {"0": "done"}
    assert "job 1000 (seed 0): REQUEUED" in console_text or "job 1000 (seed 0): PENDING" in console_text


def test_a_sweep_on_slurm_ends_with_exactly_n_trials_in_postgres(tmp_path, fake_slurm_cluster, postgres_url):
    """``harness sweep FILE --launcher slurm --workers 3`` on a throwaway PostgreSQL: one job array of three workers,
    the study's budget exactly used, the storage password in the jobs' environment and nowhere else."""
    n_trials = 3
    path = _sweep(tmp_path, "slurm_pg", study={"n_trials": n_trials})
    out = tmp_path / "sweep"
    password = postgres_url.split(":")[2].split("@")[0]
    result = run_cli(
        "sweep", str(path), "--launcher", "slurm", "--workers", "3", "--out", str(out),
        "--slurm", "poll=0.5", "--slurm", "cpus_per_task=1",
        env={"HARNESS_STORAGE": postgres_url},
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    study = optuna.load_study(study_name="slurm_pg", storage=postgres_url)
    assert sorted(t.number for t in study.get_trials()) == list(range(n_trials))
    assert {t.state.name for t in study.get_trials()} == {"COMPLETE"}
    assert len({t.user_attrs["worker"] for t in study.get_trials()}) >= 1
    assert re.search(r"^#SBATCH --array=0-2%3$", fake_slurm_cluster.script("1000"), re.M)
    for key in ("1000_0", "1000_1", "1000_2"):
        env = fake_slurm_cluster.env(key)
        assert env["HARNESS_STORAGE"] == postgres_url and env["SLURM_CPUS_PER_TASK"] == "1"  # its torch threads
        assert f"job {key} (worker {key[-1]}): done" in output  # each worker ran to its end
    assert "postgresql://harness:***@" in output and password not in output
    for f in out.rglob("*"):
        if f.is_file():
            assert password.encode() not in f.read_bytes(), f  # scripts, pickled calls, job logs, the study files
    assert (out / "trials.parquet").is_file() and (out / "slurm" / "jobs.json").is_file()
