"""String registries for pluggable components (recipes, evaluators, probes, builtin models, model checks).

Components are looked up by the name written in the experiment file; an unknown name raises
:class:`UnknownNameError`, whose message suggests the nearest registered names.

The registries that the experiment file's validation reads live here, on the ground floor, so that
:mod:`harness.config` can check names without importing the layers that implement them. Each such registry names
its *provider*: the module that fills it, imported by name on the first lookup — the plugin pattern of entry points
and of lm-evaluation-harness's task registry. This is the only way a lower layer reaches a higher one, it is
declared here and nowhere else, and it fills a registry without calling into the provider otherwise.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any, Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


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
    module docstring); ``None`` for a registry its users fill before they read it."""

    def __init__(self, kind: str, provider: str | None = None):
        self.kind = kind
        self.provider = provider
        self._items: dict[str, T] = {}

    def _filled(self) -> dict[str, T]:
        if self.provider is not None:
            provider, self.provider = self.provider, None  # before the import: the provider registers through us
            try:
                importlib.import_module(provider)
            except BaseException:
                self.provider = provider  # a failed import is retried (and raises again) on the next lookup
                raise
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


#: Evaluators and probes (``eval.evaluators`` / ``eval.probes``), filled by :mod:`harness.evaluation.components`.
EVALUATORS: Registry[Any] = Registry("evaluator", provider="harness.evaluation.components")
PROBES: Registry[Any] = Registry("probe", provider="harness.evaluation.components")
#: Builtin architectures (``model.builtin``), filled by :mod:`harness.models.builtin`.
BUILTIN_MODELS: Registry[Any] = Registry("builtin model", provider="harness.models.builtin")
#: Checks of the ``model`` section that need the model layer (``check(model_spec) -> [(yaml_path, message)]``),
#: filled by :mod:`harness.models.check`.
MODEL_CHECKS: Registry[Callable[[Any], list[tuple[str, str]]]] = Registry(
    "model check", provider="harness.models.check"
)
#: Adaptive mixture controllers (``stages[i].mixture.adaptive.method``), filled by :mod:`harness.data.steering`.
MIXTURE_CONTROLLERS: Registry[Any] = Registry("mixture controller", provider="harness.data.steering")
