"""``python -m harness ARGS`` as a process of its own, without paying the interpreter's start-up each time.

Most of a tiny run's process is importing torch and transformers (about 5.5 of its 7.6 CPU seconds here), and the
suite starts such processes many times. :func:`harness_process` forks each one from multiprocessing's forkserver,
which imported the harness, torch and transformers once (``PRELOAD``): every call is still a separate process with
its own pid, arguments, working directory, environment, file descriptors 1 and 2, exit status and signals, running
the same ``harness.cli.app.main`` as ``python -m harness``. What the fork cannot give is what is decided while the
interpreter starts or the preloaded modules import: ``sys.path`` (``PYTHONPATH``), settings that torch and others read
from the environment at import (``CXX`` for Inductor, ...), and the warnings printed by the imports themselves. So a
call forks only when its environment differs from the forkserver's in variables read at run time (``RUNTIME_ENV``;
the harness reads none at import); any other difference starts a fresh interpreter (``needs_fresh_interpreter``), as
does every test that starts ``sys.executable`` itself. The thread count a fresh interpreter would take from
``OMP_NUM_THREADS`` (or the cores) is set in the child.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What `harness run` imports on its way to training (the heavy part: torch, transformers and the model classes).
PRELOAD = ["harness.cli.app", "harness.config.load", "harness.runs.ranks", "harness.runs.runner", "polars"]
# Read when a run needs them, never at import: a forked process honours them like a fresh one.
RUNTIME_ENV = {"OMP_NUM_THREADS", "HARNESS_CACHE", "HARNESS_STORAGE", "HARNESS_DIST_TIMEOUT", "HARNESS_DEBUG",
               "WANDB_MODE", "WANDB_SILENT", "PYTEST_CURRENT_TEST"}  # fmt: skip
_context = None
_server_env: dict = {}  # the environment the forkserver started with (and imported under)


def needs_fresh_interpreter(env: dict) -> bool:
    """Whether ``env`` differs from the forkserver's environment in a variable that may be read at import."""
    server = _server_env if _context is not None else dict(os.environ)  # it starts with this process's environment
    changed = {k for k in env.keys() | server.keys() if env.get(k) != server.get(k)}
    return bool(changed - RUNTIME_ENV)


def _forkserver():
    global _context, _server_env
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
        _server_env = dict(os.environ)
    return _context


def _threads(env: dict) -> int:
    """The intra-op thread count a fresh interpreter takes: OMP_NUM_THREADS, else one per core."""
    value = env.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _child(args: list[str], cwd: str, env: dict, out_path: str, err_path: str) -> None:
    """In the forked process: become ``python -m harness ARGS`` and exit with its status."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 — the process's own stdout to its end
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)  # noqa: SIM115
    import torch

    torch.set_num_threads(_threads(env))
    sys.argv = [str(ROOT / "harness" / "__main__.py"), *args]
    code = 0
    try:
        from harness.cli.app import main

        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            sys.stderr.write(f"{e.code}\n")
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # a process's exit handlers run, as at a normal interpreter exit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def harness_process(args: list[str], cwd: Path, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """``python -m harness ARGS`` (a forked process, above) with ``env`` as its whole environment: what
    ``subprocess.run(..., capture_output=True, text=True, timeout=timeout)`` returns, or its ``TimeoutExpired``."""
    with tempfile.TemporaryDirectory(prefix="harness-process-") as tmp:
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        process = _forkserver().Process(target=_child, args=(list(args), str(cwd), dict(env), out_path, err_path))
        process.start()
        process.join(timeout)
        command = [sys.executable, "-m", "harness", *args]
        if process.is_alive():
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(command, timeout)
        return subprocess.CompletedProcess(command, process.exitcode, _read(out_path), _read(err_path))


def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8", errors="replace") if os.path.exists(path) else ""
