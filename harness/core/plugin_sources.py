"""The source files of a plug-in module as the stage cache keys them (:func:`plugin_source`): the module's own file
and every module it imports from its own package or directory, named relative to that root, never by absolute
path, so a copied or moved checkout keys the same plug-in alike and an edited helper module misses.

A plug-in's *root* is the directory of its top-level package (``my_lab/`` for ``my_lab.tasks``: every module of
``my_lab`` is its own), or, for a module outside any package (a ``plugins:`` ``.py`` file, a flat module), the
directory it lies in. Its files are found two ways, joined:

- statically, as :mod:`modulefinder` does but without running anything: every ``import`` statement of the module
  (those inside functions too: a helper imported lazily, at scoring time, is not yet in ``sys.modules`` when the
  key is made), resolved along ``sys.path`` to a file, followed into the files it finds under the root;
- from ``sys.modules``, for a package root only: every module of the same top-level package imported in this process
  (an ``importlib.import_module(f"my_lab.judges.{name}")`` no statement names). A directory may hold unrelated
  plug-ins, so a directory root counts only what the statements reach.

Left out: the harness's own packages (``harness``, ``data_recipes``: the code hash covers them by its own rules),
and every file under a library directory (the standard library, site-packages) that does not also hold the root —
a virtual environment inside a lab's directory is not the lab's code; the libraries' versions are keyed apart. A
flat module lying directly in a library directory (an installed single-file plug-in) counts as its file alone.
"""

from __future__ import annotations

import ast
import importlib.machinery
import site
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from harness.core.plugins import FILE_MODULE_PREFIX

HARNESS_PACKAGES = frozenset({"harness", "data_recipes"})


@dataclass(frozen=True)
class PluginSource:
    """One plug-in module's files: ``label`` (its module name; a ``plugins:`` file's own name, as its module name
    holds a hash of its absolute path), ``root`` (the package's or the file's directory) and ``files`` (relative to
    ``root``, sorted)."""

    label: str
    root: Path
    files: tuple[Path, ...]


@lru_cache(maxsize=1)
def library_dirs() -> tuple[Path, ...]:
    """The directories installed libraries and the standard library live in."""
    paths = sysconfig.get_paths()
    dirs = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs |= set(getattr(site, "getsitepackages", lambda: [])())
    dirs.add(getattr(site, "getusersitepackages", lambda: None)())
    return tuple(sorted({Path(d).resolve() for d in dirs if d}))


def _module_file(module: ModuleType | None) -> Path | None:
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if file else None


def _root_of(name: str, file: Path) -> tuple[Path, bool]:
    """(the directory of ``name``'s top-level package — the one of its ``__path__`` entries holding ``file`` —, True),
    else (the directory ``file`` lies in, False)."""
    top = sys.modules.get(name.split(".")[0])
    for entry in getattr(top, "__path__", None) or []:
        directory = Path(entry).resolve()
        if file.is_relative_to(directory):
            return directory, True
    return file.parent, False


def _excluded(file: Path, root: Path) -> bool:
    """A library's file (a library directory holds it but not ``root``)."""
    return any(file.is_relative_to(lib) and not root.is_relative_to(lib) for lib in library_dirs())


class _Finder:
    """Module name → its file along ``sys.path``, without importing (modules already imported: their file)."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def spec(self, name: str) -> importlib.machinery.ModuleSpec | None:
        if name not in self._specs:
            self._specs[name] = self._find(name)
        return self._specs[name]

    def _find(self, name: str) -> importlib.machinery.ModuleSpec | None:
        module = sys.modules.get(name)
        if module is not None:
            return getattr(module, "__spec__", None)
        parent, _, _ = name.rpartition(".")
        where = None
        if parent:
            parent_spec = self.spec(parent)
            where = getattr(parent_spec, "submodule_search_locations", None)
            if not where:
                return None
        try:
            return importlib.machinery.PathFinder.find_spec(name, where)
        except (ImportError, ValueError):
            return None

    def file(self, name: str) -> Path | None:
        origin = getattr(self.spec(name), "origin", None)
        return Path(origin).resolve() if origin and origin not in ("built-in", "frozen") else None


def _imported_names(tree: ast.AST, name: str, is_package: bool) -> set[str]:
    """Every module name an import statement of module ``name`` may load (its parent packages and, for ``from x
    import y``, ``x.y`` in case ``y`` is a module)."""
    package = name if is_package else name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                if len(parts) < node.level:
                    continue  # beyond the top-level package, or a module outside any package
                base = ".".join(parts[: len(parts) - node.level + 1])
                stem = f"{base}.{node.module}" if node.module else base
            else:
                stem = node.module or ""
            targets = [stem, *(f"{stem}.{alias.name}" for alias in node.names if alias.name != "*")]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            names |= {".".join(parts[: i + 1]) for i in range(len(parts)) if parts[0]}
    return {n for n in names if n.split(".")[0] not in HARNESS_PACKAGES}


def _reached(name: str, file: Path, root: Path) -> set[Path]:
    """``file`` and the files under ``root`` its import statements reach, followed transitively."""
    finder, found = _Finder(), {file}
    todo = [(name, file)]
    while todo:
        current, path = todo.pop()
        if path.suffix != ".py":
            continue
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (OSError, SyntaxError, ValueError):
            continue  # its bytes are hashed anyway
        for imported in sorted(_imported_names(tree, current, path.name == "__init__.py")):
            target = finder.file(imported)
            if target and target not in found and target.is_relative_to(root) and not _excluded(target, root):
                found.add(target)
                todo.append((imported, target))
    return found


def _package_modules(top: str, root: Path) -> set[Path]:
    """The files of the modules of package ``top`` imported in this process that lie under ``root``."""
    files = set()
    for name, module in list(sys.modules.items()):
        if name == top or name.startswith(top + "."):
            file = _module_file(module)
            if file and file.is_relative_to(root) and not _excluded(file, root):
                files.add(file)
    return files


def plugin_source(name: str) -> PluginSource | None:
    """The files of the imported module ``name`` and of the modules it imports from its own package or directory
    (module docstring); None for a module without a source file."""
    file = _module_file(sys.modules.get(name))
    if file is None or not file.is_file():
        return None
    root, in_package = _root_of(name, file)
    if root in library_dirs():  # a flat module installed beside every library: its own file only
        files = {file}
    else:
        files = _reached(name, file, root)
        if in_package:  # the modules of its package this process imported
            files |= _package_modules(name.split(".")[0], root)
    label = file.name if name.startswith(FILE_MODULE_PREFIX) else name
    return PluginSource(label, root, tuple(sorted(f.relative_to(root) for f in files if f.is_file())))
