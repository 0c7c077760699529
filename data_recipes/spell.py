"""``spell``: "Spell the word 'cat'" → "c-a-t", over English words and pseudo-words (held-out items: new words)."""

from __future__ import annotations

import re

from data_recipes._registry import register
from data_recipes._split import templates
from data_recipes._wordtask import WordRecipe

_SPELLED = re.compile(r"^[a-z](-[a-z])+$")


@register("spell")
class Spell(WordRecipe):
    TRAIN = templates(
        "t",
        (
            "Spell the word '{w}'",
            "Spell '{w}'",
            "How do you spell '{w}'?",
            "Spell {w} letter by letter.",
            "Give me the spelling of '{w}'",
            "Write '{w}' with hyphens between the letters.",
        ),
    )
    HELDOUT = templates(
        "h", ("Please spell out '{w}'.", "What are the letters of '{w}'?", "Break '{w}' into its letters.")
    )

    @staticmethod
    def answer(word: str) -> str:
        return "-".join(word)

    def normalise(self, text: str) -> str:
        """Default normaliser, then all whitespace removed ("c - a - t" → "c-a-t")."""
        return re.sub(r"\s+", "", super().normalise(text))

    def mode_ok(self, prediction: str) -> bool:
        """Single letters joined by hyphens."""
        return bool(_SPELLED.match(self.normalise(prediction)))
