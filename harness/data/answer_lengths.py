"""How many new tokens a task's answers need: arithmetic on eval items' gold tokens, no tokenizer, no torch.

- :func:`needed_new_tokens`: per task, the longest gold answer of its eval items in tokens (content + the
  end-of-turn token) — what a correct prediction must be allowed to generate;
- :func:`default_max_new_tokens`: that plus :func:`length_margin` (``eval.max_new_tokens: null``, the default);
- :func:`too_short_errors`: an explicit ``eval.max_new_tokens`` below what a task needs, one message per task.

Which tokens end an answer is the decoder's (:func:`harness.evaluation.lengths.stop_token_ids`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def needed_new_tokens(items: Iterable[Any]) -> dict[str, int]:
    """``{task: longest len(gold_ids)}`` over :class:`harness.data.encoding.EvalItem` s (gold ids end with the end
    token)."""
    out: dict[str, int] = {}
    for item in items:
        out[item.task] = max(out.get(item.task, 0), len(item.gold_ids))
    return out


def length_margin(needed: int) -> int:
    """Tokens allowed beyond the longest gold answer: max(4, 25 %). A prediction a few tokens longer than the gold
    is then still seen ending (scored wrong, not cut off), and a model that does not stop is flagged ``truncated``
    after a bounded number of extra steps rather than decoding to a large fixed cap."""
    return max(4, math.ceil(needed / 4))


def default_max_new_tokens(items: Iterable[Any]) -> int:
    """What ``eval.max_new_tokens: null`` resolves to for these items (1 when there are none)."""
    needed = max(needed_new_tokens(items).values(), default=0)
    return needed + length_margin(needed) if needed else 1


def too_short_errors(max_new_tokens: int | None, needed: dict[str, int]) -> list[str]:
    """One message per task whose longest gold answer does not fit in an explicit ``max_new_tokens``."""
    if max_new_tokens is None:
        return []
    return [
        f"eval.max_new_tokens={max_new_tokens} cuts task {task!r}: its longest gold answer needs {n} tokens "
        f"(end token included); raise it to at least {n} or leave it null (auto)"
        for task, n in sorted(needed.items())
        if n > max_new_tokens
    ]
