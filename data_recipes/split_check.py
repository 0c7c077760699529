"""The split check every recipe's output passes before a run or ``harness validate`` uses it (issue 51, item 7).

Two breaches make the held-out scores meaningless, and each is refused (:class:`SplitBreach`, one line naming the
split, the count and the first offending item; :func:`harness.runs.planning.prepare.build_task_data` adds the task):

- **a held-out item that is a training item**: an item of ``heldout`` or ``heldout_template`` whose prompt — every
  turn before the gold answer, and the image (its ``meta["image_id"]``, or its pixels) — is also a ``train`` item's.
  That is what both splits promise (:mod:`data_recipes.base`): ``heldout`` holds items never trained on,
  ``heldout_template`` trained items in a phrasing never trained on. An image recipe's prompts may repeat across
  splits (the novelty is in the image), which the image in the key allows. A recipe whose one prompt may carry
  several answers (a user's file: :mod:`data_recipes.loaders` keeps only identical rows off both sides) sets
  ``heldout_overlap = "prompt_answer"``: there the breach is the same prompt *and* answer;
- **a recipe that is not deterministic for its seed**: a second build with the same params, world and seed gives
  other pools (a recipe that draws from ``random`` without its seed). A recipe that reads a user's file
  (``rebuild_check = False``: the loaders, whose shuffle is seeded by construction) is not built twice.

Cheap by construction: each example is reduced to a 16-byte digest of its prompt (and answer); nothing is copied.
The cost on the shipped experiments is in ``docs/experiment-file.md``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from data_recipes.base import SPLITS, Example

HELD_OUT_SPLITS = ("heldout", "heldout_template")
OVERLAP_RULES = ("prompt", "prompt_answer")


class SplitBreach(ValueError):
    """A recipe's splits that break their meaning; ``str()`` is one line (split, count, first offending item)."""


def _image_key(example: Example) -> str:
    if example.image is None:
        return ""
    image_id = example.meta.get("image_id")
    if image_id is not None:
        return str(image_id)
    return hashlib.blake2b(example.image.tobytes(), digest_size=16).hexdigest()


def prompt_digest(example: Example, with_answer: bool = False) -> bytes:
    """16 bytes standing for the example's prompt (every turn before the gold answer, and its image) — and its
    answer when ``with_answer``."""
    turns = example.messages if with_answer else example.messages[:-1]
    text = json.dumps([list(turns), _image_key(example)], sort_keys=True, ensure_ascii=False)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def example_digest(example: Example) -> bytes:
    """16 bytes standing for the whole example (turns, meta, image): what two builds must agree on."""
    text = json.dumps([list(example.messages), example.meta, _image_key(example)], sort_keys=True, default=str)
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


def _shown(example: Example) -> str:
    prompt = example.prompt if len(example.prompt) <= 80 else example.prompt[:77] + "..."
    return repr(prompt)


def check_held_out(splits: dict[str, list[Example]], rule: str = "prompt") -> None:
    """Raise :class:`SplitBreach` at the first held-out split holding training items under ``rule``
    (:data:`OVERLAP_RULES`; see the module docstring)."""
    if rule not in OVERLAP_RULES:
        raise ValueError(f"heldout_overlap {rule!r} is not one of {', '.join(OVERLAP_RULES)}")
    with_answer = rule == "prompt_answer"
    trained = {prompt_digest(ex, with_answer) for ex in splits.get("train", [])}
    for split in HELD_OUT_SPLITS:
        pool = splits.get(split, [])
        clash = [ex for ex in pool if prompt_digest(ex, with_answer) in trained]
        if clash:
            what = "prompt and answer" if with_answer else "prompt"
            raise SplitBreach(
                f"split {split}: {len(clash)} of {len(pool)} items are training items (same {what} as a train "
                f"item); first: {_shown(clash[0])}"
            )


def check_deterministic(splits: dict[str, list[Example]], again: dict[str, list[Example]], seed: int) -> None:
    """Raise :class:`SplitBreach` at the first split whose second build (``again``, same seed) differs."""
    for split in [s for s in SPLITS if s in splits or s in again] + sorted(set(splits) - set(SPLITS)):
        first, second = splits.get(split, []), again.get(split, [])
        a, b = [example_digest(ex) for ex in first], [example_digest(ex) for ex in second]
        if a == b:
            continue
        differ = [i for i in range(max(len(a), len(b))) if i >= len(a) or i >= len(b) or a[i] != b[i]]
        shown = _shown(first[differ[0]]) if differ[0] < len(first) else _shown(second[differ[0]])
        raise SplitBreach(
            f"split {split}: {len(differ)} of {max(len(a), len(b))} items differ between two builds with seed "
            f"{seed} (the recipe is not deterministic for its seed: draw from random.Random(seed)); first: {shown}"
        )


def check_recipe_splits(
    recipe: Any, splits: dict[str, list[Example]], seed: int, rebuild: Callable[[], dict] | None = None
) -> None:
    """Both checks of the module docstring on one task's built ``splits``; ``rebuild()`` builds them again from a
    fresh recipe with the same params, world, sizes and seed (skipped where the recipe reads a user's file)."""
    check_held_out(splits, getattr(recipe, "heldout_overlap", "prompt"))
    if rebuild is not None and getattr(recipe, "rebuild_check", True):
        check_deterministic(splits, rebuild(), seed)
