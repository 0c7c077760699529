"""The forgetting probe's reference text as documents (:mod:`harness.evaluation.forgetting` measures them):

- **default** (builtin base): :data:`DEFAULT_DOCUMENTS` documents drawn by :func:`data_recipes.world.heldout_corpus`
  from the run's world with a seed of their own, every document that also occurs in the pretraining corpus left out;
- **a user's file** (``eval.reference_text``): one document per non-blank line (UTF-8), in file order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from data_recipes.world import heldout_corpus

#: Documents of the default (world) reference text: enough for a paired interval, one small forward pass each.
DEFAULT_DOCUMENTS = 64


class ReferenceTextError(ValueError):
    """A reference text file that cannot be used; ``str()`` is one line naming the path."""


def reference_documents(path: str | None, world: Any, pretraining: list[str], world_spec: Any) -> tuple[str, list]:
    """``(name, documents)``: the user's file at ``path`` (named by its stem), else a held-out sample of the world
    corpus (``world``, under ``world_spec``'s ``docs_per_person`` and ``permute``), named ``world``."""
    if path:
        return Path(path).stem, file_documents(path)
    return "world", heldout_corpus(
        world, pretraining, DEFAULT_DOCUMENTS, world_spec.docs_per_person, world_spec.permute
    )


def file_documents(path: str | Path) -> list[str]:
    """The documents of a user's reference text: one per non-blank line. Raises :class:`ReferenceTextError` (one
    line, naming the path) for a missing, unreadable or empty file."""
    path = Path(path)
    if not path.is_file():
        raise ReferenceTextError(f"no reference text file '{path}'")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ReferenceTextError(f"cannot read reference text file '{path}': {type(e).__name__}") from None
    docs = [line.strip() for line in lines if line.strip()]
    if not docs:
        raise ReferenceTextError(f"reference text file '{path}' has no documents (one per non-blank line)")
    return docs
