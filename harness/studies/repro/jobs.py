"""Running a reproduction's planned runs: one after another in this process, or ``--jobs N`` at a time, each in a
spawned process with the torch threads split between them.

In parallel the runs go arm-major (different seeds side by side): runs of one seed can replay each other's shared
stages from the stage cache only when one has finished before the other starts — and only at the same thread count,
which the cache key holds, so entries written under ``--jobs N`` are replayed by runs with the same ``N``.
At most ``N`` runs are handed to the pool at a time, so after a failure no further run starts (those in progress
finish), and Ctrl-C or SIGTERM stops the workers too, instead of leaving them to finish their runs alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from harness.config import Experiment


@dataclass(frozen=True)
class PlannedRun:
    arm: str
    seed: int
    exp: Experiment
    run_dir: Path
    force: bool  # the directory holds an unfinished or outdated run: clear it first


def run_planned(
    todo: list[PlannedRun], jobs: int, on_done: Callable[[PlannedRun], None], echo: Callable[[str], None]
) -> None:
    """Run ``todo``; ``on_done(run)`` after each success. The first failure is raised once the runs in progress have
    ended; every failure is echoed with its arm and seed."""
    if jobs <= 1 or len(todo) <= 1:
        from harness.runs.runner import run_experiment  # torch and transformers: only when something runs

        for run in todo:
            try:
                run_experiment(run.exp, run.run_dir, force=run.force)
            except BaseException as error:
                echo(f"{run.arm} seed {run.seed}: failed ({type(error).__name__})")
                raise
            on_done(run)
        return
    _run_parallel(todo, jobs, on_done, echo)


def _run_parallel(
    todo: list[PlannedRun], jobs: int, on_done: Callable[[PlannedRun], None], echo: Callable[[str], None]
) -> None:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    arm_order = list(dict.fromkeys(run.arm for run in todo))
    queue = sorted(todo, key=lambda run: arm_order.index(run.arm))  # stable: seeds keep their order within an arm
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)  # Linux: usable
    threads = 0 if os.environ.get("OMP_NUM_THREADS") else max(1, cpus // jobs)
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"))
    with _sigterm_as_interrupt():
        errors = _drive(pool, queue, jobs, threads, on_done, echo)
    pool.shutdown(wait=True)
    if errors:
        raise errors[0]


def _drive(
    pool,
    queue: list[PlannedRun],
    jobs: int,
    threads: int,
    on_done: Callable[[PlannedRun], None],
    echo: Callable[[str], None],
) -> list[BaseException]:
    """Keep at most ``jobs`` runs in the pool until the queue is done or a run failed; return the failures. On
    Ctrl-C (or SIGTERM) end the workers too."""
    from concurrent.futures import FIRST_COMPLETED, wait

    running: dict = {}
    errors: list[BaseException] = []
    try:
        while queue or running:
            # Never more than `jobs` submitted: a future the pool has already handed to a worker cannot be cancelled.
            while queue and len(running) < jobs and not errors:
                run = queue.pop(0)
                running[pool.submit(_run_in_child, run.exp, run.run_dir, run.force, threads)] = run
            if not running:
                break
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                run, error = running.pop(future), future.exception()
                if error is None:
                    on_done(run)
                else:
                    echo(f"{run.arm} seed {run.seed}: failed ({type(error).__name__})")
                    errors.append(error)
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


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM raises KeyboardInterrupt here while the pool runs, so ``kill`` ends the workers as Ctrl-C does —
    without it this process dies alone and each worker finishes its run (writing results nobody asked for)."""
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


def _run_in_child(exp: Experiment, run_dir: Path, force: bool, threads: int) -> None:
    """One run in a worker process. An exception that would not survive the trip back to the parent is sent as a
    RuntimeError carrying its type and text."""
    import pickle

    import torch

    from harness.runs.runner import run_experiment

    if threads:
        torch.set_num_threads(threads)
    try:
        run_experiment(exp, run_dir, force=force)
    except Exception as error:
        try:
            pickle.loads(pickle.dumps(error))
        except Exception:
            raise RuntimeError(f"{type(error).__name__}: {error}") from None
        raise
