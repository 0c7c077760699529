"""Task generators ("recipes") for the SFT harness: pure, seeded Python (no torch).

Importing the package registers every recipe: it imports every public module of its folder
(:func:`harness.core.registry.import_submodules`; the names are :data:`BUILTIN_MODULES`), so a new built-in recipe
is one new file, with no list to keep; modules whose name starts with ``_`` are helpers, imported by those that use
them; look one up with :func:`get_recipe` (``RECIPES.names()`` lists
them). Knowledge recipes draw on a synthetic :class:`World` (:func:`build_world`), whose :func:`corpus` also
pretrains the builtin base model. Image recipes (``shapes_qa``, ``shapes_yesno``, ``count_shapes``, ``position``,
``caption``: :mod:`data_recipes.shapes`) give examples that carry an ``image``.
"""

from data_recipes._registry import RECIPES, get_recipe, register
from data_recipes.base import SPLITS, Example, Recipe, RecipeParams
from data_recipes.world import Person, World, build_world, corpus, heldout_corpus
from harness.core.registry import import_submodules

#: The package's public modules, imported (in this order) for their registration side effect.
BUILTIN_MODULES = import_submodules(__name__)

__all__ = [
    "BUILTIN_MODULES",
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
