"""The recipe registry: ``RECIPES`` (:data:`harness.core.registry.RECIPES`) maps a name written in the experiment
file to a :class:`Recipe` subclass; ``@register(name)`` is the plug-in contract's decorator for recipes.

Kept apart from ``__init__`` so recipe modules can import ``register`` without a circular import.
"""

from __future__ import annotations

from collections.abc import Callable

from data_recipes.base import Recipe
from harness.core.registry import RECIPES

__all__ = ["RECIPES", "get_recipe", "register"]


def register(name: str) -> Callable[[type[Recipe]], type[Recipe]]:
    """Class decorator: register a recipe under ``name`` and set ``cls.name`` to it (``RECIPES.plugin(name)``)."""
    return RECIPES.plugin(name)


def get_recipe(name: str) -> type[Recipe]:
    """The recipe class registered as ``name``; raises ``UnknownNameError`` with near-miss suggestions."""
    return RECIPES.get(name)
