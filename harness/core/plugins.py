"""The plug-in contract shared by recipes, evaluators, probes, mixture controllers and model checks, and the import
of the modules an experiment names under ``plugins:``.

A plug-in is a class with a ``name`` (set by the registering decorator) and a pydantic ``Params`` model (unknown
keys refused; ``Params()`` must validate: every setting has a default), registered into the registry of its kind
with ``@REGISTRY.plugin("my_name")`` (:meth:`harness.core.registry.Registry.plugin`). Each kind's base class adds
what the kind does: :class:`data_recipes.Recipe`, :class:`harness.evaluation.Component` (evaluators and probes),
:class:`harness.data.steering.Controller`, :class:`harness.models.check.ModelCheck`.

:func:`import_plugins` imports an experiment's ``plugins:`` entries: a dotted module name (``my_lab.tasks``,
imported from ``sys.path`` as usual) or the path of a ``.py`` file (relative paths against the experiment file's
directory), loaded under a module name of its own and imported once per process. :func:`plugin_module` names the
module an entry was loaded as, so the stage cache's code hash can cover the plug-ins a run uses and the modules they
import (:mod:`harness.core.plugin_sources`, :mod:`harness.runs.planning.code_identity`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from harness.core.registry import PLUGIN_REGISTRIES, PluginError, discover_entry_points, one_line, suggest

_imported: dict[str, str] = {}  # plugins: entry (as resolved) -> the name of the module it was loaded as


class PluginParams(BaseModel):
    """Base of every plug-in's ``Params``: unknown keys are errors (reported at their YAML path)."""

    model_config = ConfigDict(extra="forbid")


class Plugin:
    """Base of every plug-in: ``name`` (set by ``@REGISTRY.plugin(name)``) and ``Params`` (defaults for all)."""

    name: ClassVar[str] = ""
    Params: ClassVar[type[BaseModel]] = PluginParams
    #: Settings the plug-in is built from in the contract test (``tests/core/test_plugins.py``) where one has no default
    #: (a loader's data file); empty for the rest, whose ``Params()`` alone must validate.
    example_params: ClassVar[dict] = {}

    @classmethod
    def params_schema(cls) -> dict:
        """The JSON Schema of ``Params`` (what ``harness schema`` prints for the plug-in)."""
        return cls.Params.model_json_schema()


def is_file_entry(entry: str) -> bool:
    """Whether a ``plugins:`` entry names a ``.py`` file (else it is a dotted module name)."""
    return entry.endswith(".py") or "/" in entry or "\\" in entry


def resolve_entry(entry: str, base_dir: Path) -> str:
    """A ``.py`` entry made absolute against ``base_dir``; a module name unchanged."""
    return str((base_dir / entry).resolve()) if is_file_entry(entry) else entry


FILE_MODULE_PREFIX = "harness_plugin_"  # the module names plug-in files are loaded under start with it


def _module_name(path: Path) -> str:
    """The module name a plug-in file is loaded under: its stem and a hash of its absolute path."""
    stem = "".join(c if c.isalnum() else "_" for c in path.stem)
    return f"{FILE_MODULE_PREFIX}{stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:10]}"


def _import_file(path: Path) -> str:
    if not path.is_file():
        nearby = [p.name for p in path.parent.glob("*.py")] if path.parent.is_dir() else []
        raise PluginError(f"no plug-in file {str(path)!r}{suggest(path.name, nearby)}")
    name = _module_name(path)
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before running it: dataclasses and pickling look their module up
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return name


def _missing_module_hint(error: ModuleNotFoundError) -> str:
    """`` (did you mean …?)`` for a misspelt part of a dotted module name, from the modules beside it."""
    parent, _, leaf = (error.name or "").rpartition(".")
    try:
        where = importlib.import_module(parent).__path__ if parent else None
    except (ImportError, AttributeError):
        return ""
    prefix = f"{parent}." if parent else ""
    return suggest(prefix + leaf, [prefix + m.name for m in pkgutil.iter_modules(where)])


def _import_module(entry: str) -> str:
    try:
        importlib.import_module(entry)
    except ModuleNotFoundError as e:
        if e.name and (entry == e.name or entry.startswith(e.name + ".")):
            raise PluginError(f"no module named {e.name!r}{_missing_module_hint(e)}") from e
        raise
    return entry


def import_plugins(entries: list[str], base_dir: Path | None = None) -> list[tuple[int, str]]:
    """Import each ``plugins:`` entry (module docstring), after the installed entry points; returns ``(index,
    one-line message)`` for every entry that fails (the others stay imported). ``base_dir``: what relative file
    paths are relative to (default: the current directory)."""
    discover_entry_points()
    errors: list[tuple[int, str]] = []
    for i, raw in enumerate(entries):
        entry = resolve_entry(raw, base_dir or Path.cwd())
        if entry in _imported:
            continue
        try:
            _imported[entry] = _import_file(Path(entry)) if is_file_entry(entry) else _import_module(entry)
        except PluginError as e:
            errors.append((i, f"cannot import plug-in {raw!r}: {e}"))
        except Exception as e:
            errors.append((i, f"cannot import plug-in {raw!r}: {one_line(e)}"))
    return errors


def plugin_module(entry: str, base_dir: Path | None = None) -> str:
    """The name of the module a ``plugins:`` entry is loaded as (imported now if it was not yet: raises
    :class:`PluginError` when it cannot be). ``base_dir`` as for :func:`import_plugins`."""
    resolved = resolve_entry(entry, base_dir or Path.cwd())
    if resolved not in _imported:
        errors = import_plugins([entry], base_dir)
        if errors:
            raise PluginError(errors[0][1])
    return _imported[resolved]


def plugin_schemas() -> dict[str, dict[str, dict]]:
    """``{kind: {name: Params JSON Schema}}`` of every registered plug-in (the providers and entry points are
    imported on the way): what ``harness schema`` adds to the experiment's schema under ``x-plugins``."""
    from_kinds: dict[str, dict[str, dict]] = {}
    for kind, registry in PLUGIN_REGISTRIES.items():
        from_kinds[kind] = {name: registry.plugin_class(name).params_schema() for name in registry.names()}
    return from_kinds
