"""``count``: "How many letters are in 'hat'?" → "3", over English words and pseudo-words (held-out: new words)."""

from __future__ import annotations

import re

from data_recipes._registry import register
from data_recipes._split import templates
from data_recipes._wordtask import WordRecipe

_INT = re.compile(r"^\d+$")


@register("count")
class Count(WordRecipe):
    TRAIN = templates(
        "t",
        (
            "How many letters are in '{w}'?",
            "Count the letters in '{w}'",
            "How long is the word '{w}'?",
            "Number of letters in '{w}'?",
            "How many letters does '{w}' have?",
            "Letter count of '{w}'?",
        ),
    )
    HELDOUT = templates(
        "h",
        (
            "Tell me how many letters '{w}' has.",
            "What is the length of '{w}' in letters?",
            "Count how many letters make up '{w}'.",
        ),
    )

    @staticmethod
    def answer(word: str) -> str:
        return str(len(word))

    def is_correct(self, prediction: str, gold: str) -> bool:
        said = self.normalise(prediction)
        return bool(_INT.match(said)) and int(said) == int(self.normalise(gold))

    def mode_ok(self, prediction: str) -> bool:
        """A bare integer."""
        return bool(_INT.match(self.normalise(prediction)))
