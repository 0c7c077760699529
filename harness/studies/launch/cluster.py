"""The cluster launcher: every task a job of one submitit job array on SLURM, followed by the launching command.

- **Submitting**: one ``submitit.AutoExecutor`` per launch, the :class:`~harness.studies.launch.spec.LauncherSpec`
  as its parameters (``#SBATCH --partition/--time/--cpus-per-task/--gpus-per-node/--mem/--account/--requeue``,
  the extra ``sbatch:`` options, the ``setup:`` lines); the tasks go in one ``executor.batch()``, so several are
  one job array. Variables in ``env`` (a storage URL with its password) reach the jobs through the environment
  sbatch passes on (its default ``--export=ALL``), never through the script or the pickled call.
- **The jobs file** ``<folder>/jobs.json`` lists each job's id and task name. A launch finds there the jobs of an
  earlier one that are still queued or running and *re-attaches* to those whose task it was given again (it
  follows them instead of submitting the task twice): so the launching command may be stopped (``--detach``,
  a closed terminal, ``kill -9``) and started again.
- **Following**: every ``spec.poll`` seconds one ``sacct`` call for all jobs; each change of state is printed, a
  job's result is handed to ``on_done``, and a job that ends without one — an exception, FAILED, CANCELLED,
  TIMEOUT, OUT_OF_MEMORY, NODE_FAIL — is printed with its id, why and the tail of its log, then raised together
  with the others as :class:`~harness.studies.launch.base.JobsFailed` once every job has ended.
- **Ctrl-C** (or SIGTERM) cancels the jobs this launch follows (``scancel`` with their ids, and no other), then
  re-raises.

``cluster="local"`` runs the same pickled jobs as processes of submitit's local executor (its tests: no SLURM).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import FailedJobError, FailedSubmissionError, pickle_load

from harness.core.redact import mask_urls_in_text
from harness.core.store import atomic_write_text
from harness.studies.launch.base import JobsFailed, Launcher, OnDone, OnFailed, Task, sigterm_as_interrupt
from harness.studies.launch.spec import LauncherError, LauncherSpec

JOBS_FILE = "jobs.json"
LOG_TAIL_LINES = 15
# A failed job's result is written before its traceback reaches the log: submitit dumps the error, then re-raises it
# and the interpreter prints it on the way out (and a cluster filesystem may show the file later still). A report
# polls the log until it holds the traceback's last line, for at most this long, before it quotes the tail.
LOG_SETTLE_S = 5.0
LOG_SETTLE_POLL_S = 0.25
# sacct states after which a job runs no more (PREEMPTED too: unless SLURM requeues it, when it moves on)
SLURM_ENDED = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "DEADLINE",
    "PREEMPTED", "REVOKED", "SPECIAL_EXIT",
}  # fmt: skip


@dataclass
class Followed:
    """One job this launch follows."""

    task: Task
    job: Any  # a submitit Job
    state: str = ""
    ended_at: float | None = None  # when the scheduler first said it ended without a result
    raised: str | None = None  # the last line of the traceback its result holds, when it failed with one


@contextlib.contextmanager
def _environment(env: Mapping[str, str]):
    """``os.environ`` with ``env`` while the jobs are submitted: sbatch hands it to them."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def log_tail(job, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a job's error log (its traceback), else of its output log; passwords masked."""
    for path in (job.paths.stderr, job.paths.stdout):
        with contextlib.suppress(OSError):
            text = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
            if text:
                return mask_urls_in_text("\n".join(text[-lines:]))
    return ""


def settled_log_tail(job, last_line: str, settle: float = LOG_SETTLE_S, poll: float = LOG_SETTLE_POLL_S) -> str:
    """:func:`log_tail` once it holds ``last_line`` (the traceback's last line, which the interpreter prints after
    submitit has written the result), or after ``settle`` seconds (see :data:`LOG_SETTLE_S`)."""
    deadline = time.monotonic() + settle
    while True:
        tail = log_tail(job)
        if last_line in tail or time.monotonic() >= deadline:
            return tail
        time.sleep(poll)


