"""The local launcher: tasks run on this machine, one after another in this process, or ``jobs`` at a time, each in a
spawned process with the torch threads split between them (unless ``OMP_NUM_THREADS`` is set).

At most ``jobs`` tasks are handed to the pool at a time, so after a failure no further task starts (those in
progress finish), and Ctrl-C or SIGTERM stops the workers too, instead of leaving them to finish their tasks alone.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any

from harness.studies.launch.base import Launcher, OnDone, OnFailed, Task, sigterm_as_interrupt


class LocalLauncher(Launcher):
    """Tasks on this machine: in this process (``jobs == 1``), else ``jobs`` spawned processes at a time."""

    kind = "local"

    def __init__(self, jobs: int = 1, echo: Callable[[str], None] = print):
        self.jobs, self.echo = jobs, echo

    def run(
        self,
        tasks: Sequence[Task],
        on_done: OnDone | None = None,
        on_failed: OnFailed | None = None,
        tick: Callable[[], None] | None = None,
    ) -> bool:
        on_done = on_done or (lambda task, value: None)
        if self.jobs <= 1 or len(tasks) <= 1:
            for task in tasks:
                try:
                    value = task.fn(*task.args)
                except BaseException as error:
                    self._failed(task, error, on_failed)
                    raise
                on_done(task, value)
            return True
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = 0 if os.environ.get("OMP_NUM_THREADS") else max(1, cpus // self.jobs)
        pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=get_context("spawn"))
        with sigterm_as_interrupt():
            errors = self._drive(pool, list(tasks), threads, on_done, on_failed, tick)
        pool.shutdown(wait=True)
        if errors:
            raise errors[0]
        return True

    def _failed(self, task: Task, error: BaseException, on_failed: OnFailed | None) -> None:
        self.echo(f"{task.name}: failed ({type(error).__name__})")
        if on_failed is not None:
            on_failed(task, f"{type(error).__name__}: {error}")

    def _drive(self, pool, queue: list[Task], threads: int, on_done, on_failed, tick) -> list[BaseException]:
        """Keep at most ``jobs`` tasks in the pool until the queue is done or a task failed; return the failures.
        On Ctrl-C (or SIGTERM) end the workers too."""
        from concurrent.futures import FIRST_COMPLETED, wait

        running: dict = {}
        errors: list[BaseException] = []
        try:
            while queue or running:
                # Never more than `jobs` submitted: a future the pool has already handed to a worker cannot be
                # cancelled.
                while queue and len(running) < self.jobs and not errors:
                    task = queue.pop(0)
                    running[pool.submit(_call_in_child, task.fn, task.args, threads)] = task
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    task, error = running.pop(future), future.exception()
                    if error is None:
                        on_done(task, future.result())
                    else:
                        self._failed(task, error, on_failed)
                        errors.append(error)
                if tick is not None:
                    tick()
        except BaseException:  # Ctrl-C: end the workers too, not only this process
            if threading.current_thread() is threading.main_thread():  # a second Ctrl-C must not cut this short
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            # No public handle on the workers; taken before shutdown, which sets it to None.
            workers = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for process in workers:
                process.terminate()
            raise
        return errors


def _call_in_child(fn: Callable[..., Any], args: tuple, threads: int) -> Any:
    """One task in a worker process. An exception that would not survive the trip back to the parent is sent as a
    RuntimeError carrying its type and text."""
    import pickle

    if threads:
        import torch  # the tasks train models: split this machine's cores between them

        torch.set_num_threads(threads)
    try:
        return fn(*args)
    except Exception as error:
        try:
            pickle.loads(pickle.dumps(error))
        except Exception:
            raise RuntimeError(f"{type(error).__name__}: {error}") from None
        raise
