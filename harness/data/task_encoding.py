"""A run's task data encoded: the training pools tokenised with their label masks (image tasks through the model's
processor), the fixed eval items of every task and split, and the loss pool's items. Every refusal is a
:class:`~harness.data.task_data.DataError` naming the task: an answer that tokenises to nothing, a chat template that
refuses a task's messages, an explicit ``eval.max_new_tokens`` that cuts an answer, an eval item too long for the
model under ``data.too_long: error``.

What it reads of the experiment comes as :class:`EncodingSettings` (the planner's
:func:`harness.runs.planning.prepare.encoding_settings` takes them); the model's side comes as its IO
(:func:`harness.models.modality.model_io`). The last encoding is kept for the process's next identical request (a
sweep worker's next trial), by a hash of everything encoding reads.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
from jinja2.exceptions import TemplateError

from harness.core.digests import content_hash
from harness.data.answer_lengths import default_max_new_tokens, needed_new_tokens, too_short_errors
from harness.data.encoding import eval_items, fit_eval_items
from harness.data.special_text import apply_special_token_policy
from harness.data.task_data import DataError, TaskData, TextOnlyModel, task_data_hash


@dataclass(frozen=True)
class EncodingSettings:
    """What encoding reads of the experiment."""

    eval_splits: tuple[str, ...]  # eval.splits
    train_sample: dict[str, tuple[int, int]]  # task -> (tasks.<task>.eval, the task's seed): training items evaluated
    max_new_tokens: int | None  # eval.max_new_tokens (None: what the longest answer needs)
    max_length: int  # train.max_length
    too_long: str  # data.too_long: "drop" or "error"
    special_tokens_in_text: str  # data.special_tokens_in_text: "error" or "escape"


@dataclass
class EncodedData:
    train: dict[str, list]  # task -> [Encoded]
    eval_items: list  # [EvalItem] over every task and eval split, fixed for the whole run
    empty_splits: list[tuple[str, str]] = field(default_factory=list)  # (task, split) with no items: skipped
    too_long: dict[tuple[str, str], int] = field(default_factory=dict)  # (task, split) -> eval items dropped
    loss_items: list = field(default_factory=list)  # [EvalItem] of the loss pool (eval.loss_items), split loss_<s>
    loss_dropped: dict[str, int] = field(default_factory=dict)  # task -> loss-pool items that were training prompts

    def notes(self) -> list[str]:
        """One line per kind of skipped evaluation data, for the console (said once per run)."""
        lines = []
        if self.empty_splits:
            lines.append("evaluation skips empty splits: " + ", ".join(f"{t}/{s}" for t, s in self.empty_splits))
        if self.too_long:
            lines.append(
                "evaluation dropped items too long for the model (data.too_long: drop): "
                + ", ".join(f"{t}/{s} {n}" for (t, s), n in sorted(self.too_long.items()))
            )
        if self.loss_dropped:
            lines.append(
                "loss pool: items whose prompt is a training prompt left out: "
                + ", ".join(f"{t} {n}" for t, n in sorted(self.loss_dropped.items()))
            )
        return lines

    def with_own_lists(self) -> EncodedData:
        """This encoding with containers of its own (the items and arrays inside are shared, and not to be changed:
        a sweep worker's next trial reuses them)."""
        return replace(
            self,
            train={task: list(pool) for task, pool in self.train.items()},
            eval_items=list(self.eval_items),
            loss_items=list(self.loss_items),
            empty_splits=list(self.empty_splits),
            too_long=dict(self.too_long),
        )

    def too_long_counts(self) -> dict[str, int]:
        """``{"task/split": items dropped}``, as ``summary.json``'s ``too_long`` records them."""
        return {f"{t}/{s}": n for (t, s), n in sorted(self.too_long.items())}


# The last text encoding, by a hash of everything it reads (:func:`_encoding_key`): a sweep worker runs trial after
# trial on the same task data and tokenizer, and encoding them again costs part of every trial's setup
# (docs/performance.md, "The stage cache in a sweep"). One entry.
_last_encoding: dict[str, tuple[dict[str, dict[str, list]], EncodedData]] = {}


def encode_tasks(io: Any, data: TaskData, settings: EncodingSettings, max_positions: int | None = None) -> EncodedData:
    """The training pools and the fixed eval items of every task (module docstring). Every split first passes
    ``data.special_tokens_in_text`` (``data.splits`` is changed in place: a row whose text holds a special-token
    string would be tokenised into the control token itself). A split a task does not have (a user file has no
    ``heldout_template``) is skipped and listed in ``empty_splits``; eval items longer than
    ``min(max_length, max_positions)`` (the model's positions, None: unbounded; prompt plus answer or
    ``max_new_tokens``) are dropped and counted in ``too_long``, or refused under ``data.too_long: error``.

    The same encoding asked again in this process (same task data, tokenizer and settings) is the previous one,
    its arrays read-only; ``data.splits`` is left as encoding leaves it."""
    key = _encoding_key(io.tokenizer, data, settings, max_positions)
    if key is None:
        _last_encoding.clear()
        return _encoded(io, data, settings, max_positions)
    if key in _last_encoding:
        splits, encoded = _last_encoding[key]
        for name, task_splits in splits.items():
            data.splits[name].update({split: list(examples) for split, examples in task_splits.items()})
    else:
        _last_encoding.clear()
        encoded = _encoded(io, data, settings, max_positions)
        for pool in encoded.train.values():
            for enc in pool:  # shared with later runs: writing into them would change those runs' data
                enc.input_ids.setflags(write=False)
                enc.labels.setflags(write=False)
        kept = {
            name: {split: list(ex) for split, ex in task_splits.items()} for name, task_splits in data.splits.items()
        }
        _last_encoding[key] = (kept, encoded)
    return encoded.with_own_lists()


def _encoding_key(tokenizer: Any, data: TaskData, settings: EncodingSettings, max_positions: int | None) -> str | None:
    """A hash of everything :func:`_encoded` reads: the task data's content (loss pool included), the recipes'
    classes, the tokenizer (its whole serialised state, chat template and special tokens), the settings and
    ``max_positions``. None — never reused — for a slow tokenizer or image tasks."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or any(recipe.has_images for recipe in data.recipes.values()):
        return None
    facts = {
        "data": task_data_hash(data.splits, data.corpus),
        "loss_pool": [task_data_hash(data.loss_splits, []), data.loss_dropped],
        "recipes": {name: type(recipe).__qualname__ for name, recipe in data.recipes.items()},
        "tokenizer": [
            type(tokenizer).__qualname__,
            backend.to_str(),
            tokenizer.chat_template,
            tokenizer.special_tokens_map,
            len(tokenizer),
        ],
        "settings": asdict(settings),
        "max_positions": max_positions,
    }
    return content_hash(facts)


def _encoded(io: Any, data: TaskData, settings: EncodingSettings, max_positions: int | None) -> EncodedData:
    """:func:`encode_tasks`, computed."""
    for name, splits in data.splits.items():
        for split, examples in splits.items():
            try:
                splits[split] = apply_special_token_policy(
                    examples, io.tokenizer, settings.special_tokens_in_text, name, split
                )
            except ValueError as e:
                raise DataError(f"tasks.{name}: {e}") from None
    train = {name: _training_pool(io, name, splits["train"], data) for name, splits in data.splits.items()}
    items, empty = [], []
    for name, splits in data.splits.items():
        if data.recipes[name].has_images:
            continue
        for split in settings.eval_splits:
            if split != "train" and not splits.get(split):
                empty.append((name, split))
                continue
            train_sample = split == "train"
            examples = _train_sample(splits["train"], *settings.train_sample[name]) if train_sample else splits[split]
            with _template_refusal(name):  # an eval-only task (train: 0) meets the template here first
                items.extend(eval_items(io.tokenizer, examples, split))
    too_short = too_short_errors(settings.max_new_tokens, needed_new_tokens(items))
    if too_short:  # a cut-off answer would score wrong however good the model is
        raise DataError("\n".join(too_short))
    kept, too_long = _fitting(items, settings, max_positions)
    loss = [
        item
        for pools in data.loss_splits.values()
        for split, examples in pools.items()
        for item in eval_items(io.tokenizer, examples, split)
    ]
    loss_kept, loss_long = _fitting(loss, settings, max_positions)
    return EncodedData(
        train, kept, empty, {**too_long, **loss_long}, loss_items=loss_kept, loss_dropped=dict(data.loss_dropped)
    )


def _training_pool(io: Any, name: str, examples: list, data: TaskData) -> list:
    """Task ``name``'s training examples encoded, refused when one's answer tokenises to nothing."""
    with _template_refusal(name):
        try:
            pool = io.encode_train(examples, data.recipes[name].has_images)
        except TextOnlyModel as e:
            raise DataError(f"tasks.{name}: {e}") from None
    for index, (ex, enc) in enumerate(zip(examples, pool)):
        if enc.n_supervised <= 1:  # only the end-of-turn token: the answer tokenised to nothing
            raise DataError(
                f"tasks.{name}: training example {index} has an answer that tokenises to nothing "
                f"(prompt {ex.prompt[:60]!r})"
            )
    return pool


def _train_sample(pool: list, size: int, seed: int) -> list:
    """A fixed random subsample of ``size`` training items, so the memorisation gap is visible."""
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.choice(len(pool), size=min(size, len(pool)), replace=False))
    return [pool[i] for i in chosen]


@contextlib.contextmanager
def _template_refusal(task: str):
    """A chat template raising on the task's messages (a hub template without a system role, Gemma's, meeting
    ``tasks.<task>.system``) as one :class:`DataError` naming the task."""
    try:
        yield
    except TemplateError as e:
        raise DataError(f"tasks.{task}: the model's chat template refused the task's messages: {e}") from None


def _fitting(
    items: list, settings: EncodingSettings, max_positions: int | None
) -> tuple[list, dict[tuple[str, str], int]]:
    """The eval items that fit the model and ``train.max_length``, and the dropped counts (see :func:`encode_tasks`)."""
    limit = min(settings.max_length, max_positions or settings.max_length)
    # null max_new_tokens: what the longest answer needs (passes.py resolves it per evaluation, never longer)
    kept, dropped = fit_eval_items(items, limit, settings.max_new_tokens or default_max_new_tokens(items))
    if dropped and settings.too_long == "error":
        (task, split), n = next(iter(dropped.items()))
        bound = f"max_length={limit}" if limit == settings.max_length else f"the model's {limit} positions"
        raise DataError(
            f"tasks.{task}: {n} {split} evaluation items (prompt plus answer) are longer than {bound} "
            "(data.too_long: error)"
        )
    return kept, dropped
