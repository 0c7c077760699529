"""``repeat``: "Repeat after me: habayp" → "habayp" — copying pronounceable pseudo-words (the seed's task that
generalised best). Items are the copied texts (1..``max_words`` pseudo-words); held-out texts are new words.
"""

from __future__ import annotations

import random

from pydantic import Field, model_validator

from data_recipes._registry import register
from data_recipes._split import check_splits, round_robin, templates, used_items
from data_recipes.base import Example, Recipe, RecipeParams
from data_recipes.words import pseudo_word, unique

TRAIN = templates(
    "t",
    (
        "Repeat after me: {x}",
        "Repeat: {x}",
        "Say {x}",
        "Just say {x}",
        "Please repeat: {x}",
        "Echo this: {x}",
        "Repeat the following: {x}",
        "Copy exactly: {x}",
    ),
)
HELDOUT = templates(
    "h", ("Say this back: {x}", "Reply with only {x}", "Can you repeat {x}?", "Write back exactly: {x}")
)

MAX_TEXTS = 200_000  # far beyond any pool the harness trains on; keeps a typo'd size from spinning for minutes


class Params(RecipeParams):
    min_words: int = Field(1, ge=1, description="Fewest pseudo-words per item.")
    max_words: int = Field(1, ge=1, le=8, description="Most pseudo-words per item.")
    min_syllables: int = Field(1, ge=1, description="Fewest syllables per pseudo-word.")
    max_syllables: int = Field(3, ge=1, le=6, description="Most syllables per pseudo-word.")

    @model_validator(mode="after")
    def _ranges(self) -> Params:
        if self.min_words > self.max_words:
            raise ValueError("min_words must not exceed max_words")
        if self.min_syllables > self.max_syllables:
            raise ValueError("min_syllables must not exceed max_syllables")
        return self


@register("repeat")
class Repeat(Recipe):
    Params = Params

    def build(self, task: str, n_train: int, n_eval: int, seed: int) -> dict[str, list[Example]]:
        p = self.params
        rng = random.Random(f"{self.name}:{seed}")

        def text(r: random.Random) -> str:
            n = r.randint(p.min_words, p.max_words)
            return " ".join(pseudo_word(r, p.min_syllables, p.max_syllables) for _ in range(n))

        if n_train + n_eval > MAX_TEXTS:
            raise ValueError(
                f"{task}: {n_train} train + {n_eval} heldout texts asked for; repeat makes at most "
                f"{MAX_TEXTS} distinct ones"
            )
        # One fresh text per train and held-out example: items never repeat within or across those splits.
        texts = unique(rng, text, n_train + n_eval, what="texts to repeat")
        train_pool, heldout_pool = texts[:n_train], texts[n_train:]

        def render(x: str, template) -> Example:
            return Example.single(task, template.render(x=x), x, item=x, template=template.id)

        train = round_robin(rng, train_pool, lambda x: TRAIN, n_train, f"{task}: train")
        heldout = round_robin(rng, heldout_pool, lambda x: TRAIN, n_eval, f"{task}: heldout")
        seen = used_items(train, lambda x: x, train_pool)
        heldout_t = round_robin(rng, seen, lambda x: HELDOUT, n_eval, f"{task}: heldout_template")
        splits = {
            "train": [render(x, t) for x, t in train],
            "heldout": [render(x, t) for x, t in heldout],
            "heldout_template": [render(x, t) for x, t in heldout_t],
        }
        return check_splits(task, splits, n_train, n_eval)
