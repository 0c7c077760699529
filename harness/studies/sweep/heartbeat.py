"""Trial heartbeats and stale trials.

A worker killed mid-trial cannot say so itself, and a worker whose training step hangs (a stuck collective, a
deadlocked data loader, a GPU that stopped answering) is alive but useless. So the heartbeat (the trial system
attribute ``harness:heartbeat``, a Unix time) is written from the run's *progress*: the run calls
:meth:`Heartbeat.pulse` after every training step and every evaluation (``run_experiment(on_progress=…)``), and a
pulse writes at most once every ``study.heartbeat.interval`` seconds. Any worker (and the launching process, which
polls) marks a RUNNING trial whose heartbeat is older than ``study.heartbeat.grace`` as FAIL — a dead worker's and a
hung one's alike. ``grace`` must therefore be longer than the longest stretch without progress: loading the base
model, one evaluation, one checkpoint save. This works on every optuna storage (journal file, SQLite, PostgreSQL,
MySQL): optuna 5's own heartbeat exists for RDB storages only, and is a timer thread that outlives a hung step.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable

from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

HEARTBEAT_ATTR = "harness:heartbeat"
WORKER_ATTR = "worker"


def worker_id(pid: int | None = None) -> str:
    """``host:pid``: who runs a trial (user attribute ``worker``), so a dead worker's trials can be found."""
    return f"{socket.gethostname()}:{pid or os.getpid()}"


class Heartbeat:
    """The heartbeat of one trial: :meth:`beat` writes ``harness:heartbeat = time.time()`` now; :meth:`pulse`, called
    on every unit of progress, writes when ``interval`` seconds have passed since the last write (so a fast loop
    costs one storage write per ``interval``, not one per step). ``with Heartbeat(…)`` beats once on entry: the
    trial is alive from its start until its first progress."""

    def __init__(self, storage, trial_id: int, interval: float, clock: Callable[[], float] = time.monotonic):
        self.storage, self.trial_id, self.interval, self.clock = storage, trial_id, interval, clock
        self.last: float | None = None  # clock() of the last write
        self.finished = False  # the trial was finished elsewhere (failed as stale): stop writing

    def beat(self) -> bool:
        """Write one heartbeat; False once the trial has finished (later pulses then write nothing)."""
        if self.finished:
            return False
        self.last = self.clock()
        try:
            self.storage.set_trial_system_attr(self.trial_id, HEARTBEAT_ATTR, time.time())
            return True
        except UpdateFinishedTrialError:
            self.finished = True
            return False
        except Exception as e:  # a storage hiccup: try again at the next pulse
            print(f"heartbeat of trial id {self.trial_id} failed: {e}", file=sys.stderr, flush=True)
            return True

    def pulse(self) -> None:
        """The run made progress: write a heartbeat unless one was written less than ``interval`` seconds ago."""
        if self.last is None or self.clock() - self.last >= self.interval:
            self.beat()

    def __enter__(self) -> Heartbeat:
        self.beat()
        return self

    def __exit__(self, *exc) -> None:
        return None


def fail_trial(study, trial, reason: str) -> bool:
    """Mark a RUNNING trial FAIL with ``fail_reason``; False if it had finished meanwhile."""
    storage = study._storage
    try:
        storage.set_trial_user_attr(trial._trial_id, "fail_reason", reason)
        return bool(storage.set_trial_state_values(trial._trial_id, TrialState.FAIL))
    except UpdateFinishedTrialError:
        return False


def fail_stale_trials(study, grace: float, now: float | None = None) -> list[int]:
    """Fail RUNNING trials whose heartbeat (or start, before the first beat) is older than ``grace`` seconds;
    returns their numbers."""
    now = time.time() if now is None else now
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        last = t.system_attrs.get(HEARTBEAT_ATTR)
        if last is None and t.datetime_start is not None:
            last = t.datetime_start.timestamp()
        if last is not None and now - last > grace:
            who = t.user_attrs.get(WORKER_ATTR, "unknown worker")
            if fail_trial(
                study,
                t,
                f"worker lost: no heartbeat for {now - last:.0f} s (worker {who} killed, crashed or hung in a step)",
            ):
                failed.append(t.number)
    return failed


def fail_trials_of(study, workers: dict[str, str]) -> list[int]:
    """Fail the RUNNING trials of dead workers (``{worker id: why}``); returns their numbers."""
    failed = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        why = workers.get(t.user_attrs.get(WORKER_ATTR))
        if why and fail_trial(study, t, f"worker lost: {why}"):
            failed.append(t.number)
    return failed
