"""Shared ground for the letter-level recipes (``spell``, ``count``): a word pool of built-in English words
and/or pseudo-words, filtered by length, split into training and held-out words.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Literal

from pydantic import Field, model_validator

from data_recipes._split import Template, check_splits, round_robin, used_items
from data_recipes.base import Example, Recipe, RecipeParams
from data_recipes.words import WORDS, pseudo_words

MAX_PSEUDO = 50_000  # pseudo-words per pool: plenty for any realistic size; larger asks fail in round_robin


class WordParams(RecipeParams):
    source: Literal["mixed", "words", "pseudo"] = Field(
        "mixed",
        description="English words from the built-in list, pseudo-words, or both (every list word of the "
        "right length plus at least as many pseudo-words).",
    )
    min_len: int = Field(3, ge=1, description="Shortest word, in letters.")
    max_len: int = Field(10, ge=1, description="Longest word, in letters.")

    @model_validator(mode="after")
    def _range(self) -> WordParams:
        if self.min_len > self.max_len:
            raise ValueError("min_len must not exceed max_len")
        return self


def word_pool(rng: random.Random, params: WordParams, n: int) -> list[tuple[str, str]]:
    """``(word, source)`` pairs in seeded random order; pseudo-words: as many as list words, at least ``n``."""
    real = [w for w in WORDS if params.min_len <= len(w) <= params.max_len] if params.source != "pseudo" else []
    pool = [(w, "word") for w in real]
    if params.source != "words":
        want = min(max(n, len(real)), MAX_PSEUDO)
        # Pseudo-words of 1-4 syllables, keeping those of the right length.
        candidates = pseudo_words(rng, want * 4, 1, 4)
        fake = [w for w in candidates if params.min_len <= len(w) <= params.max_len][:want]
        pool += [(w, "pseudo") for w in fake]
    rng.shuffle(pool)
    return pool


class WordRecipe(Recipe):
    """Base: subclasses set TRAIN / HELDOUT templates (field ``{w}``) and ``answer(word)``."""

    Params = WordParams
    TRAIN: tuple[Template, ...]
    HELDOUT: tuple[Template, ...]
    answer: Callable[[str], str]

    def build(self, task: str, n_train: int, n_eval: int, seed: int) -> dict[str, list[Example]]:
        rng = random.Random(f"{self.name}:{seed}")
        pool = word_pool(rng, self.params, n_train + n_eval)
        if n_eval >= len(pool) and n_eval > 0:
            raise ValueError(
                f"{task}: {n_eval} held-out words asked for, but the pool has only {len(pool)} words "
                f"of {self.params.min_len}-{self.params.max_len} letters; widen the lengths"
            )
        heldout_pool, train_pool = pool[:n_eval], pool[n_eval:]

        def render(item: tuple[str, str], template: Template) -> Example:
            word, source = item
            return Example.single(
                task,
                template.render(w=word),
                self.answer(word),
                item=word,
                template=template.id,
                word=word,
                source=source,
            )

        train = round_robin(
            rng,
            train_pool,
            lambda i: self.TRAIN,
            n_train,
            f"{task}: train ({len(train_pool)} words × {len(self.TRAIN)} templates)",
        )
        heldout = round_robin(rng, heldout_pool, lambda i: self.TRAIN, n_eval, f"{task}: heldout")
        seen = used_items(train, lambda i: i[0], train_pool)
        heldout_t = round_robin(rng, seen, lambda i: self.HELDOUT, n_eval, f"{task}: heldout_template")
        splits = {
            "train": [render(i, t) for i, t in train],
            "heldout": [render(i, t) for i, t in heldout],
            "heldout_template": [render(i, t) for i, t in heldout_t],
        }
        return check_splits(task, splits, n_train, n_eval)
