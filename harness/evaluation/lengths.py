"""Which tokens end a greedy answer (how many an answer needs is :mod:`harness.data.answer_lengths`'s).

- :func:`stop_token_ids`: every token that ends an answer — EOS, the generation config's ``eos_token_id`` list, and
  the token the chat template closes an assistant turn with (ChatML's ``<|im_end|>`` when EOS is
  ``<|endoftext|>``, as in Qwen base models).

No torch here: ``harness.config``-level code may import it.
"""

from __future__ import annotations

from typing import Any

_PROBE_ANSWER = "Xq7Zv"  # a marker that no template wraps specially, to find what follows an assistant turn


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
