"""One experiment run as a launcher task (a reproduction's arm and seed, a seed replicate), resumable when its job is
requeued.

:class:`RunJob` follows submitit's checkpointing protocol (``submitit.helpers.Checkpointable``): when SLURM is
about to stop the job — preemption, or submitit's signal shortly before the time limit — ``checkpoint`` returns the
same call with ``resume=True``, submitit requeues the job, and the run continues from its newest resume point
(``train.checkpoint_every``; without one it starts over). A job SLURM requeues by itself (a failed node, a
partition that requeues what it preempts) starts again with ``SLURM_RESTART_COUNT`` > 0 and resumes the same way.
Either way a job runs at most ``max_requeues`` + 1 times. The class imports submitit only inside ``checkpoint``,
which runs in a job, so the local launcher runs the same task without it.

A job is a fresh interpreter (a spawned process, a SLURM job) that receives the experiment already validated, so
nothing there has imported its ``plugins:``: :func:`import_job_plugins` does, before anything looks a name up. The
entries are the experiment's as validated: module names, and ``.py`` files made absolute by then
(:func:`harness.config.validate_data`), so the job needs neither the experiment file nor its directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def restart_count() -> int:
    """How many times SLURM has started this job before (0 outside SLURM)."""
    return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)


def prepare_job_process() -> None:
    """What a job process sets before the harness imports torch: as many threads as SLURM gave the job's task
    (``--cpus-per-task``; the whole node's cores otherwise), wandb quiet."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if cpus and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = cpus
    os.environ.setdefault("WANDB_SILENT", "true")


def import_job_plugins(exp) -> None:
    """Import the installed entry points and ``exp.plugins`` in this process (once per process; raises
    :class:`harness.config.PluginImportError` naming the entry that fails)."""
    from harness.config.load import import_experiment_plugins

    import_experiment_plugins(list(exp.plugins or []), f"experiment {exp.name!r} (its plugins: in a launched job)")


class RequeueBudget:
    """The requeues a task allows: ``max_requeues``, counted by the task's own checkpoints and by SLURM's restarts
    (whichever says more), so a job requeued by submitit and by SLURM alike stops at the same bound."""

    def __init__(self, max_requeues: int = 3):
        self.max_requeues, self.requeues = max_requeues, 0

    def attempts(self) -> int:
        return max(self.requeues, restart_count())

    def check_start(self) -> None:
        """Refuse a start beyond the bound (SLURM requeued the job more often than allowed)."""
        if self.attempts() > self.max_requeues:
            raise RuntimeError(f"requeued {self.attempts()} times, more than max_requeues ({self.max_requeues})")

    def take(self) -> bool:
        """One more requeue if the bound allows it (then True)."""
        if self.attempts() >= self.max_requeues:
            return False
        self.requeues = self.attempts() + 1
        return True


class RunJob(RequeueBudget):
    """``run_experiment(exp, run_dir, force=…)`` as a task; returns the run directory."""

    def __call__(self, exp, run_dir: Path, force: bool = False, resume: bool = False) -> str:
        self.check_start()
        prepare_job_process()
        from harness.runs.execution.runner import run_experiment  # torch and transformers: in the process that trains

        import_job_plugins(exp)
        run_dir = Path(run_dir)
        if resume or restart_count() > 0:
            # An earlier attempt of this task: continue its run when it got as far as writing one (a run writes its
            # files once planned), else start over in the directory it left (its lock file).
            started = (run_dir / "config.resolved.yaml").is_file() and (run_dir / "run.json").is_file()
            print(f"attempt {self.attempts() + 1}: {'resuming' if started else 'starting over'} {run_dir}", flush=True)
            run_experiment(exp, run_dir, resume=started, force=not started)
        else:
            run_experiment(exp, run_dir, force=force)
        return str(run_dir)

    def checkpoint(self, exp, run_dir: Path, force: bool = False, resume: bool = False) -> Any | None:
        """The call submitit requeues: the same run, resumed; None (not requeued) past ``max_requeues``."""
        from submitit.helpers import DelayedSubmission

        if not self.take():
            print(f"not requeued: max_requeues ({self.max_requeues}) reached", flush=True)
            return None
        return DelayedSubmission(self, exp, run_dir, force=force, resume=True)
