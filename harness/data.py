"""From recipe examples to token tensors: chat encoding with completion-only label masks, the stage mixture
stream (weights | natural | counts), and length-grouped padded batches.

Label masking is done on characters, not on separately tokenised pieces: the whole conversation is rendered with
the tokenizer's chat template and tokenised once with offsets, and a token is supervised when it overlaps the
characters of an assistant turn (its content and the end-of-turn token). That gives the exact tokens the model
sees at inference, for any tokenizer whose template renders prefixes consistently (ChatML and most others).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np

from harness.config import Mixture
from harness.losses import IGNORE_INDEX


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


def assistant_spans(tokenizer, messages: Sequence[dict[str, str]],
                    prompts: Optional[dict[int, str]] = None) -> tuple[str, list[tuple[int, int]]]:
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
    prompt_texts = [p[i] if i in p else _render(tokenizer, ex.messages[:-1], generation_prompt=True)
                    for ex, p, i in zip(examples, prompts, last)]
    # One batched call: a fast tokenizer gives each text the ids it gives it alone.
    all_prompt_ids = tokenizer(prompt_texts, add_special_tokens=False)["input_ids"] if examples else []
    items = []
    for index, (ex, enc, prompt_text, prompt_ids) in enumerate(zip(examples, encoded, prompt_texts, all_prompt_ids)):
        n = len(prompt_ids)
        if list(enc.input_ids[:n]) != list(prompt_ids):
            raise ValueError(f"task {ex.task!r}: the prompt tokenises differently alone and in the conversation")
        # labels are shifted: labels[n-1 ...] are the tokens after the prompt
        gold = enc.labels[n - 1:]
        gold_ids = [int(t) for t in gold[: int(np.argmax(gold == IGNORE_INDEX)) if (gold == IGNORE_INDEX).any() else None]]
        items.append(EvalItem(ex.task, split, index, prompt_text, list(prompt_ids), ex.answer, gold_ids, dict(ex.meta)))
    return items


def position_limit(model_config) -> Optional[int]:
    """The longest sequence the model can take (learned positions: GPT-2's ``n_positions``; RoPE models'
    ``max_position_embeddings``), or None when its config states none."""
    for name in ("n_positions", "max_position_embeddings"):
        value = getattr(model_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def fit_eval_items(items: Sequence[EvalItem], limit: int,
                   max_new_tokens: int) -> tuple[list[EvalItem], dict[tuple[str, str], int]]:
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


# ----------------------------------------------------------------------------------------------------------------
# Mixture stream
# ----------------------------------------------------------------------------------------------------------------


def mixture_stream(mixture: Mixture, pool_sizes: dict[str, int], n_examples: int,
                   rng: np.random.Generator) -> list[tuple[str, int]]:
    """The stage's sequence of ``(task, pool index)`` draws, exactly ``n_examples`` long (counts: Σ counts).

    - weights: the task of every draw is sampled with probability w/Σw; within a task, examples are taken in a
      fresh random order each pass over its pool (so no example repeats before the whole pool has been seen);
    - natural: the stage's pools are concatenated and shuffled, and reshuffled for each further pass;
    - counts: exactly ``counts[t]`` examples of task t (without replacement unless ``replace``), shuffled.

    (``datasets.interleave_datasets`` does the weights case, but it ends or oversamples when a pool runs out,
    which changes the effective proportions; a stage here is a fixed number of steps with stated semantics.)
    """
    if mixture.kind == "weights":
        tasks = mixture.tasks
        probs = np.array([mixture.weights[t] for t in tasks], dtype=np.float64)
        choice = rng.choice(len(tasks), size=n_examples, p=probs / probs.sum())
        cursors = {t: _Cycler(pool_sizes[t], rng) for t in tasks}
        return [(tasks[c], cursors[tasks[c]].next()) for c in choice]
    if mixture.kind == "natural":
        everything = [(t, i) for t in mixture.tasks for i in range(pool_sizes[t])]
        out: list[tuple[str, int]] = []
        while len(out) < n_examples:
            order = rng.permutation(len(everything))
            out.extend(everything[j] for j in order[: n_examples - len(out)])
        return out
    draws = []
    for task, n in mixture.counts.items():
        if mixture.replace:
            idx = rng.integers(0, pool_sizes[task], size=n)
        else:
            idx = rng.permutation(pool_sizes[task])[:n]
        draws.extend((task, int(i)) for i in idx)
    return [draws[j] for j in rng.permutation(len(draws))]


class _Cycler:
    """Indices 0..n-1 in a random order, reshuffled at each pass."""

    def __init__(self, n: int, rng: np.random.Generator):
        self.n, self.rng, self.order, self.pos = n, rng, rng.permutation(n), 0

    def next(self) -> int:
        if self.pos == self.n:
            self.order, self.pos = self.rng.permutation(self.n), 0
        self.pos += 1
        return int(self.order[self.pos - 1])


def length_grouped_batches(examples: list[Encoded], batch_size: int, group: int,
                           rng: np.random.Generator) -> list[list[Encoded]]:
    """Split the stream into batches of ``batch_size``; with ``group`` > 1, group similar lengths together.

    Grouping works on windows of batches: the stream is split evenly into windows of at least ``group`` batches
    (fewer than ``2 × group``; a shorter stream is one window: a 37-step stage with ``group: 32`` is one window of
    37, not 32 and a short one of 5 that would pad much more). Within a window the grouping is *stratified by
    task*: each task's examples are sorted by length and dealt across the window's batches in that order, so batch
    ``j`` holds the ``j``-th slice of every task — similar lengths within a task, and the window's task
    composition (≈ the stage's mixture) in every batch. A plain length sort would instead fill each batch with one
    task (the longest-answer task's batch, the shortest's…): consecutive steps then train on different single
    tasks, a seesaw made by the batcher. The window's batches are then shuffled, so long and short interleave.

    Within one task, grouped batches still hold one length class of the data (for addition, one answer length):
    ``bench/plain_vs_harness.py`` measures what that costs, which is why grouping is off by default.
    """
    if group <= 1:
        return [examples[i:i + batch_size] for i in range(0, len(examples), batch_size)]
    batches: list[list[Encoded]] = []
    n_batches = -(-len(examples) // batch_size)
    n_windows = max(1, n_batches // group)
    bounds = [k * n_batches // n_windows * batch_size for k in range(n_windows + 1)]
    for start, end in zip(bounds, bounds[1:]):
        chunk = _stratified_by_task(examples[start:end])
        chunk_batches = [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
        batches.extend(chunk_batches[j] for j in rng.permutation(len(chunk_batches)))
    return batches


def _stratified_by_task(window: list[Encoded]) -> list[Encoded]:
    """The window ordered by each example's length *quantile within its task*: cutting the result into
    consecutive batches deals every task's examples across all batches in length order."""
    by_task: dict[str, list[Encoded]] = {}
    for example in window:
        by_task.setdefault(example.task, []).append(example)
    keyed = []
    for task_index, members in enumerate(by_task.values()):
        members.sort(key=lambda e: e.length)  # stable: equal lengths keep their stream order
        keyed += [((rank + 0.5) / len(members), task_index, e) for rank, e in enumerate(members)]
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [e for _, _, e in keyed]


@dataclass
class Batch:
    input_ids: Any  # LongTensor [B, T]
    attention_mask: Any  # LongTensor [B, T]
    labels: Any  # LongTensor [B, T], already shifted (position t predicts token t+1)
    tasks: list[str]
    n_real_tokens: int
    n_padded_tokens: int
    # Flat positions (row × T + t) of the supervised tokens, in row-major order: the loop gathers hidden states and
    # labels with them, so it never searches the label mask on the device (no host sync). Computed when absent.
    supervised: Any = None  # LongTensor [N]

    def __post_init__(self):
        if self.supervised is None:
            self.supervised = (self.labels.flatten() != IGNORE_INDEX).nonzero().flatten()

    def to(self, device) -> "Batch":
        """The batch on ``device``; to a GPU through pinned memory, without blocking the host."""
        import torch

        device = torch.device(device)
        if self.input_ids.device == device:
            return self

        def move(t):
            if device.type != "cuda":
                return t.to(device)
            return (t.pin_memory() if t.device.type == "cpu" else t).to(device, non_blocking=True)

        return Batch(move(self.input_ids), move(self.attention_mask), move(self.labels), self.tasks,
                     self.n_real_tokens, self.n_padded_tokens, move(self.supervised))


def collate(examples: list[Encoded], pad_id: int) -> Batch:
    """Right-pad a batch; padding gets attention 0 and no label."""
    import torch

    width = max(e.length for e in examples)
    ids = np.full((len(examples), width), pad_id, dtype=np.int64)
    labels = np.full((len(examples), width), IGNORE_INDEX, dtype=np.int64)
    mask = np.zeros((len(examples), width), dtype=np.int64)
    for row, e in enumerate(examples):
        ids[row, : e.length] = e.input_ids
        labels[row, : e.length] = e.labels
        mask[row, : e.length] = 1
    real = int(mask.sum())
    supervised = np.flatnonzero(labels != IGNORE_INDEX)
    return Batch(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(labels),
                 [e.task for e in examples], real, int(mask.size), torch.from_numpy(supervised))
