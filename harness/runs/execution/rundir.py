"""Claiming a run directory: one run per directory, never a silent overwrite or a mix of two runs.

A run directory is *claimed* before anything is written into it:

- a directory that already holds files is refused (:class:`RunDirError`, one line naming it) unless the run
  resumes it (``resume=True``) or the user asked to start over in it (``force=True``);
- an exclusive ``fcntl.flock`` on ``<run dir>/.lock`` is held for the life of the run, so a second process that
  claims the same directory fails at once with "run directory X is in use by pid N". The kernel drops the lock
  when the holder exits, however it exits (SIGKILL included), so a stale ``.lock`` file never blocks a later run;
- :func:`unique_run_name` gives default names that do not collide when several runs start in the same second.

Use it as a context manager: ``with claim_run_dir(path, resume=False, force=False) as claim: ...``.
POSIX only (``fcntl``), like the sweep journal's lock.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import shutil
import time
from pathlib import Path

LOCK_FILE = ".lock"
# What a run writes into its directory: ``--force`` deletes exactly these (never a user's other files, so a mistaken
# ``--out .`` cannot wipe a working directory).
RUN_OUTPUTS = (
    "config.resolved.yaml",
    "run.json",
    "samples.jsonl",
    "metrics.parquet",
    "summary.json",
    "nonfinite.json",
    "checkpoints",
    "wandb",
    "report",
)


class RunDirError(Exception):
    """A run directory that cannot be claimed; the message is one line and names the directory."""


def unique_run_name(prefix: str = "", *, now: float | None = None) -> str:
    """``[prefix-]YYYYmmdd-HHMMSS-xxxxxx``: the local time to the second plus six random hex digits (24 bits), so
    runs started in the same second (``for s in 1 2 3; do harness run … & done``) get different names."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    name = f"{stamp}-{secrets.token_hex(3)}"
    return f"{prefix}-{name}" if prefix else name


def _holder_pid(lock_path: Path) -> int | None:
    try:
        text = lock_path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _wait_for_holder_pid(lock_path: Path, patience_s: float = 0.5) -> int | None:
    """The lock holder's pid; it writes it just after taking the lock, so a run refused in that instant waits a
    moment for it (and says "another run" if it never comes)."""
    deadline = time.monotonic() + patience_s
    while True:
        pid = _holder_pid(lock_path)
        if pid or time.monotonic() >= deadline:
            return pid
        time.sleep(0.02)


class RunDirClaim:
    """An exclusive claim on a run directory; release with :meth:`release` or by leaving the ``with`` block."""

    def __init__(self, path: str | Path, *, resume: bool, force: bool):
        self.path = Path(path)
        self.resume, self.force = resume, force
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> RunDirClaim:
        """Create the directory if needed, take the lock, then check it is empty (or resumable / forced).

        The lock is taken *before* the emptiness check: two runs started at once on an empty directory must not
        both see it empty; the second one finds it locked instead."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise RunDirError(f"run directory {self.path}: cannot create it ({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise RunDirError(f"run directory {self.path}: cannot lock it ({e.strerror or e})") from None
            pid = _wait_for_holder_pid(self.path / LOCK_FILE)
            holder = f"pid {pid}" if pid else "another run"
            raise RunDirError(f"run directory {self.path} is in use by {holder}") from None
        self._fd = fd
        try:
            # The holder's pid goes in the lock file only for the message above; the lock itself is the flock.
            # Written at once (before the contents check), overwriting in place and truncating after, so a run
            # refused a moment later finds a whole pid rather than an empty file.
            record = f"{os.getpid()}\n".encode()
            os.pwrite(fd, record, 0)
            os.ftruncate(fd, len(record))
            self._check_contents()
        except BaseException:
            self.release()
            raise
        return self

    def _check_contents(self) -> None:
        if self.resume or self.force:
            return
        others = sorted(p.name for p in self.path.iterdir() if p.name != LOCK_FILE)
        if others:
            shown = ", ".join(others[:3]) + (", …" if len(others) > 3 else "")
            raise RunDirError(
                f"run directory {self.path} is not empty ({shown}); pass --resume to continue the run "
                "in it, --force to start over in it, or choose another --out"
            )

    def release(self) -> None:
        """Drop the lock (the ``.lock`` file stays: removing it would let a third process lock a new inode while a
        second one still waits on the old)."""
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> RunDirClaim:
        return self if self.held else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def clear_run_outputs(path: str | Path) -> list[str]:
    """Delete the outputs of an earlier run (:data:`RUN_OUTPUTS`) from a directory this process has claimed with
    ``force=True``, so the new run's samples are not appended to the old ones; returns the names removed."""
    removed = []
    for name in RUN_OUTPUTS:
        target = Path(path) / name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        else:
            continue
        removed.append(name)
    return removed


def claim_run_dir(path: str | Path, *, resume: bool, force: bool) -> RunDirClaim:
    """Claim ``path`` for one run (see the module docstring); raises :class:`RunDirError` when it cannot. The
    returned claim is already held; use it in a ``with`` block (or call ``release()``) to drop it."""
    return RunDirClaim(path, resume=resume, force=force).acquire()
