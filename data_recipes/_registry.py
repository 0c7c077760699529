"""The recipe registry: ``RECIPES`` maps a name written in the experiment file to a :class:`Recipe` subclass.

Kept apart from ``__init__`` so recipe modules can import ``register`` without a circular import.
"""

from __future__ import annotations

from typing import Callable

from data_recipes.base import Recipe
from harness.core.registry import Registry

RECIPES: Registry[type[Recipe]] = Registry("recipe")


def register(name: str) -> Callable[[type[Recipe]], type[Recipe]]:
    """Class decorator: register a recipe under ``name`` and set ``cls.name`` to it."""

    def decorator(cls: type[Recipe]) -> type[Recipe]:
        cls.name = name
        RECIPES.register(name)(cls)
        return cls

    return decorator


def get_recipe(name: str) -> type[Recipe]:
    """The recipe class registered as ``name``; raises ``UnknownNameError`` with near-miss suggestions."""
    return RECIPES.get(name)
