"""Running a reproduction's planned runs through a launcher (:mod:`harness.studies.launch`): one after another in
this process, ``--jobs N`` at a time in spawned processes, or as the jobs of one SLURM job array.

The runs go arm-major (different seeds side by side): runs of one seed can replay each other's shared stages from
the stage cache only when one has finished before the other starts — and only at the same thread count, which the
cache key holds, so entries written under ``--jobs N`` are replayed by runs with the same ``N``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.config import Experiment
from harness.studies.launch import Launcher, Task
from harness.studies.launch.run_job import RunJob


@dataclass(frozen=True)
class PlannedRun:
    arm: str
    seed: int
    exp: Experiment
    run_dir: Path
    force: bool  # the directory holds an unfinished or outdated run: clear it first

    @property
    def name(self) -> str:
        return f"{self.arm} seed {self.seed}"


def run_planned(todo: list[PlannedRun], launcher: Launcher, on_done: Callable[[PlannedRun], None]) -> bool:
    """Run ``todo`` with ``launcher``; ``on_done(run)`` after each success. The first failure is raised once the runs
    in progress have ended (every failure is said with its arm and seed). False when the launcher left the runs
    going (detached)."""
    queue = list(todo)
    if launcher.kind != "local" or getattr(launcher, "jobs", 1) > 1:  # side by side: arm-major
        arm_order = list(dict.fromkeys(run.arm for run in todo))
        queue.sort(key=lambda run: arm_order.index(run.arm))  # stable: seeds keep their order within an arm
    by_name = {run.name: run for run in queue}
    tasks = [Task(run.name, RunJob(launcher.max_requeues), (run.exp, run.run_dir, run.force)) for run in queue]
    return launcher.run(tasks, on_done=lambda task, value: on_done(by_name[task.name]))
