"""Special-token strings inside data text: found before encoding, then rejected or escaped.

A fast tokenizer turns the *text* ``<|im_end|>`` into the special token wherever it appears, so an answer that
contains ``<|im_end|>\\n<|im_start|>user …`` trains the model to end its turn mid-answer. The policy
``data.special_tokens_in_text`` decides what happens to such rows:

- ``error`` (default): a ``ValueError`` naming the task, split, row, message role and the token;
- ``escape``: a zero-width space (U+200B) is put after the first character of every occurrence, so the text reads
  the same but tokenises as plain characters (no special-token id in its encoding).

The strings checked are the tokenizer's special tokens plus its added tokens that look like control markup
(``<…>`` or ``[…]``, e.g. Qwen's ``<think>``), since those are matched as single tokens too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any, Literal

SpecialTokenPolicy = Literal["error", "escape"]
ESCAPE_CHAR = "\u200b"  # zero-width space: invisible when shown, and splits the string for the tokenizer


def special_token_strings(tokenizer) -> tuple[str, ...]:
    """Strings the tokenizer would encode as one special / control token, longest first."""
    found = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).values():
        content = getattr(added, "content", str(added))
        markup = len(content) > 2 and ((content[0], content[-1]) in {("<", ">"), ("[", "]")})
        if getattr(added, "special", False) or markup:
            found.add(content)
    return tuple(sorted((s for s in found if s), key=lambda s: (-len(s), s)))


@lru_cache(maxsize=32)
def _pattern(strings: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(re.escape(s) for s in strings))


def find_special_token_strings(text: str, tokenizer) -> list[str]:
    """The special-token strings occurring in ``text``, in order of first occurrence, without repeats."""
    strings = special_token_strings(tokenizer)
    if not strings:
        return []
    return list(dict.fromkeys(m.group(0) for m in _pattern(strings).finditer(text)))


def escape_special_token_strings(text: str, tokenizer) -> str:
    """``text`` with every special-token string broken by a zero-width space after its first character."""
    strings = special_token_strings(tokenizer)
    if not strings:
        return text
    return _pattern(strings).sub(lambda m: m.group(0)[0] + ESCAPE_CHAR + m.group(0)[1:], text)


def apply_special_token_policy(
    examples: Sequence[Any], tokenizer, policy: SpecialTokenPolicy, task: str, split: str
) -> list[Any]:
    """``examples`` (``data_recipes.Example``) checked against ``policy``: unchanged when no message contains a
    special-token string; with ``escape``, the offending messages escaped; with ``error``, a ``ValueError`` for
    the first offending row. Call it on every split of every task before tokenizer training and encoding."""
    if policy not in ("error", "escape"):
        raise ValueError(f"data.special_tokens_in_text must be 'error' or 'escape', got {policy!r}")
    out = []
    for index, ex in enumerate(examples):
        hits = [(m["role"], find_special_token_strings(m["content"], tokenizer)) for m in ex.messages]
        hits = [(role, tokens) for role, tokens in hits if tokens]
        if not hits:
            out.append(ex)
            continue
        if policy == "error":
            role, tokens = hits[0]
            row = ex.meta.get("row", ex.meta.get("item", index))
            raise ValueError(
                f"task {task!r}, split {split!r}, row {row}: the {role} text contains the special token "
                f"{tokens[0]!r}, which would be tokenised as the control token itself; clean the data "
                "or set data.special_tokens_in_text: escape"
            )
        messages = tuple({**m, "content": escape_special_token_strings(m["content"], tokenizer)} for m in ex.messages)
        out.append(replace(ex, messages=messages))
    return out
