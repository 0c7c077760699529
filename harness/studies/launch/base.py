"""The launcher interface: a list of named tasks (picklable calls) run to their end, on this machine or as the jobs of
one cluster job array, with one callback per finished task and the first failure raised.

A :class:`Task` is ``fn(*args)`` with a name a person reads ("worker 3", "reversed seed 0"). ``fn`` must pickle
(a module-level function, or an instance of a module-level class): the local launcher sends it to a spawned process
and the cluster launcher to a job. An ``fn`` with a ``checkpoint(*args)`` method follows submitit's checkpointing
protocol: when its job is preempted or reaches its time limit, ``checkpoint`` returns the call to requeue
(:class:`harness.studies.launch.run_job.RunJob`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

OnDone = Callable[["Task", Any], None]
OnFailed = Callable[["Task", str], None]


@dataclass(frozen=True)
class Task:
    """``fn(*args)``, called ``name`` in every message about it."""

    name: str
    fn: Callable[..., Any]
    args: tuple = ()


class JobsFailed(Exception):
    """Cluster jobs that ended without their result: one line naming each with its job id and how it ended (the
    launcher has already printed each one's log tail)."""

    def __init__(self, failures: list[tuple[str, str, str]]):
        self.failures = failures  # (job id, task name, why)
        said = "; ".join(f"job {job} ({name}): {why}" for job, name, why in failures)
        super().__init__(f"{len(failures)} job{'s' if len(failures) != 1 else ''} failed: {said}")


class Launcher(ABC):
    """Runs tasks to their end; see the module docstring."""

    kind: str = ""
    max_requeues: int = 3  # what a resumable task (RunJob) is built with: the requeues its job may take

    @abstractmethod
    def run(
        self,
        tasks: Sequence[Task],
        on_done: OnDone | None = None,
        on_failed: OnFailed | None = None,
        tick: Callable[[], None] | None = None,
    ) -> bool:
        """Run every task: ``on_done(task, value)`` after each success, ``on_failed(task, why)`` after each failure,
        ``tick()`` while waiting. Returns True once every task has ended, False when the tasks were left running
        (a cluster launcher told to detach). The first failure is raised once the tasks still running have ended:
        the task's own exception on this machine, :class:`JobsFailed` for cluster jobs. Ctrl-C (and SIGTERM) stops
        what this call started, and nothing else."""


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM raises KeyboardInterrupt here while a launcher waits, so ``kill`` stops what it started as Ctrl-C
    does — without it this process dies alone and its processes or jobs run on (writing results nobody asked for)."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers: main thread only
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:  # a handler installed outside Python reads as None and cannot be put back: the default then
        signal.signal(signal.SIGINT, signal.default_int_handler if previous[0] is None else previous[0])
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous[1] is None else previous[1])
