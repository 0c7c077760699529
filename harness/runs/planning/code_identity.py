"""The code a stage's numbers depend on, as one hash (:func:`code_fingerprint`), and what else computes them
(:func:`environment`: library versions, the GPU, the files of a user's lm-eval tasks): parts of every stage-cache key
(:mod:`harness.runs.execution.stage_cache`), so a commit, an upgrade or an edited task that changes what a stage
computes misses the entries made before it, without anyone bumping a version.

Which source counts, by layer (``docs/design.md``, "Layers"):

- every module of ``harness.core`` (statistics, store rows), ``harness.config`` (resolution of stages, seeds),
  ``harness.data`` (task building, encoding, each stage's batches), ``harness.models``, ``harness.training`` and
  ``harness.evaluation``: the layers a stage's training and evaluation run through;
- the modules of ``harness.runs`` that shape numbers (:data:`SHAPING_RUN_MODULES`): in ``planning``, ``plan`` (what
  the run executes), ``prepare`` (which task data, base, encoding and batching a run asks for), ``pretrain`` and
  ``images`` (the base model), ``steering_split`` and ``stage_key`` (what a key holds); in ``execution``,
  ``packing_decision`` (packed or padded batches), ``runner`` (the stage loop, the evaluation schedule), ``evallog``
  (the rows and per-item outcomes an evaluation stores), ``process_ranks`` (a distributed run's session) and
  ``stage_cache`` itself (what an entry holds and how a replay restores RNG state);
- every file under ``data_recipes/`` (a recipe makes the task data and scores its answers);
- the plug-ins the run uses (:func:`run_plugins`: its ``plugins:`` entries and the modules of the components it
  names), each with every module it imports from its own package or directory, named relative to that root and
  hashed by content (:mod:`harness.core.plugin_sources`): an edited helper module misses, a moved checkout and a
  plug-in imported earlier in the process for another experiment do not.

Of those directories, only source-looking files count: ``*.py`` and the data files the code reads (the shipped
lm-eval task YAMLs), never hidden files or editor leftovers (swap files, backups), and not the few modules that run
only after the last stage is stored (:data:`AFTER_TRAINING`).

Left out, because they cannot change a stored number (:data:`NOT_SHAPING_RUN_MODULES`): ``execution.console``
(prints), ``execution.tracking`` (forwards the rows it is given to the store and wandb), ``execution.rundir`` (claims
directories), ``execution.cache_housekeeping`` (lists and prunes entries), ``execution.checkpoint_eval`` (stores no
entry), ``planning.code_identity`` (this file) and ``planning.kernel_path`` (the key holds what it reports), and the
layers above ``runs`` — ``cli``, ``checks``, ``studies`` — which start runs but do not compute inside one.

Beyond the code (:func:`environment`): the versions of the libraries that compute a stage besides torch and
transformers (which the key names itself) — peft, and the optional kernels a model runs through when installed
(flash-attn, fla, causal-conv1d; ``absent`` when not) — lm-eval's when the run has benchmarks, the CPU kernel path
(:func:`harness.runs.planning.kernel_path.kernel_path`: torch's CPU capability, the BLAS's and oneDNN's instruction
sets — AVX2 and AVX-512 kernels round differently, and a tiny model trained from scratch turns a last bit into another
run), the GPU's model on CUDA (kernels and their float order differ across GPUs, as the CPU thread count, keyed too,
changes sums), and the content of every ``include_path`` of ``eval.benchmarks``: its task YAMLs, their Python and
data files, and the local data files they name elsewhere (the path alone misses an edited task).

Python files are hashed as their syntax tree without docstrings (``ast.dump``), so editing a comment, a docstring
or the layout does not invalidate the cache; any change to the code does. Other files are hashed as bytes. Parsing
~80 files takes a second or more, so each file's digest is remembered in ``$HARNESS_CACHE/code-digests.json``
under its path, size and modification time (a file that changes gets a new mtime), and a process computes the
whole fingerprint once.
"""

from __future__ import annotations

import ast
import glob
import hashlib
import importlib.metadata
import json
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import torch
import yaml

from harness.config import Experiment
from harness.core.plugin_sources import HARNESS_PACKAGES, plugin_source
from harness.core.plugins import plugin_module
from harness.core.registry import EVALUATORS, MIXTURE_CONTROLLERS, PROBES, RECIPES
from harness.runs.planning.kernel_path import kernel_path
from harness.runs.planning.pretrain import cache_root

