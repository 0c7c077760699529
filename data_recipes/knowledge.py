"""Shared ground for the knowledge recipes (``yesno``, ``assistant_qa``, ``short_qa``): the attributes that can be
asked about, their values, and the train / held-out split of the world's people.

The people split depends only on the world and ``heldout_people`` — not on the task or its seed — so every
knowledge task holds out the *same* people: a held-out person of ``assistant_qa`` is never trained on through
``yesno`` either. (Different fractions give nested held-out sets: the first k of one seeded order.)
"""

from __future__ import annotations

import math
import random
import re
from typing import Literal

from pydantic import Field, field_validator

from data_recipes._split import Template, check_splits, round_robin, templates, used_items
from data_recipes.base import Example, Recipe, RecipeParams
from data_recipes.world import Person, World

_YES_NO = re.compile(r"^(yes|no)\b")


def yes_no_word(normalised: str) -> str | None:
    """``"yes"`` / ``"no"`` if the (normalised, lower-case) text starts with that word, else ``None``.

    A word boundary, so "Nora ..." or "Yesterday ..." do not count.
    """
    m = _YES_NO.match(normalised)
    return m.group(1) if m else None


ATTRIBUTES: tuple[str, ...] = ("birth_city", "birth_year", "job", "home_city", "favourite_colour", "pet")
Attribute = Literal["birth_city", "birth_year", "job", "home_city", "favourite_colour", "pet"]


class KnowledgeParams(RecipeParams):
    heldout_people: float = Field(0.2, gt=0, lt=1, description="Share of the world's people never trained on.")
    attributes: list[Attribute] = Field(
        default_factory=lambda: list(ATTRIBUTES), description="Which facts to ask about."
    )

    @field_validator("attributes")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("give at least one attribute")
        if len(set(v)) != len(v):
            raise ValueError("attributes must be distinct")
        return v


def value(person: Person, attribute: str) -> str | None:
    """The fact as text (``"1972"``, ``"baker"``); ``None`` for ``pet`` when the person has none."""
    v = getattr(person, attribute)
    return None if v is None else str(v)


def split_people(world: World, heldout_fraction: float) -> tuple[list[Person], list[Person]]:
    """``(train_people, heldout_people)``: a seeded order of the world's people, the first share held out."""
    order = list(world.people)
    random.Random(f"people-split:{world.seed}").shuffle(order)
    k = max(1, math.ceil(heldout_fraction * len(order)))
    if k >= len(order):
        raise ValueError(
            f"the world has {len(order)} people; holding out {heldout_fraction:.0%} leaves none to train on"
        )
    return order[k:], order[:k]


class KnowledgeRecipe(Recipe):
    """Base for recipes over the world; provides the people split."""

    needs_world = True

    def people(self) -> tuple[list[Person], list[Person]]:
        assert self.world is not None
        return split_people(self.world, self.params.heldout_people)


def fact_splits(
    recipe: KnowledgeRecipe,
    task: str,
    n_train: int,
    n_eval: int,
    seed: int,
    train_templates: dict[str, tuple[Template, ...]],
    heldout_templates: dict[str, tuple[Template, ...]],
    answer,
) -> dict[str, list[Example]]:
    """Splits over ``(person, attribute)`` items, one question each; ``answer(person, attribute) -> str``.

    Used by ``short_qa`` and single-turn ``assistant_qa``. meta: item ``"p<id>:<attribute>"``, template,
    person (id), attribute.
    """
    rng = random.Random(f"{recipe.name}:{seed}")
    train_people, heldout_people = recipe.people()
    attrs = list(recipe.params.attributes)

    def render(item, template):
        person, attr = item
        return Example.single(
            task,
            template.render(n=person.name),
            answer(person, attr),
            item=f"p{person.id}:{attr}",
            template=template.id,
            person=person.id,
            attribute=attr,
        )

    def pool(people):
        return [(p, a) for p in people for a in attrs]

    def size(people, tmpl):
        return f"{len(people)} people × {len(attrs)} attributes × {len(tmpl[attrs[0]])} templates"

    train = round_robin(
        rng,
        pool(train_people),
        lambda it: train_templates[it[1]],
        n_train,
        f"{task}: train ({size(train_people, train_templates)})",
    )
    heldout = round_robin(
        rng,
        pool(heldout_people),
        lambda it: train_templates[it[1]],
        n_eval,
        f"{task}: heldout ({size(heldout_people, train_templates)})",
    )
    seen = used_items(train, lambda it: (it[0].id, it[1]), pool(train_people))
    heldout_t = round_robin(
        rng,
        seen,
        lambda it: heldout_templates[it[1]],
        n_eval,
        f"{task}: heldout_template ({len(seen)} trained items × held-out templates)",
    )
    splits = {
        "train": [render(i, t) for i, t in train],
        "heldout": [render(i, t) for i, t in heldout],
        "heldout_template": [render(i, t) for i, t in heldout_t],
    }
    return check_splits(task, splits, n_train, n_eval)


def attribute_templates(train: dict[str, tuple[str, ...]], heldout: dict[str, tuple[str, ...]]):
    """Per-attribute templates with ids ``"<attribute>/t<i>"`` (training) and ``"<attribute>/h<i>"`` (held out)."""
    return (
        {a: templates(f"{a}/t", texts) for a, texts in train.items()},
        {a: templates(f"{a}/h", texts) for a, texts in heldout.items()},
    )
