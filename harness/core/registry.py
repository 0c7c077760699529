"""String registries for pluggable components (recipes, evaluators, probes, mixture controllers, model checks,
builtin models), and where their entries come from.

Components are looked up by the name written in the experiment file; an unknown name raises
:class:`UnknownNameError`, whose message suggests the nearest registered names. The plug-in kinds (every registry
here but ``BUILTIN_MODELS``) hold :class:`harness.core.plugins.Plugin` subclasses, registered with
:meth:`Registry.plugin`; ``docs/extending.md`` walks a user's own.

The registries that the experiment file's validation reads live here, on the ground floor, so that
:mod:`harness.config` can check names without importing the layers that implement them. Each such registry names
its *provider*: the module that fills it, imported by name on the first lookup — the plugin pattern of entry points
and of lm-evaluation-harness's task registry. This is the only way a lower layer reaches a higher one, it is
declared here and nowhere else, and it fills a registry without calling into the provider otherwise.

Entries come from three places: the providers (the package itself; a provider package imports every module of its
folder, :func:`import_submodules`, so a built-in is registered by being there); installed distributions' entry
points in group :data:`ENTRY_POINT_GROUP` (each value a module, imported once per process on the first lookup of any
registry, :func:`discover_entry_points`); and the modules an experiment names under ``plugins:``
(:mod:`harness.core.plugins`, imported by :mod:`harness.config` before the experiment's names are checked).
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import pkgutil
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: The entry-point group installed distributions declare their plug-in modules in (``pyproject.toml``:
#: ``[project.entry-points."harness.plugins"] my_lab = "my_lab.tasks"``).
ENTRY_POINT_GROUP = "harness.plugins"
_discovered: list[str] = []  # the entry points' modules imported, in order; a sentinel once discovery has run
_discovery_started = False


class PluginError(ValueError):
    """A plug-in module that cannot be imported or registers badly; ``str()`` is one line saying which and why."""


def discover_entry_points() -> list[str]:
    """Import the module of every entry point in :data:`ENTRY_POINT_GROUP`, once per process (later calls return
    the modules imported the first time). Raises :class:`PluginError` naming the entry point whose module fails."""
    global _discovery_started
    if _discovery_started:
        return list(_discovered)
    _discovery_started = True  # before the imports: a plug-in module looks names up through the registries
    for point in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        dist = getattr(getattr(point, "dist", None), "name", None)
        origin = f"entry point {point.name!r}" + (f" of distribution {dist!r}" if dist else "")
        try:
            importlib.import_module(point.value)
        except Exception as e:
            raise PluginError(f"plug-in module {point.value!r} ({origin}): {one_line(e)}") from e
        _discovered.append(point.value)
    return list(_discovered)


def import_submodules(package: str) -> list[str]:
    """Import every public module of ``package`` (each module or subpackage found in its folder whose name does not
    start with ``_``), in sorted order, and return their names: how a package of built-in components registers them
    all without a hand-kept list, as lm-evaluation-harness's ``TaskManager`` scans its task folder — a new built-in
    is one new file. A provider calls it from its ``__init__``."""
    where = importlib.import_module(package).__path__
    names = sorted({info.name for info in pkgutil.iter_modules(where) if not info.name.startswith("_")})
    for name in names:
        importlib.import_module(f"{package}.{name}")
    return names


def one_line(error: BaseException) -> str:
    """``Type: message`` of an exception, on one line (its first)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def suggest(name: str, choices: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or an empty string."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class UnknownNameError(KeyError):
    """A name that is not registered; ``str()`` is the full human message."""

    def __init__(self, kind: str, name: str, known: list[str]):
        self.kind, self.name, self.known = kind, name, known
        super().__init__(f"unknown {kind} {name!r}{suggest(name, known)}; known: {', '.join(sorted(known))}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class Registry(Generic[T]):
    """A name → component map with a decorator for registration and near-miss errors on lookup.

    ``provider``: the module that registers this registry's components, imported on the first lookup (see the
    module docstring); ``None`` for a registry its users fill before they read it. ``instances``: the registry
    holds one instance of each plug-in class (built from its default ``Params``), not the class: evaluators and
    probes, which are looked up per evaluation and hold no state."""

    def __init__(self, kind: str, provider: str | None = None, instances: bool = False):
        self.kind = kind
        self.provider = provider
        self.instances = instances
        self._items: dict[str, T] = {}

    def _filled(self) -> dict[str, T]:
        if self.provider is not None:
            provider, self.provider = self.provider, None  # before the import: the provider registers through us
            try:
                importlib.import_module(provider)
            except BaseException:
                self.provider = provider  # a failed import is retried (and raises again) on the next lookup
                raise
        discover_entry_points()
        return self._items

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = obj
            return obj

        return decorator

    def add(self, name: str, obj: T) -> None:
        self.register(name)(obj)

    def plugin(self, name: str) -> Callable[[type], type]:
        """Class decorator of the plug-in contract (:class:`harness.core.plugins.Plugin`): set ``cls.name`` and
        register the class (an instance built from its default ``Params`` where the registry holds ``instances``)."""

        def decorator(cls: type) -> type:
            params = getattr(cls, "Params", None)
            if not (isinstance(params, type) and hasattr(params, "model_validate")):
                raise TypeError(f"{self.kind} {name!r}: {cls.__name__}.Params must be a pydantic model")
            cls.name = name
            self.register(name)(cls() if self.instances else cls)  # type: ignore[arg-type]
            return cls

        return decorator

    def plugin_class(self, name: str) -> type:
        """The class registered as ``name`` (the class of the instance, where the registry holds instances)."""
        obj = self.get(name)
        return obj if isinstance(obj, type) else type(obj)

    def get(self, name: str) -> T:
        try:
            return self._filled()[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, list(self._items)) from None

    def names(self) -> list[str]:
        return sorted(self._filled())

    def __contains__(self, name: object) -> bool:
        return name in self._filled()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())


#: Task generators (``tasks.<name>.recipe``): :class:`data_recipes.Recipe` classes, filled by :mod:`data_recipes`.
RECIPES: Registry[Any] = Registry("recipe", provider="data_recipes")
#: Evaluators and probes (``eval.evaluators`` / ``eval.probes``): :class:`harness.evaluation.Component` instances,
#: filled by :mod:`harness.evaluation.components`.
EVALUATORS: Registry[Any] = Registry("evaluator", provider="harness.evaluation.components", instances=True)
PROBES: Registry[Any] = Registry("probe", provider="harness.evaluation.components", instances=True)
#: Builtin architectures (``model.builtin``), filled by :mod:`harness.models.builtin` (not a plug-in kind).
BUILTIN_MODELS: Registry[Any] = Registry("builtin model", provider="harness.models.builtin")
#: Checks of the ``model`` section that need the model layer: :class:`harness.models.check.ModelCheck` instances,
#: called as ``check(model_spec) -> [(yaml_path, message)]``, filled by :mod:`harness.models.check`.
MODEL_CHECKS: Registry[Callable[[Any], list[tuple[str, str]]]] = Registry(
    "model check", provider="harness.models.check", instances=True
)
#: Adaptive mixture controllers (``stages[i].mixture.adaptive.method``): :class:`harness.data.steering.Controller`
#: classes, filled by :mod:`harness.data.steering`.
MIXTURE_CONTROLLERS: Registry[Any] = Registry("mixture controller", provider="harness.data.steering")

#: The plug-in kinds by the name ``harness schema`` and ``docs/extending.md`` use for them.
PLUGIN_REGISTRIES: dict[str, Registry[Any]] = {
    "recipes": RECIPES,
    "evaluators": EVALUATORS,
    "probes": PROBES,
    "mixture_controllers": MIXTURE_CONTROLLERS,
    "model_checks": MODEL_CHECKS,
}
