"""From recipe examples to token arrays: chat encoding with completion-only label masks, and the fixed eval items.

Label masking is done on characters, not on separately tokenised pieces: the whole conversation is rendered with
the tokenizer's chat template and tokenised once with offsets, and a token is supervised when it overlaps the
characters of an assistant turn (its content and the end-of-turn token). That gives the exact tokens the model
sees at inference, for any tokenizer whose template renders prefixes consistently (ChatML and most others).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# The label of every position no loss is computed on (prompt tokens, padding): PyTorch's ``ignore_index``
# default. Defined here, where labels are made; batches, losses, adapters, evaluation, checks and benches import it.
IGNORE_INDEX = -100


@dataclass(frozen=True)
class Encoded:
    """A tokenised training example; ``labels`` is ``IGNORE_INDEX`` on every unsupervised position."""

    task: str
    input_ids: np.ndarray  # int64 [T]
    labels: np.ndarray  # int64 [T]

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def n_supervised(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())


@dataclass(frozen=True)
class EvalItem:
    """One evaluation prompt: the exact text fed to the model (template applied) and the gold continuation."""

    task: str
    split: str
    index: int
    prompt_text: str
    prompt_ids: list[int]
    gold_text: str  # the last assistant turn's content
    gold_ids: list[int]  # its supervised tokens (content + end-of-turn token)
    meta: dict[str, Any] = field(default_factory=dict)


def _render(tokenizer, messages: Sequence[dict[str, str]], generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(
    tokenizer, messages: Sequence[dict[str, str]], prompts: dict[int, str] | None = None
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of every assistant turn (content + end token).

    ``prompts``, when given, receives the render of ``messages[:i]`` with the generation prompt for every
    assistant turn ``i`` (:func:`eval_items` takes the last one as its prompt instead of rendering it again)."""
    # Each distinct render once: the template engine dominates encoding (a whole turn's render equals the prefix
    # ending there, and the last prefix is the conversation itself).
    text = _render(tokenizer, messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = _render(tokenizer, messages[:i], generation_prompt=True)
        if prompts is not None:
            prompts[i] = prompt
        start = len(prompt)
        upto = text if i + 1 == len(messages) else _render(tokenizer, messages[: i + 1])
        end = len(upto)
        if text[:end] != upto:
            raise ValueError("the chat template does not render prefixes consistently; cannot mask labels")
        # The separator after the end-of-turn token (ChatML's newline) is not the model's to predict.
        end = start + len(text[start:end].rstrip())
        spans.append((start, end))
    return text, spans


def encode_examples(tokenizer, examples: Sequence[Any]) -> list[Encoded]:
    """Tokenise examples (``data_recipes.Example``) with completion-only labels, in one batched tokenizer call."""
    return _encode(tokenizer, examples)[0]


def _encode(tokenizer, examples: Sequence[Any]) -> tuple[list[Encoded], list[dict[int, str]]]:
    """:func:`encode_examples`, and per example the generation-prompt renders :func:`assistant_spans` made."""
    if not examples:  # an empty split (a user file has no heldout_template): nothing to tokenise
        return [], []
    prompts: list[dict[int, str]] = [{} for _ in examples]
    rendered = [assistant_spans(tokenizer, ex.messages, p) for ex, p in zip(examples, prompts)]
    batch = tokenizer([text for text, _ in rendered], add_special_tokens=False, return_offsets_mapping=True)
    out = []
    for ex, (_, spans), ids, offsets in zip(examples, rendered, batch["input_ids"], batch["offset_mapping"]):
        ids = np.asarray(ids, dtype=np.int64)
        starts, ends = np.asarray(offsets, dtype=np.int64).reshape(-1, 2).T
        # A token is supervised when it covers characters and overlaps an assistant span.
        supervised = np.zeros(len(ids), dtype=bool)
        for span_start, span_end in spans:
            supervised |= (starts < span_end) & (ends > span_start)
        labels = np.where(supervised & (ends > starts), ids, IGNORE_INDEX)
        # Position t predicts token t+1: shift here once so the loop needs no per-step shifting.
        out.append(Encoded(ex.task, ids, np.concatenate([labels[1:], [IGNORE_INDEX]])))
    return out, prompts


def eval_items(tokenizer, examples: Sequence[Any], split: str) -> list[EvalItem]:
    """Evaluation prompts: everything before the last assistant turn, with the generation prompt appended.
    An empty split gives no items (the caller skips it and says so)."""
    encoded, prompts = _encode(tokenizer, examples)
    last = [len(ex.messages) - 1 for ex in examples]
    prompt_texts = [
        p[i] if i in p else _render(tokenizer, ex.messages[:-1], generation_prompt=True)
        for ex, p, i in zip(examples, prompts, last)
    ]
    # One batched call: a fast tokenizer gives each text the ids it gives it alone.
    all_prompt_ids = tokenizer(prompt_texts, add_special_tokens=False)["input_ids"] if examples else []
    items = []
    for index, (ex, enc, prompt_text, prompt_ids) in enumerate(zip(examples, encoded, prompt_texts, all_prompt_ids)):
        n = len(prompt_ids)
        if list(enc.input_ids[:n]) != list(prompt_ids):
            raise ValueError(f"task {ex.task!r}: the prompt tokenises differently alone and in the conversation")
        # labels are shifted: labels[n-1 ...] are the tokens after the prompt
        gold = enc.labels[n - 1 :]
        gold_ids = [
            int(t) for t in gold[: int(np.argmax(gold == IGNORE_INDEX)) if (gold == IGNORE_INDEX).any() else None]
        ]
        items.append(EvalItem(ex.task, split, index, prompt_text, list(prompt_ids), ex.answer, gold_ids, dict(ex.meta)))
    return items


def position_limit(model_config) -> int | None:
    """The longest sequence the model can take (learned positions: GPT-2's ``n_positions``; RoPE models'
    ``max_position_embeddings``), or None when its config states none."""
    for name in ("n_positions", "max_position_embeddings"):
        value = getattr(model_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def fit_eval_items(
    items: Sequence[EvalItem], limit: int, max_new_tokens: int
) -> tuple[list[EvalItem], dict[tuple[str, str], int]]:
    """The items whose prompt plus continuation fits in ``limit`` positions (``min(train.max_length, the model's
    position limit)``), and the number dropped per ``(task, split)``. The continuation is the longer of the gold
    tokens (teacher-forced metrics) and ``max_new_tokens`` (greedy decoding). A 4,000-word prompt would otherwise
    end in an IndexError on learned positions, and grow memory without bound on RoPE models."""
    kept: list[EvalItem] = []
    dropped: dict[tuple[str, str], int] = {}
    for item in items:
        if len(item.prompt_ids) + max(len(item.gold_ids), max_new_tokens) <= limit:
            kept.append(item)
        else:
            dropped[(item.task, item.split)] = dropped.get((item.task, item.split), 0) + 1
    return kept, dropped
