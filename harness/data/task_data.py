"""A run's task data as the recipes built it — every task's splits, the world corpus, the loss pool, the forgetting
probe's reference text — and :class:`DataError`, the one error bad task data raises before any training (its
message names the task or the YAML path)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


class DataError(Exception):
    """Bad task data found before training (empty pool, unreadable file…); the message names the task."""


class TextOnlyModel(ValueError):
    """A task whose examples have images, for a text model (raised by the model's IO,
    :meth:`harness.models.modality.TextIO.encode_train`)."""

    def __init__(self):
        super().__init__(
            "its examples have images but the model is text-only (model.builtin: llava-tiny, or an image-text model.hf)"
        )


#: The refusal of ``tasks.<task>.system`` over examples that already carry a system turn
#: (:func:`data_recipes.base.with_system_turn` raises ``ValueError``).
SYSTEM_TURN_TWICE = (
    "tasks.{task}.system: the recipe's examples already carry a system turn (a data file's system column?); "
    "set one or the other"
)


@dataclass
class TaskData:
    recipes: dict[str, Any]  # task -> Recipe instance
    splits: dict[str, dict[str, list]]  # task -> split -> [Example]
    corpus: list[str]
    world: Any = None  # the synthetic world (the shipped benchmarks ask about it)
    reference: tuple[str, list[str]] | None = None  # the forgetting probe's reference text: (name, documents)
    loss_splits: dict[str, dict[str, list]] = field(default_factory=dict)  # task -> loss_<split> -> [Example]
    loss_dropped: dict[str, int] = field(default_factory=dict)  # task -> loss-pool items dropped (trained prompts)


def task_data_hash(splits: dict[str, dict[str, list]], corpus: Sequence[str]) -> str:
    """SHA-256 of every task's examples (all splits) and of the world corpus the tokenizer and pretraining read."""
    digest = hashlib.sha256()
    for task in sorted(splits):
        for split in sorted(splits[task]):
            for ex in splits[task][split]:
                digest.update(
                    json.dumps([task, split, ex.task, ex.messages, ex.meta], sort_keys=True, default=str).encode()
                )
    digest.update("\x00".join(corpus).encode())
    return digest.hexdigest()
