"""How many new tokens greedy decoding needs, and which tokens end an answer.

- :func:`needed_new_tokens`: per task, the longest gold answer of its eval items in tokens (content + the
  end-of-turn token) — what a correct prediction must be allowed to generate;
- :func:`default_max_new_tokens`: that plus :func:`length_margin` (``eval.max_new_tokens: null``, the default);
- :func:`too_short_errors`: an explicit ``eval.max_new_tokens`` below what a task needs, one message per task;
- :func:`stop_token_ids`: every token that ends an answer — EOS, the generation config's ``eos_token_id`` list, and
  the token the chat template closes an assistant turn with (ChatML's ``<|im_end|>`` when EOS is
  ``<|endoftext|>``, as in Qwen base models).

No torch here: ``harness.config``-level code may import it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

_PROBE_ANSWER = "Xq7Zv"  # a marker that no template wraps specially, to find what follows an assistant turn


def needed_new_tokens(items: Iterable[Any]) -> dict[str, int]:
    """``{task: longest len(gold_ids)}`` over :class:`harness.data.batches.EvalItem` s (gold ids end with the end
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


def _template_end_token(tokenizer) -> int | None:
    """The special token right after an assistant message's content in the chat template, if there is one."""
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE_ANSWER}], tokenize=False
        )
    except Exception:  # noqa: BLE001 - templates may reject this conversation; then EOS alone stops decoding
        return None
    tail = text[text.find(_PROBE_ANSWER) + len(_PROBE_ANSWER) :] if _PROBE_ANSWER in text else ""
    ids = tokenizer(tail, add_special_tokens=False)["input_ids"] if tail else []
    # Named special tokens, and every added token marked special (after EOS is reassigned, ChatML's <|im_end|> is
    # only the latter).
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special.update(
        i
        for i, token in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items()
        if getattr(token, "special", False)
    )
    return ids[0] if ids and ids[0] in special else None


def stop_token_ids(tokenizer, generation_config: Any = None) -> list[int]:
    """Sorted ids that end a greedy answer: EOS, ``generation_config.eos_token_id`` (an int or a list) and the chat
    template's end-of-turn token."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    configured = getattr(generation_config, "eos_token_id", None)
    if configured is not None:
        ids.update(int(i) for i in ([configured] if isinstance(configured, int) else configured))
    end = _template_end_token(tokenizer)
    if end is not None:
        ids.add(int(end))
    return sorted(ids)
