"""A user's own plug-ins, outside the harness package: a recipe (``count_letters``) and an evaluator
(``answer_length``). An experiment names this file under ``plugins:``; docs/extending.md walks it."""

from __future__ import annotations

import random

from pydantic import Field

from data_recipes import Example, Recipe, RecipeParams, register
from harness.core.metrics import continuous
from harness.core.plugins import PluginParams
from harness.core.registry import EVALUATORS
from harness.evaluation.components import NEED_GREEDY, Component


class CountLettersParams(RecipeParams):
    min_letters: int = Field(2, ge=1, description="Shortest word.")
    max_letters: int = Field(6, ge=1, le=12, description="Longest word.")


@register("count_letters")
class CountLetters(Recipe):
    """ "How many letters in 'abca'?" → "4". Held-out items are words never trained on; held-out templates ask
    about training words in a phrasing never trained on."""

    Params = CountLettersParams

    def build(self, task, n_train, n_eval, seed):
        rng = random.Random(seed)
        words: list[str] = []
        while len(words) < n_train + n_eval:
            length = rng.randint(self.params.min_letters, self.params.max_letters)
            word = "".join(rng.choice("abcdefgh") for _ in range(length))
            if word not in words:
                words.append(word)
        train, heldout = words[:n_train], words[n_train:]

        def example(word: str, template: str) -> Example:
            return Example.single(task, template.format(word), str(len(word)), word=word)

        return {
            "train": [example(w, "How many letters in {!r}?") for w in train],
            "heldout": [example(w, "How many letters in {!r}?") for w in heldout],
            "heldout_template": [example(w, "Count the letters of {}.") for w in train[:n_eval]],
        }

    def mode_ok(self, prediction: str) -> bool:
        return prediction.strip().isdigit()  # the answer's shape: a number


class AnswerLengthParams(PluginParams):
    unit: str = Field("chars", pattern="^(chars|words)$", description="Measure answers in chars or words.")


@EVALUATORS.plugin("answer_length")
class AnswerLength(Component):
    """``answer_length``: the mean length of the greedy answers (reuses the greedy decoding pass)."""

    Params = AnswerLengthParams
    needs = frozenset({NEED_GREEDY})
    emits = (continuous("answer_length", higher_is_better=None),)  # a length: neither longer nor shorter is better

    def metrics(self, records, recipe, ctx):
        sizes = [len(r.pred or "") if self.params.unit == "chars" else len((r.pred or "").split()) for r in records]
        return {"answer_length": sum(sizes) / len(sizes) if sizes else float("nan")}
