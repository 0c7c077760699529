"""Launchers: where the runs and workers of a study go — this machine, or the jobs of one SLURM job array — behind one
interface (:class:`Launcher`: run named, picklable tasks to their end, one callback per finished task, the first
failure raised, Ctrl-C stopping what was started), so every command that runs many things (``harness sweep``,
``harness repro``, seed groups, a verification of proposed mixtures) chooses where with ``--launcher``.

- :mod:`~harness.studies.launch.spec`: the ``launcher:`` section and ``--slurm KEY=VALUE`` (:func:`resolve_launcher`);
- :mod:`~harness.studies.launch.base`: :class:`Task`, :class:`Launcher`, :class:`JobsFailed` (and here,
  :func:`make_launcher`: the launcher a spec names);
- :mod:`~harness.studies.launch.local`: :class:`~harness.studies.launch.local.LocalLauncher` (this process, or
  spawned processes N at a time);
- :mod:`~harness.studies.launch.cluster`: the SLURM launcher over submitit (imports submitit: the ``cluster``
  extra), with its jobs file for re-attaching;
- :mod:`~harness.studies.launch.run_job`: :class:`~harness.studies.launch.run_job.RunJob`, one experiment run as a
  task that resumes when its job is requeued.

A new command builds its tasks and calls ``make_launcher(resolve_launcher(section, kind, items), folder).run(tasks,
on_done=…)``; nothing here knows about sweeps or reproductions.
"""

from collections.abc import Callable, Mapping
from pathlib import Path

from harness.studies.launch.base import JobsFailed, Launcher, Task
from harness.studies.launch.spec import CLUSTER_EXTRA, LauncherError, LauncherSpec, resolve_launcher


def make_launcher(
    spec: LauncherSpec,
    folder: Path,
    *,
    jobs: int = 1,
    echo: Callable[[str], None] = print,
    job_name: str = "harness",
    env: Mapping[str, str] | None = None,
    detach: bool = False,
) -> Launcher:
    """The launcher ``spec`` names. ``jobs``: local tasks at once; ``folder``: where a cluster launcher keeps its
    jobs file, scripts and logs; ``env``: variables every cluster job gets through its environment, never written
    into a file (a storage URL with its password)."""
    if spec.kind == "slurm":
        from harness.studies.launch.cluster import SubmititLauncher  # submitit: only when jobs go to a cluster

        return SubmititLauncher(spec, folder, echo=echo, job_name=job_name, env=env, detach=detach)
    from harness.studies.launch.local import LocalLauncher

    return LocalLauncher(jobs=jobs, echo=echo)


__all__ = [
    "CLUSTER_EXTRA",
    "JobsFailed",
    "Launcher",
    "LauncherError",
    "LauncherSpec",
    "Task",
    "make_launcher",
    "resolve_launcher",
]
