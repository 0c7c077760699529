"""Shared split assembly: turn item pools and templates into the three splits every recipe returns.

Vocabulary: an *item* is the thing being asked about (a word, a person's fact, an operand pair); a *combo* is
what varies around one item (a template, an operand order). ``train`` and ``heldout`` draw from disjoint item
pools with training templates; ``heldout_template`` takes items that appear in ``train`` and renders them with
templates never used in training.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from data_recipes.base import Example

Item = TypeVar("Item")
C = TypeVar("C")


@dataclass(frozen=True)
class Template:
    """A phrasing with a stable id (stored in ``meta["template"]``) and a ``str.format`` text."""

    id: str
    text: str

    def render(self, **fields: Any) -> str:
        return self.text.format(**fields)


def templates(prefix: str, texts: Sequence[str]) -> tuple[Template, ...]:
    """Number ``texts`` as ``{prefix}0``, ``{prefix}1``…"""
    return tuple(Template(f"{prefix}{i}", t) for i, t in enumerate(texts))


def round_robin(
    rng: random.Random,
    items: Sequence[Item],
    combos: Callable[[Item], Sequence[C]],
    n: int,
    what: str,
    shuffle: bool = True,
) -> list[tuple[Item, C]]:
    """``n`` distinct ``(item, combo)`` pairs that cover as many items as possible.

    Round k gives every item its k-th combo (combos in a seeded random order per item), so items repeat only
    once every item has been used, and templates are spread evenly. ``shuffle=False`` keeps the item order
    (callers use it to interleave yes/no items). Raises ``ValueError`` naming ``what`` if fewer exist.
    """
    items = list(items)
    if shuffle:
        rng.shuffle(items)
    lists = []
    for item in items:
        options = list(combos(item))
        rng.shuffle(options)
        lists.append(options)
    total = sum(len(o) for o in lists)
    if n > total:
        raise ValueError(
            f"{what}: {n} examples asked for, but only {total} distinct ones exist; "
            "lower the size or widen the recipe's params"
        )
    out: list[tuple[Item, C]] = []
    k = 0
    while len(out) < n:
        for item, options in zip(items, lists):
            if k < len(options):
                out.append((item, options[k]))
                if len(out) == n:
                    break
        k += 1
    return out


def used_items(
    pairs: Sequence[tuple[Item, Any]], key: Callable[[Item], Hashable], fallback: Sequence[Item]
) -> list[Item]:
    """Distinct items of ``pairs`` in first-use order; ``fallback`` (the train pool) when there are none."""
    seen: dict[Hashable, Item] = {}
    for item, _ in pairs:
        seen.setdefault(key(item), item)
    return list(seen.values()) if seen else list(fallback)


def check_splits(task: str, splits: dict[str, list[Example]], n_train: int, n_eval: int) -> dict[str, list[Example]]:
    """Sanity checks every generated recipe must pass (a failure here is a recipe bug, not a user error)."""
    sizes = {"train": n_train, "heldout": n_eval, "heldout_template": n_eval}
    for split, n in sizes.items():
        if len(splits[split]) != n:
            raise AssertionError(f"{task}: {split} has {len(splits[split])} examples, expected {n}")
    train_prompts = {ex.prompt for ex in splits["train"]}
    clash = [ex.prompt for ex in splits["heldout_template"] if ex.prompt in train_prompts]
    if clash:
        raise AssertionError(f"{task}: heldout_template prompt also in train: {clash[0]!r}")
    return splits