class SubmititLauncher(Launcher):
    """Tasks as the jobs of one job array; see the module docstring."""

    kind = "slurm"

    def __init__(
        self,
        spec: LauncherSpec,
        folder: Path,
        echo: Callable[[str], None] = print,
        job_name: str = "harness",
        env: Mapping[str, str] | None = None,
        detach: bool = False,
        cluster: str = "slurm",
    ):
        self.spec, self.folder, self.echo, self.job_name = spec, Path(folder).resolve(), echo, job_name
        self.env, self.detach, self.cluster = dict(env or {}), detach, cluster
        self.max_requeues = spec.max_requeues
        # A job said to have ended shows its result within this long (a shared file system may lag behind SLURM's
        # accounting), or comes back (a preempted job SLURM requeues) — else it has failed.
        self.result_grace_s = 15.0

    # -- the jobs file and re-attaching ------------------------------------------------------------------------

    def _records(self) -> list[dict[str, str]]:
        path = self.folder / JOBS_FILE
        if not path.is_file():
            return []
        return json.loads(path.read_text()).get("jobs", [])

    def _record(self, followed: Sequence[Followed]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        jobs = [{"job_id": f.job.job_id, "task": f.task.name} for f in followed]
        atomic_write_text(self.folder / JOBS_FILE, json.dumps({"cluster": self.cluster, "jobs": jobs}, indent=1))

    def _refresh(self) -> None:
        """One ``sacct`` call for every job of this launch (submitit's watcher otherwise waits minutes between)."""
        if self.cluster == "slurm":
            submitit.SlurmJob.watcher.update()

    def active(self) -> dict[str, str]:
        """``{task name: job id}`` of the jobs in the jobs file still queued or running (SLURM only: a local
        executor's processes cannot be found again)."""
        if self.cluster != "slurm":
            return {}
        jobs = {r["task"]: submitit.SlurmJob(folder=self.folder, job_id=r["job_id"]) for r in self._records()}
        self._refresh()
        return {
            name: job.job_id
            for name, job in jobs.items()
            if self._result(job) is None and not self._has_ended(job, str(job.state)) and job.state != "UNKNOWN"
        }

    def _has_ended(self, job, state: str) -> bool:
        """The scheduler runs the job no more (or, on the local executor, its process has exited)."""
        if self.cluster == "slurm":
            return state.split(" ")[0].upper() in SLURM_ENDED  # "CANCELLED by 1000"
        return bool(job.done())

    def _attach(self, tasks: Sequence[Task]) -> list[Followed]:
        active = self.active()
        followed = []
        for task in tasks:
            if task.name in active:
                job = submitit.SlurmJob(folder=self.folder, job_id=active[task.name])
                followed.append(Followed(task, job))
                self.echo(f"re-attached to job {job.job_id} ({task.name}), submitted by an earlier launch")
        return followed

    # -- submitting --------------------------------------------------------------------------------------------

    def _executor(self):
        try:
            executor = submitit.AutoExecutor(
                folder=self.folder,
                cluster=self.cluster,
                slurm_max_num_timeout=self.spec.max_requeues,
                local_max_num_timeout=self.spec.max_requeues,
            )
        except RuntimeError as e:  # SlurmExecutor: no srun here
            raise LauncherError(f"--launcher slurm: {e} (run it where sbatch and srun are on the PATH)") from None
        executor.update_parameters(**self.spec.submitit_parameters(self.job_name))
        return executor

    def _submit(self, tasks: Sequence[Task]) -> list[Followed]:
        executor = self._executor()
        try:
            with _environment(self.env), executor.batch():
                jobs = [executor.submit(task.fn, *task.args) for task in tasks]
        except (FailedJobError, FailedSubmissionError) as e:  # sbatch refused: a bad partition, account, option
            lines = [line for line in str(e).splitlines() if line.strip()] or ["no reason given"]
            raise LauncherError(f"sbatch refused the jobs: {mask_urls_in_text(lines[-1])}") from None
        ids = [job.job_id for job in jobs]
        self.echo(
            f"submitted {len(jobs)} job{'s' if len(jobs) != 1 else ''} ({', '.join(ids)}); "
            f"logs and {JOBS_FILE} in {self.folder}"
        )
        return [Followed(task, job) for task, job in zip(tasks, jobs)]

    # -- following ---------------------------------------------------------------------------------------------

    def run(
        self,
        tasks: Sequence[Task],
        on_done: OnDone | None = None,
        on_failed: OnFailed | None = None,
        tick: Callable[[], None] | None = None,
    ) -> bool:
        names = [task.name for task in tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"task names must be unique: {names}")
        followed = self._attach(tasks)
        attached = {f.task.name for f in followed}
        fresh = [task for task in tasks if task.name not in attached]
        with sigterm_as_interrupt():
            try:
                if fresh:
                    followed += self._submit(fresh)
                self._record(followed)
            except KeyboardInterrupt:  # between sbatch and the jobs file: the jobs exist, nothing would find them
                self.cancel(followed)
                raise
        if self.detach:
            self.echo("detached: the jobs run on; the same command again follows them")
            return False
        failures = self._follow(followed, on_done or (lambda task, value: None), on_failed, tick)
        if failures:
            raise JobsFailed(failures)
        return True

    def _follow(self, followed: list[Followed], on_done, on_failed, tick) -> list[tuple[str, str, str]]:
        remaining, failures = list(followed), []
        with sigterm_as_interrupt():
            try:
                while remaining:
                    self._refresh()
                    for f in list(remaining):
                        ended = self._ended(f)
                        if ended is None:
                            continue
                        remaining.remove(f)
                        ok, value = ended
                        if ok:
                            self.echo(f"job {f.job.job_id} ({f.task.name}): done")
                            on_done(f.task, value)
                        else:
                            failures.append((f.job.job_id, f.task.name, value))
                            self._report(f, value)
                            if on_failed is not None:
                                on_failed(f.task, value)
                    if tick is not None:
                        tick()
                    if remaining:
                        time.sleep(self.spec.poll)
            except KeyboardInterrupt:
                self.cancel(remaining)
                raise
        return failures

    def _ended(self, f: Followed) -> tuple[bool, Any] | None:
        """None while the job runs; else ``(True, its value)`` or ``(False, why it failed)``."""
        state = str(f.job.state)
        if state != f.state:
            f.state = state
            self.echo(f"job {f.job.job_id} ({f.task.name}): {state}")
        result = self._result(f.job)
        if result is not None:
            outcome, value = result
            if outcome == "success":
                return True, value
            lines = [line for line in str(value).splitlines() if line.strip()]
            f.raised = mask_urls_in_text(lines[-1]) if lines else None
            return False, f.raised or "failed"
        if not self._has_ended(f.job, state):
            f.ended_at = None
            return None
        if f.ended_at is None:
            f.ended_at = time.monotonic()
        if time.monotonic() - f.ended_at < self.result_grace_s:
            return None
        return False, f"ended {state} without a result"

    @staticmethod
    def _result(job) -> tuple[str, Any] | None:
        path = job.paths.result_pickle
        with contextlib.suppress(OSError):  # a shared file system shows a new file sooner once its folder is touched
            path.parent.chmod(path.parent.stat().st_mode)
        if not path.exists():
            return None
        try:
            return pickle_load(path)
        except EOFError:  # being written: next time
            return None

    def _report(self, f: Followed, why: str) -> None:
        tail = settled_log_tail(f.job, f.raised) if f.raised else log_tail(f.job)
        lines = [f"job {f.job.job_id} ({f.task.name}) failed: {why}", f"  log: {f.job.paths.stderr}"]
        lines += [f"  | {line}" for line in tail.splitlines()]
        self.echo("\n".join(lines))

    def cancel(self, followed: Sequence[Followed]) -> None:
        """Cancel these jobs (one ``scancel`` with their ids on SLURM), and no other."""
        ids = [f.job.job_id for f in followed]
        if not ids:
            return
        self.echo(f"interrupted: cancelling job{'s' if len(ids) != 1 else ''} {', '.join(ids)}")
        if self.cluster == "slurm":
            subprocess.run(["scancel", *ids], check=False)
        else:
            for f in followed:
                f.job.cancel(check=False)
