"""How the ``harness`` command ends on an error: one line on stderr and a documented exit code, never a traceback
for a user's mistake (``--debug``, anywhere on the command line, shows the traceback instead).

Exit codes: 0 success; 2 invalid input (experiment / sweep file, ``--set`` value, task data, a run directory that
is not empty or is in use, a corrupt samples file, ``train.compile: true`` where compiling fails, ``train.packing:
true`` on a model packed batches are not exact on); 3 stopped by the non-finite guard; 4 a special token's row
would not train; 5 the file system refused (permission denied, disk full, read-only — also when a library such as
safetensors or polars reports it in its own exception type); 1 anything else (a bug: the traceback is printed).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import warnings
from collections.abc import Callable

from harness.core.jsonl import UnfinishedLineWarning
from harness.core.redact import mask_urls_in_text

EXIT_INVALID = 2
EXIT_FILESYSTEM = 5
DEBUG_FLAG = "--debug"
DEBUG_ENV = "HARNESS_DEBUG"


# The exceptions that are the user's input, not a bug, by the module that defines each. Looked up only in modules
# already imported (:func:`_user_error_types`): an exception of a type can only have been raised once its module
# ran, so the check never imports one — ``harness.training.*`` pulls in torch, and ``harness --help`` or
# ``harness validate`` of a broken file should not pay for it.
USER_ERRORS = (
    ("harness.config.errors", "ConfigError"),
    ("harness.data.task_data", "DataError"),
    ("harness.runs.execution.rundir", "RunDirError"),
    ("harness.core.jsonl", "JsonlError"),
    ("yaml.error", "YAMLError"),
    ("harness.training.compiling", "CompileFailed"),  # train.compile: true where this machine cannot compile
    ("harness.training.packing_check", "PackingError"),  # train.packing: true on a model packing is not exact on
    ("harness.studies.launch.spec", "LauncherError"),  # a --launcher / --slurm choice that cannot be used here
)


def _user_error_types() -> tuple[type[BaseException], ...]:
    """The :data:`USER_ERRORS` types whose modules are imported (the others cannot have been raised)."""
    found = (getattr(sys.modules.get(module), name, None) for module, name in USER_ERRORS)
    return tuple(t for t in found if t is not None)


# A file-system refusal raised by a library as its own type (safetensors and polars write through Rust I/O and
# raise SafetensorError / ComputeError, torch.save a RuntimeError, not OSError), recognised by their words.
_FILESYSTEM_WORDS = re.compile(
    r"No space left on device|Disk quota exceeded|Read-only file system|"
    r"\bos error (?:28|30)\b|PytorchStreamWriter failed writing file"
)


def _filesystem_error(error: BaseException) -> bool:
    """An OSError, or a library's error quoting the OS's full-disk / read-only words."""
    return isinstance(error, OSError) or bool(_FILESYSTEM_WORDS.search(str(error)))


def _one_line(error: BaseException) -> str:
    if isinstance(error, shutil.Error) and error.args and isinstance(error.args[0], list) and error.args[0]:
        # copytree gathers one (source, destination, why) per failed file: the first says it, the count the rest
        failures = error.args[0]
        source, destination, why = failures[0]
        more = f"; {len(failures) - 1} more file(s) failed" if len(failures) > 1 else ""
        return mask_urls_in_text(f"copying {source} to {destination}: {why}{more}")
    if not isinstance(error, OSError) and _FILESYSTEM_WORDS.search(str(error)):
        return mask_urls_in_text(f"{type(error).__name__}: {str(error).strip().splitlines()[-1]}")
    if isinstance(error, OSError) and error.filename is not None:
        text = f"{error.filename}: {error.strerror or error}"
    else:
        text = str(error) or type(error).__name__
    return mask_urls_in_text(text)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings about the user's files (an unfinished last line skipped) as ``warning: …``, not as a source
    location in the harness."""
    stream = file or sys.stderr
    if issubclass(category, UnfinishedLineWarning):
        stream.write(f"warning: {message}\n")
    else:
        stream.write(warnings.formatwarning(message, category, filename, lineno, line))


def run_cli(app: Callable[[], None]) -> None:
    """Run the typer ``app`` (a no-argument callable) with the error policy of the module docstring."""
    debug = DEBUG_FLAG in sys.argv[1:] or os.environ.get(DEBUG_ENV) == "1"
    sys.argv = [sys.argv[0]] + [a for a in sys.argv[1:] if a != DEBUG_FLAG]
    warnings.showwarning = _show_warning
    try:
        app()
    except _user_error_types() as e:
        if debug:
            raise
        sys.stderr.write(f"harness: {_one_line(e)}\n")
        sys.exit(EXIT_INVALID)
    except Exception as e:
        if debug or not _filesystem_error(e):
            raise
        sys.stderr.write(f"harness: {_one_line(e)} (rerun with --debug for the traceback)\n")
        sys.exit(EXIT_FILESYSTEM)
