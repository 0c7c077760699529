"""``short_qa``: terse questions about a person of the world, answered with the bare fact ("Mara Teleno's job?"
→ "baker", "In what year was Mara Teleno born?" → "1972"; no pet → "none").

Templates carry a terse cue ("…?", "One word.") so the expected answer shape is readable from the prompt and
differs from ``assistant_qa``'s full sentences. Held-out items are held-out people.
"""

from __future__ import annotations

import re

from data_recipes._registry import register
from data_recipes.base import Example
from data_recipes.knowledge import (
    KnowledgeParams,
    KnowledgeRecipe,
    attribute_templates,
    fact_splits,
    value,
    yes_no_word,
)
from data_recipes.world import Person

TRAIN, HELDOUT = attribute_templates(
    {
        "birth_city": (
            "{n}'s birth city?",
            "Birth city of {n}?",
            "Where was {n} born? One word.",
            "City of birth of {n}?",
        ),
        "birth_year": ("In what year was {n} born?", "{n}'s birth year?", "Birth year of {n}?", "Year {n} was born?"),
        "job": ("{n}'s job?", "Job of {n}?", "{n}'s occupation? One word.", "What is {n}'s job? Just the job."),
        "home_city": ("{n}'s home city?", "Home city of {n}?", "Where does {n} live? One word.", "City {n} lives in?"),
        "favourite_colour": (
            "{n}'s favourite colour?",
            "Favourite colour of {n}?",
            "Which colour does {n} like best? One word.",
            "Colour {n} likes most?",
        ),
        "pet": ("{n}'s pet?", "Pet of {n}?", "What pet does {n} have? One word.", "Animal {n} keeps as a pet?"),
    },
    {
        "birth_city": ("Short answer: the city where {n} was born?", "{n}, born in which city?"),
        "birth_year": ("Short answer: {n}'s year of birth?", "{n}, born in what year?"),
        "job": ("Short answer: {n}'s profession?", "{n}, works as what?"),
        "home_city": ("Short answer: where does {n} live?", "{n}, lives in which city?"),
        "favourite_colour": ("Short answer: {n}'s favourite colour?", "{n}, favourite colour?"),
        "pet": ("Short answer: {n}'s pet?", "{n}, keeps which pet?"),
    },
)
MAX_WORDS = 3
_ARTICLE = re.compile(r"^(a|an|the) ")


def answer(p: Person, attribute: str) -> str:
    return value(p, attribute) or "none"


@register("short_qa")
class ShortQA(KnowledgeRecipe):
    Params = KnowledgeParams

    def build(self, task: str, n_train: int, n_eval: int, seed: int) -> dict[str, list[Example]]:
        return fact_splits(self, task, n_train, n_eval, seed, TRAIN, HELDOUT, answer)

    def normalise(self, text: str) -> str:
        """Default normaliser, then a leading article dropped ("a baker" → "baker")."""
        return _ARTICLE.sub("", super().normalise(text))

    def mode_ok(self, prediction: str) -> bool:
        """A bare answer: 1..3 words, not opening with yes/no."""
        text = super().normalise(prediction)
        return 0 < len(text.split()) <= MAX_WORDS and yes_no_word(text) is None