REPO = Path(__file__).resolve().parents[3]
SHAPING_PACKAGES = (
    "harness/core",
    "harness/config",
    "harness/data",
    "harness/models",
    "harness/training",
    "harness/evaluation",
    "data_recipes",
)
SHAPING_RUN_MODULES = (  # under harness/runs
    "planning/plan",
    "planning/prepare",
    "planning/pretrain",
    "planning/images",
    "planning/stage_key",
    "planning/steering_split",
    "execution/packing_decision",
    "execution/runner",
    "execution/evallog",
    "execution/process_ranks",
    "execution/stage_cache",
)
# The other modules of harness/runs, each with why it cannot change a stored number (a new module must be placed in
# one list or the other: tests/runs/test_stage_cache_key.py)
NOT_SHAPING_RUN_MODULES = {
    "__init__": "the package's docstring",
    "planning/__init__": "the package's docstring",
    "execution/__init__": "the package's docstring",
    "execution/console": "prints",
    "execution/tracking": "forwards the rows it is given to the store and wandb",
    "execution/rundir": "claims run directories",
    "execution/cache_housekeeping": "lists and prunes cache entries",
    "execution/checkpoint_eval": "harness eval: evaluates a checkpoint outside any stage, stores no cache entry",
    "planning/code_identity": "this file",
    "planning/kernel_path": "reports the CPU kernel path the key holds (the key changes with what it reports)",
}
# Files of the shaping packages that run only once the last stage is stored, each with why (a replayed stage cannot
# differ for them: the run computes them again, after its stages).
AFTER_TRAINING = {
    "harness/core/seesaw.py": "the seesaw events of the whole run, detected after the last stage (runner._close_run)",
    "harness/core/seesaw_sim.py": "simulated evaluation histories for the seesaw tests and bench; no run imports it",
}
SOURCE_SUFFIXES = (".py",)
DATA_SUFFIXES = (".yaml",)  # the shipped lm-eval tasks (harness/evaluation/benchmarks), read by the runs that use them
# Distributions whose code computes a stage besides torch and transformers: adapters, and optional kernels used when
# installed (flash-attn; fla, as flash-linear-attention and its fla-core; causal-conv1d)
LIBRARIES = ("peft", "flash-attn", "flash-linear-attention", "fla-core", "causal-conv1d")
BENCHMARK_LIBRARY = "lm-eval"  # it computes the benchmark rows: keyed only for a run with eval.benchmarks


def is_leftover(path: Path) -> bool:
    """A file no one means as code or data: hidden (``.x.py.swp``, ``.#x.py``), an editor backup or autosave
    (``x.py~``, ``#x.py#``), byte code."""
    name = path.name
    return (
        name.startswith((".", "#"))
        or name.endswith("~")
        or path.suffix in (".pyc", ".swp", ".swo")
        or "__pycache__" in path.parts
    )


def shaping_files(root: Path = REPO) -> list[Path]:
    """The files whose content is in :func:`code_fingerprint`, relative to ``root`` (the repository), sorted."""
    files: list[Path] = []
    for package in SHAPING_PACKAGES:
        files += [
            p
            for p in (root / package).rglob("*")
            if p.suffix in SOURCE_SUFFIXES + DATA_SUFFIXES and p.is_file() and not is_leftover(p.relative_to(root))
        ]
    files += [root / "harness" / "runs" / f"{name}.py" for name in SHAPING_RUN_MODULES]
    return sorted(rel for rel in (p.relative_to(root) for p in files) if rel.as_posix() not in AFTER_TRAINING)


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
    it), any other file's bytes (a Python file that does not parse too: a user's task helper may be broken)."""
    data = path.read_bytes()
    if path.suffix == ".py":
        try:
            data = ast.dump(_without_docstrings(ast.parse(data, filename=str(path)))).encode()
        except SyntaxError:
            pass
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


@cache
def _cached(root: Path) -> str:
    return fingerprint_of(root, shaping_files(root))


def code_fingerprint(root: Path = REPO, plugins: Sequence[str] = ()) -> str:
    """The hash of every file :func:`shaping_files` names under ``root`` (computed once per process and root), and
    of the plug-in modules named in ``plugins`` (:func:`run_plugins`: the ones a run uses) with the modules each
    imports from its own package or directory (:func:`plugin_fingerprints`), whose code shapes a stage as the
    package's does."""
    own = _cached(Path(root).resolve())
    if not plugins:
        return own
    digest = hashlib.sha256(own.encode())
    for label, fingerprint in plugin_fingerprints(plugins):
        digest.update(f"plugin {label}\0{fingerprint}\n".encode())
    return digest.hexdigest()


def run_plugins(exp: Experiment) -> list[str]:
    """The names of the plug-in modules ``exp`` uses, sorted: each ``plugins:`` entry's module (it may register
    anything, or change the harness on import), and the module of every component the experiment names — recipes,
    evaluators, probes, mixture controllers — that is not the harness's own (an installed entry point's, or one a
    module imported earlier registered). Model checks are left out: they refuse a model spec, they compute nothing.
    Entry points that provide nothing the run names are left out too: they cannot reach its numbers through the
    registries, and keying them would make every installed lab package miss every entry."""
    modules = {plugin_module(entry) for entry in exp.plugins}
    named = [(RECIPES, task.recipe) for task in exp.tasks.values()]
    named += [(EVALUATORS, name) for name in exp.eval.evaluators] + [(PROBES, name) for name in exp.eval.probes]
    named += [
        (MIXTURE_CONTROLLERS, stage.mixture.adaptive.method)
        for stage in exp.resolved_stages()
        if stage.mixture.adaptive is not None
    ]
    for registry, name in named:
        module = registry.plugin_class(name).__module__
        if module.split(".")[0] not in HARNESS_PACKAGES:
            modules.add(module)
    return sorted(modules)


