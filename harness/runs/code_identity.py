"""The code a stage's numbers depend on, as one hash: part of every stage-cache key (:mod:`harness.runs.stage_cache`),
so a commit that changes what a stage computes misses the entries made before it, without anyone bumping a version.

Which source counts, by layer (``docs/design.md``, "Layers"):

- every module of ``harness.core`` (statistics, store rows), ``harness.config`` (resolution of stages, seeds),
  ``harness.data`` (encoding, batches), ``harness.models``, ``harness.training`` and ``harness.evaluation``: the
  layers a stage's training and evaluation run through;
- the modules of ``harness.runs`` that shape numbers: ``prepare`` (task data, encoding, which eval items fit,
  the stage plan), ``pretrain`` and ``images`` (the base model), ``packing`` (packed or padded batches), ``runner``
  (the stage loop, the evaluation schedule), ``evallog`` (the rows and per-item outcomes an evaluation stores),
  ``ranks`` (a distributed run's session) and ``stage_cache`` itself (what an entry holds and how a replay restores
  RNG state);
- every file under ``data_recipes/`` (a recipe makes the task data and scores its answers);
- the plug-in modules imported from outside the package (:func:`code_fingerprint`).

Left out, because they cannot change a stored number: ``runs.console`` (prints), ``runs.tracking`` (forwards the
rows it is given to the store and wandb), ``runs.rundir`` (claims directories), ``runs.cache_housekeeping`` (lists
and prunes entries), ``runs.code_identity`` (this file), and the layers above ``runs`` — ``cli``, ``checks``,
``studies`` — which start runs but do not compute inside one.

Python files are hashed as their syntax tree without docstrings (``ast.dump``), so editing a comment, a docstring
or the layout does not invalidate the cache; any change to the code does. Other files are hashed as bytes. Parsing
~80 files takes a second or more, so each file's digest is remembered in ``$HARNESS_CACHE/code-digests.json``
under its path, size and modification time (a file that changes gets a new mtime), and a process computes the
whole fingerprint once.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import tempfile
import time
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from harness.core.plugins import plugin_files
from harness.runs.pretrain import cache_root

REPO = Path(__file__).resolve().parents[2]
SHAPING_PACKAGES = (
    "harness/core",
    "harness/config",
    "harness/data",
    "harness/models",
    "harness/training",
    "harness/evaluation",
    "data_recipes",
)
SHAPING_RUN_MODULES = ("prepare", "pretrain", "images", "packing", "runner", "evallog", "ranks", "stage_cache")
# The other modules of harness/runs, each with why it cannot change a stored number (a new module must be placed in
# one list or the other: tests/runs/test_stage_cache_key.py)
NOT_SHAPING_RUN_MODULES = {
    "__init__": "the package's docstring",
    "console": "prints",
    "tracking": "forwards the rows it is given to the store and wandb",
    "rundir": "claims run directories",
    "cache_housekeeping": "lists and prunes cache entries",
    "checkpoint_eval": "harness eval: evaluates a checkpoint outside any stage, stores no cache entry",
    "code_identity": "this file",
}


def shaping_files(root: Path = REPO) -> list[Path]:
    """The files whose content is in :func:`code_fingerprint`, relative to ``root`` (the repository), sorted."""
    files: list[Path] = []
    for package in SHAPING_PACKAGES:
        files += [
            p
            for p in (root / package).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        ]
    files += [root / "harness" / "runs" / f"{name}.py" for name in SHAPING_RUN_MODULES]
    return sorted(p.relative_to(root) for p in files)


def _without_docstrings(tree: ast.AST) -> ast.AST:
    """``tree`` with the docstring of every module, class and function removed (in place)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(getattr(body[0], "value", None), ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return tree


def file_digest(path: Path) -> str:
    """SHA-256 of a file's code: a Python file's syntax tree without docstrings (comments and layout never reach
    it), any other file's bytes."""
    data = path.read_bytes()
    if path.suffix == ".py":
        data = ast.dump(_without_docstrings(ast.parse(data, filename=str(path)))).encode()
    return hashlib.sha256(data).hexdigest()


MEMO = "code-digests.json"
RACY_NS = 2_000_000_000


def fingerprint_of(root: Path, files: Iterable[Path]) -> str:
    """The hash of ``files`` (relative to ``root``): each one's path and :func:`file_digest`, read from the memo
    when the file's path, size and mtime are remembered there."""
    memo_path = cache_root() / MEMO
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    digest, changed = hashlib.sha256(), False
    for rel in files:
        path = (root / rel).resolve()
        stat = path.stat()
        stamp = [stat.st_size, stat.st_mtime_ns]
        known = memo.get(str(path))
        if not known or known[:2] != stamp:
            known = [*stamp, file_digest(path)]
            # as git does with "racily clean" files: one modified in the last seconds could change again within
            # the filesystem's timestamp tick, keeping size and mtime — it is hashed afresh until it has settled
            if time.time_ns() - stat.st_mtime_ns > RACY_NS:
                memo[str(path)], changed = known, True
        digest.update(f"{rel.as_posix()}\0{known[2]}\n".encode())
    if changed:
        _write_memo(memo_path, memo)
    return digest.hexdigest()


def _write_memo(path: Path, memo: dict) -> None:
    """Replace the memo atomically (a reader sees the old or the new one); a cache it may not write is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{MEMO}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(memo, f)
        os.replace(tmp, path)
    except OSError:
        pass


@lru_cache(maxsize=None)
def _cached(root: Path) -> str:
    return fingerprint_of(root, shaping_files(root))


def code_fingerprint(root: Path = REPO) -> str:
    """The hash of every file :func:`shaping_files` names under ``root`` (computed once per process and root), and
    of the plug-in modules this process imported outside the package (an experiment's ``plugins:``, installed entry
    points: :func:`harness.core.plugins.plugin_files`), whose code shapes a stage as the package's does."""
    own = _cached(Path(root).resolve())
    plugins = [f for f in plugin_files() if f.suffix == ".py" and f.is_file()]
    if not plugins:
        return own
    digest = hashlib.sha256(own.encode())
    for file in plugins:
        digest.update(f"{file}\0{file_digest(file)}\n".encode())
    return digest.hexdigest()
