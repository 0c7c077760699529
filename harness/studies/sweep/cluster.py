"""A sweep's workers as the jobs of one SLURM job array (``harness sweep FILE --launcher slurm --workers N``).

Each job is one sweep worker — :func:`harness.studies.sweep.worker.run_worker`, the loop of ``python -m
harness.studies.sweep.worker`` — against the study's storage, which must be PostgreSQL: jobs on other nodes share
the study through a database server, and the trial budget's lock across machines is PostgreSQL's advisory lock (a
journal file is refused, exit 2). The storage URL reaches the jobs through the environment (``HARNESS_STORAGE``),
never through the job script or the pickled call; a job that finds another storage than the launch's stops at once.

The launching command follows the jobs (:mod:`harness.studies.launch.cluster`) and the study: each finished trial,
stale heartbeats failed, ``trials.parquet`` kept current. A job that dies has its running trial marked FAIL (each job
records its worker id in ``<sweep dir>/slurm/workers/<index>``). A job SLURM preempts or stops at its time limit
fails its running trial (``fail_reason: worker lost: its job was requeued …``) and is requeued as a fresh worker
(new sampler seed), at most ``launcher.max_requeues`` times: trials cannot resume, the budget counts the failed one.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.core.redact import STORAGE_ENV, mask_url
from harness.studies.launch import JobsFailed, LauncherError, LauncherSpec, Task
from harness.studies.launch.cluster import SubmititLauncher
from harness.studies.launch.run_job import RequeueBudget, prepare_job_process
from harness.studies.sweep.heartbeat import fail_stale_trials, fail_trials_of, worker_id
from harness.studies.sweep.load import load_resolved
from harness.studies.sweep.results import TrialFollower, write_trials
from harness.studies.sweep.space import Sweep
from harness.studies.sweep.study import prepare_study
from harness.studies.sweep.worker import counted_trials, load_worker_study, run_worker, warm_base_model

JOBS_DIR = "slurm"  # in the sweep directory: the jobs file, job scripts, pickled calls, logs, worker records


def check_cluster_storage(url: str) -> None:
    """Refuse a storage the jobs of a cluster cannot share (:class:`LauncherError`, one line with the reason)."""
    if url.startswith("postgresql"):
        return
    what = "a journal file" if "://" not in url else url.split("://")[0].split("+")[0]
    raise LauncherError(
        f"--launcher slurm needs the study on PostgreSQL, not {what} ({mask_url(url)}): the jobs run on other "
        "nodes, and the trial budget's lock across machines is PostgreSQL's; set "
        f"{STORAGE_ENV}=postgresql://user:password@host/db (docs/sweeps.md)"
    )


def _marker(sweep_dir: Path, index: int) -> Path:
    return Path(sweep_dir) / JOBS_DIR / "workers" / str(index)


def _worker_of(sweep_dir: Path, index: int) -> str | None:
    """The worker id (``host:pid``) the job of worker ``index`` last ran as."""
    try:
        return json.loads(_marker(sweep_dir, index).read_text())["worker"]
    except (OSError, ValueError, KeyError):
        return None


class WorkerJob(RequeueBudget):
    """One sweep worker as a job, following submitit's checkpointing protocol (see the module docstring)."""

    def __call__(self, sweep_dir: str, index: int, launch: int, storage: str) -> int:
        self.check_start()
        prepare_job_process()
        sweep_dir = Path(sweep_dir)
        sweep = load_resolved(sweep_dir)
        url = sweep.storage_url(sweep_dir)
        if mask_url(url) != storage:
            raise RuntimeError(
                f"this job would read the study from {mask_url(url)}, the launch's is {storage}: "
                f"{STORAGE_ENV} did not reach the job (does the cluster limit sbatch --export?)"
            )
        if self.attempts() > 0:  # requeued by SLURM itself: the earlier attempt could not fail its own trial
            study = load_worker_study(sweep, sweep_dir, index)
            previous = _worker_of(sweep_dir, index)
            if previous:
                fail_trials_of(study, {previous: "its job was requeued"})
            launch = counted_trials(study)  # a fresh sampler seed: not the earlier attempt's proposals again
        marker = _marker(sweep_dir, index)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"worker": worker_id()}))
        return run_worker(sweep_dir, index, log=lambda m: print(m, flush=True), launch=launch)

    def checkpoint(self, sweep_dir: str, index: int, launch: int, storage: str) -> Any | None:
        """The job is about to be stopped: fail its running trial, then requeue the worker (None: not requeued,
        past ``max_requeues``)."""
        from submitit.helpers import DelayedSubmission

        study = load_worker_study(load_resolved(Path(sweep_dir)), Path(sweep_dir), index)
        again = self.take()
        why = (
            "its job was requeued (preempted, or at its time limit)"
            if again
            else f"its job was stopped and not requeued (max_requeues {self.max_requeues} reached)"
        )
        failed = fail_trials_of(study, {worker_id(): why})
        print(f"worker {index}: {why}; trials {failed} marked FAIL", flush=True)
        return DelayedSubmission(self, sweep_dir, index, counted_trials(study), storage) if again else None


