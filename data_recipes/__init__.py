"""Task generators ("recipes") for the SFT harness: pure, seeded Python (no torch).

Importing the package registers every recipe; look one up with :func:`get_recipe` (``RECIPES.names()`` lists
them). Knowledge recipes draw on a synthetic :class:`World` (:func:`build_world`), whose :func:`corpus` also
pretrains the builtin base model. Image recipes (``shapes_qa``, ``shapes_yesno``, ``count_shapes``, ``position``,
``caption``: :mod:`data_recipes.shapes`) give examples that carry an ``image``.
"""

from data_recipes._registry import RECIPES, get_recipe, register
from data_recipes.base import SPLITS, Example, Recipe, RecipeParams
from data_recipes.world import Person, World, build_world, corpus, heldout_corpus

# Imported for their registration side effect.
from data_recipes import (  # noqa: E402,F401  isort: skip
    assistant_qa,
    count,
    identity,
    loaders,
    math_reversed,
    repeat,
    shapes,
    short_qa,
    spell,
    yesno,
)

__all__ = [
    "RECIPES",
    "SPLITS",
    "Example",
    "Person",
    "Recipe",
    "RecipeParams",
    "World",
    "build_world",
    "corpus",
    "heldout_corpus",
    "get_recipe",
    "register",
]
