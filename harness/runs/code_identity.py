"""The code a stage's numbers depend on, as one hash: part of every stage-cache key (:mod:`harness.runs.stage_cache`),
so a commit that changes what a stage computes misses the entries made before it, without anyone bumping a version.

Which source counts, by layer (``docs/design.md``, "Layers"):

- every module of ``harness.core`` (statistics, store rows), ``harness.config`` (resolution of stages, seeds),
  ``harness.data`` (encoding, batches), ``harness.models``, ``harness.training`` and ``harness.evaluation``: the
  layers a stage's training and evaluation run through;
- the modules of ``harness.runs`` that shape numbers: ``prepare`` (task data, encoding, which eval items fit,
  the stage plan), ``pretrain`` and ``images`` (the base model), ``runner`` (the stage loop, the evaluation
  schedule), ``evallog`` (the rows and per-item outcomes an evaluation stores), ``ranks`` (a distributed run's
  session) and ``stage_cache`` itself (what an entry holds and how a replay restores RNG state);
- every file under ``data_recipes/`` (a recipe makes the task data and scores its answers).

Left out, because they cannot change a stored number: ``runs.console`` (prints), ``runs.tracking`` (forwards the
rows it is given to the store and wandb), ``runs.rundir`` (claims directories), ``runs.cache_housekeeping`` (lists
and prunes entries), ``runs.code_identity`` (this file), and the layers above ``runs`` — ``cli``, ``checks``,
``studies`` — which start runs but do not compute inside one.

Python files are hashed as their syntax tree without docstrings (``ast.dump``), so editing a comment, a docstring
or the layout does not invalidate the cache; any change to the code does. Other files are hashed as bytes.
"""

from __future__ import annotations

import ast
import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Iterable

REPO = Path(__file__).resolve().parents[2]
SHAPING_PACKAGES = ("harness/core", "harness/config", "harness/data", "harness/models", "harness/training",
                    "harness/evaluation", "data_recipes")
SHAPING_RUN_MODULES = ("prepare", "pretrain", "images", "runner", "evallog", "ranks", "stage_cache")


def shaping_files(root: Path = REPO) -> list[Path]:
    """The files whose content is in :func:`code_fingerprint`, relative to ``root`` (the repository), sorted."""
    files: list[Path] = []
    for package in SHAPING_PACKAGES:
        files += [p for p in (root / package).rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix != ".pyc"]
    files += [root / "harness" / "runs" / f"{name}.py" for name in SHAPING_RUN_MODULES]
    return sorted(p.relative_to(root) for p in files)


def _without_docstrings(tree: ast.AST) -> ast.AST:
    """``tree`` with the docstring of every module, class and function removed (in place)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def file_digest(path: Path) -> str:
    """SHA-256 of a file's code: a Python file's syntax tree without docstrings (comments and layout never reach
    it), any other file's bytes."""
    data = path.read_bytes()
    if path.suffix == ".py":
        data = ast.dump(_without_docstrings(ast.parse(data, filename=str(path)))).encode()
    return hashlib.sha256(data).hexdigest()


def fingerprint_of(root: Path, files: Iterable[Path]) -> str:
    digest = hashlib.sha256()
    for rel in files:
        digest.update(f"{rel.as_posix()}\0{file_digest(root / rel)}\n".encode())
    return digest.hexdigest()


@lru_cache(maxsize=None)
def _cached(root: Path) -> str:
    return fingerprint_of(root, shaping_files(root))


def code_fingerprint(root: Path = REPO) -> str:
    """The hash of every file :func:`shaping_files` names under ``root`` (computed once per process and root)."""
    return _cached(Path(root).resolve())