def plugin_fingerprints(modules: Sequence[str]) -> list[tuple[str, str]]:
    """``(label, hash)`` of each plug-in module's files (:func:`harness.core.plugin_sources.plugin_source`: named
    relative to the plug-in's root, so a moved checkout keys alike), sorted."""
    out = set()
    for module in modules:
        source = plugin_source(module)
        if source is not None:
            out.add((source.label, fingerprint_of(source.root, source.files)))
    return sorted(out)


# ----------------------------------------------------------------------------------------------------------------
# Beyond the code: libraries, the GPU, a user's benchmark tasks
# ----------------------------------------------------------------------------------------------------------------


def version(distribution: str) -> str:
    """The installed version of ``distribution``, ``absent`` when it is not installed (read from its metadata:
    importing a kernel package to ask would cost seconds and initialise CUDA)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def environment(device: str, benchmarks: Sequence = (), reference_text: str | None = None) -> dict[str, Any]:
    """What computes a stage besides the code (module docstring): the :data:`LIBRARIES`' versions, the CPU kernel
    path (:func:`kernel_path`), lm-eval's version and the content of each ``include_path`` when there are
    ``benchmarks`` (``eval.benchmarks``), the content of the forgetting probe's ``eval.reference_text`` file (the path
    alone would replay rows of an edited file), the GPU's model on ``device`` cuda."""
    out: dict[str, Any] = {"libraries": {name: version(name) for name in LIBRARIES}, "kernel_path": kernel_path()}
    if reference_text:
        out["reference_text"] = hashlib.sha256(Path(reference_text).read_bytes()).hexdigest()
    if device == "cuda" and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    if benchmarks:
        out["libraries"][BENCHMARK_LIBRARY] = version(BENCHMARK_LIBRARY)
        paths = dict.fromkeys(str(Path(s.include_path).resolve()) for s in benchmarks if s.include_path)
        out["include_paths"] = {path: include_path_digest(Path(path)) for path in paths}
    return out


class _TaskYaml(yaml.SafeLoader):
    """lm-eval task YAMLs with their tags (``!function utils.process``) read as nothing: only the data files they
    name are looked for here."""


_TaskYaml.add_multi_constructor("!", lambda loader, suffix, node: None)


def include_path_digest(directory: Path) -> str:
    """The hash of an lm-eval ``include_path`` as lm-eval reads it: every file under ``directory`` but leftovers
    (task YAMLs, their Python, data files beside them), and the local data files its YAMLs name outside it."""
    own = [p.relative_to(directory) for p in directory.rglob("*") if p.is_file()]
    own = sorted(rel for rel in own if not is_leftover(rel))
    named: set[Path] = set()
    for rel in own:
        if rel.suffix in (".yaml", ".yml"):
            named |= _named_data_files(directory / rel)
    outside = sorted(p for p in named if not p.is_relative_to(directory.resolve()))
    return fingerprint_of(directory, [*own, *outside])  # an absolute path stays itself under ``directory``


def _named_data_files(task_yaml: Path) -> set[Path]:
    """The existing local files a task YAML names as its data (``dataset_kwargs.data_files``, a local
    ``dataset_path``), relative names tried against the YAML's directory and the working directory (where the
    datasets library looks); a directory stands for its files."""
    try:
        config = yaml.load(task_yaml.read_text(encoding="utf-8"), Loader=_TaskYaml)
    except (OSError, yaml.YAMLError):
        return set()  # lm-eval refuses it as it does; the file's own bytes are hashed anyway
    if not isinstance(config, dict):
        return set()
    names = [config.get("dataset_path")]
    kwargs = config.get("dataset_kwargs")
    data_files = kwargs.get("data_files") if isinstance(kwargs, dict) else None
    for value in data_files.values() if isinstance(data_files, dict) else [data_files]:
        names += value if isinstance(value, list) else [value]
    found: set[Path] = set()
    for name in (n for n in names if isinstance(n, str) and n):
        matches = _local(name, task_yaml.parent)
        for match in matches:
            found |= {p for p in match.rglob("*") if p.is_file()} if match.is_dir() else {match}
    return {p.resolve() for p in found if not is_leftover(p)}


def _local(name: str, base: Path) -> list[Path]:
    """The files or directories ``name`` (a path or a glob) denotes, against ``base`` first, then the working
    directory; [] for a hub name (``json``, ``org/dataset``) that names nothing here."""
    for root in (base, Path.cwd()):
        matches = sorted(glob.glob(str(root / Path(name).expanduser())))
        if matches:
            return [Path(m) for m in matches]
    return []
