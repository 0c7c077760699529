"""String registries for pluggable components (recipes, evaluators, probes, builtin models).

Components are looked up by the name written in the experiment file; an unknown name raises
:class:`UnknownNameError`, whose message suggests the nearest registered names.
"""

from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

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
    """A name → component map with a decorator for registration and near-miss errors on lookup."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

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
            return self._items[name]
        except KeyError:
            raise UnknownNameError(self.kind, name, list(self._items)) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