def run_sweep_on_cluster(
    sweep: Sweep,
    sweep_dir: Path,
    spec: LauncherSpec,
    workers: int,
    worker_offset: int = 0,
    echo: Callable[[str], None] = print,
    detach: bool = False,
    cluster: str = "slurm",
) -> dict[str, Any]:
    """Prepare the study and run ``workers`` worker jobs on it (re-attaching to those of an earlier launch still
    queued or running), following them until they end; returns ``{"budget_done", "failed", "detached"}``
    (``failed``: :class:`JobsFailed`'s list, ``detached``: the jobs were left running)."""
    sweep_dir = Path(sweep_dir).resolve()
    url = sweep.storage_url(sweep_dir)
    check_cluster_storage(url)
    prepare_study(sweep, sweep_dir)
    for note in sweep.notes:
        echo(f"note: {note}")
    warm_base_model(sweep, echo)  # once, into $HARNESS_CACHE (shared with the jobs), not once per job
    study = load_worker_study(sweep, sweep_dir, worker_offset)
    launch, budget = counted_trials(study), sweep.spec.study.n_trials
    launcher = SubmititLauncher(
        spec,
        sweep_dir / JOBS_DIR,
        echo,
        job_name=f"harness-sweep-{sweep.name}",
        env={STORAGE_ENV: url, "PYTHONUNBUFFERED": "1"},
        detach=detach,
        cluster=cluster,
    )
    indices = range(worker_offset, worker_offset + workers)
    job = WorkerJob(spec.max_requeues)
    tasks = [Task(f"worker {i}", job, (str(sweep_dir), i, launch, mask_url(url))) for i in indices]
    if launch >= budget:  # nothing left to start: only follow what an earlier launch left running
        active = launcher.active()
        tasks = [t for t in tasks if t.name in active]
        if not tasks:
            echo(f"the study's budget of {budget} trials is used: no job submitted")
            write_trials(study, sweep, sweep_dir)
            return {"budget_done": True, "failed": [], "detached": False}
    follow = TrialFollower(study, sweep, sweep_dir, echo)
    grace = sweep.spec.study.heartbeat.grace

    def tick() -> None:
        stale = fail_stale_trials(study, grace)
        if stale:
            echo(f"trials {stale} marked FAIL: no heartbeat for {grace:.0f} s")
        follow()

    def lost(task: Task, why: str) -> None:
        worker = _worker_of(sweep_dir, task.args[1])
        failed = fail_trials_of(study, {worker: f"its job ended: {why}"}) if worker else []
        if failed:
            echo(f"trials {failed} of {task.name} marked FAIL")

    failed: list = []
    try:
        detached = not launcher.run(tasks, on_failed=lost, tick=tick)
    except JobsFailed as e:
        detached, failed = False, e.failures
    except KeyboardInterrupt:  # the jobs are cancelled: their running trials will never report
        for task in tasks:
            lost(task, "cancelled (the launching command was interrupted)")
        raise
    finally:
        follow(write=False)
        write_trials(study, sweep, sweep_dir)
    return {"budget_done": counted_trials(study) >= budget, "failed": failed, "detached": detached}
