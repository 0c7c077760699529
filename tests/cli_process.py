"""``python -m harness ARGS`` as a process of its own, without paying the interpreter's start-up each time.

Most of a tiny run's process is importing torch and transformers (about 5.5 of its 7.6 CPU seconds here), and the
suite starts such processes many times. :func:`harness_process` forks each one from multiprocessing's forkserver,
which imported the harness, torch and transformers once (``PRELOAD``): every call is still a separate process with
its own pid, arguments, working directory (first on ``sys.path``, as for ``-m``), environment, file descriptors 1
and 2, exit status and signals, running the same ``harness.cli.app.main`` as ``python -m harness``.

What the fork cannot give is what is decided while the interpreter starts or the preloaded modules import:
``sys.path`` (``PYTHONPATH``), settings that torch and others read from the environment at import (``CXX`` for
Inductor, ``OMP_NUM_THREADS``, ...), the warnings printed by the imports themselves, the hash seed and numpy's global
random state (shared by every forked process; the harness seeds its own generators). So the server starts with the
session's environment (:func:`start_with`), and a call forks only when its environment differs from that one in
variables read at run time (``RUNTIME_ENV``; the harness reads none at import); any other difference starts a fresh
interpreter (:func:`needs_fresh_interpreter`), as does every test that starts ``sys.executable`` itself. The server
is multi-threaded once polars is imported (its allocator's threads): forking it is what polars' own fork handlers
allow, and no preloaded module may start a compute thread pool (torch's and polars' start at first use, in the
child).
"""

from __future__ import annotations

import atexit
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
# What `harness run` imports on its way to training (the heavy part: torch, transformers and the model classes).
PRELOAD = [
    "harness.cli.app",
    "harness.config.load",
    "harness.runs.execution.process_ranks",
    "harness.runs.execution.runner",
]
# Read when a run needs them, never at import: a forked process honours them like a fresh one.
RUNTIME_ENV = {"HARNESS_CACHE", "HARNESS_STORAGE", "HARNESS_DIST_TIMEOUT", "HARNESS_DEBUG", "WANDB_MODE",
               "WANDB_SILENT", "PYTEST_CURRENT_TEST"}  # fmt: skip
# Set inside the test process by imports there (sklearn's, Inductor's): it only silences Intel OpenMP's error about a
# second copy of itself, which torch's libgomp never raises; a difference in it alone still forks.
IGNORED_ENV = {"KMP_DUPLICATE_LIB_OK"}
_server_env: dict | None = None  # the environment the forkserver starts (and imports) with


def start_with(env: dict) -> None:
    """The environment the forkserver will start with (the test session's, once its cache is set)."""
    global _server_env
    _server_env = dict(env)


def needs_fresh_interpreter(env: dict) -> bool:
    """Whether ``env`` differs from the forkserver's environment in a variable that may be read at import."""
    server = _server_env if _server_env is not None else dict(os.environ)
    changed = {k for k in env.keys() | server.keys() if env.get(k) != server.get(k)}
    return bool(changed - RUNTIME_ENV - IGNORED_ENV)


def _forkserver():
    """The forkserver context, its server running with ``_server_env`` (started, or restarted, with it)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    if _server_env is None:
        start_with(os.environ)
    with mock.patch.dict(os.environ, _server_env, clear=True):  # the server inherits this process's environment
        multiprocessing.forkserver.ensure_running()
    return context


def stop_forkserver() -> None:
    """Stop the server and wait for it, so that the CPU time of the processes it forked reaches this process's
    children's (what ``/usr/bin/time`` reports)."""
    multiprocessing.forkserver._forkserver._stop()


def _child(args: list[str], cwd: str, env: dict, out_path: str, err_path: str) -> None:
    """In the forked process: become ``python -m harness ARGS`` and exit as that interpreter would."""
    os.chdir(cwd)
    sys.path.insert(0, cwd)  # `python -m` puts the working directory first
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 — the process's own stdout to its end
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)  # noqa: SIM115
    sys.argv = [str(ROOT / "harness" / "__main__.py"), *args]
    code, interrupted = 0, False
    try:
        from harness.cli.app import main

        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            sys.stderr.write(f"{e.code}\n")
    except KeyboardInterrupt:  # the interpreter prints it and dies by SIGINT
        traceback.print_exc()
        interrupted = True
    except BaseException:  # what the interpreter does with any other uncaught exception
        traceback.print_exc()
        code = 1
    threading._shutdown()  # as at interpreter exit: wait for non-daemon threads, then the exit handlers
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def harness_process(args: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """``python -m harness ARGS`` (a forked process, above) with ``env`` as its whole environment: what
    ``subprocess.run(..., capture_output=True, text=True, timeout=timeout)`` returns, or its ``TimeoutExpired``; the
    process is killed if this call ends any other way (an interrupt, a test's timeout)."""
    with tempfile.TemporaryDirectory(prefix="harness-process-") as tmp:
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        process = _forkserver().Process(target=_child, args=(list(args), str(cwd), dict(env), out_path, err_path))
        command = [sys.executable, "-m", "harness", *args]
        process.start()
        try:
            process.join(timeout)
            if process.is_alive():
                raise subprocess.TimeoutExpired(command, timeout, _read(out_path), _read(err_path))
        finally:
            if process.is_alive():
                process.kill()
                process.join()
        return subprocess.CompletedProcess(command, process.exitcode, _read(out_path), _read(err_path))


def fresh_process(args: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """``python -m harness ARGS`` in a fresh interpreter, ``env`` its whole environment."""
    command = [sys.executable, "-m", "harness", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout)


def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8", errors="replace") if os.path.exists(path) else ""
