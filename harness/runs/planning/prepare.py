"""The pipeline steps before training, shared by runs, the sanity checks, ``harness inspect``, sweep workers and the
benches: task data from the recipes, the base model, the encoded pools and eval items, and each stage's plan
(its batches and effective composition). Every data error surfaces here as a :class:`DataError`, before any
training.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from jinja2.exceptions import TemplateError

from data_recipes import build_world, corpus, get_recipe, heldout_corpus
from data_recipes.split_check import check_recipe_splits
from harness.config import Experiment, task_seed
from harness.data.encoding import eval_items, fit_eval_items, position_limit
from harness.data.special_text import apply_special_token_policy
from harness.evaluation.forgetting import DEFAULT_DOCUMENTS, file_documents
from harness.evaluation.lengths import default_max_new_tokens, needed_new_tokens, too_short_errors
from harness.models.builtin import build_builtin, builtin_added_token_ids
from harness.models.hf import count_parameters, load_hf
from harness.models.modality import TextOnlyModel, base_kind, model_io
from harness.models.tokenizer import train_tokenizer
from harness.models.undertrained import special_token_note, undertrained_tokens
from harness.runs.planning.images import load_vision_base, untrained_vision_base
from harness.runs.planning.loss_pool import loss_pool_splits
from harness.runs.planning.pretrain import builtin_base, content_hash, tokenizer_texts


class DataError(Exception):
    """Bad task data found before training (empty pool, unreadable file…); the message names the task."""


# ----------------------------------------------------------------------------------------------------------------
# Task data and the base model
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class TaskData:
    recipes: dict[str, Any]  # task -> Recipe instance
    splits: dict[str, dict[str, list]]  # task -> split -> [Example]
    corpus: list[str]
    world: Any = None  # the synthetic world (the shipped benchmarks ask about it)
    reference: tuple[str, list[str]] | None = None  # the forgetting probe's reference text: (name, documents)
    loss_splits: dict[str, dict[str, list]] = field(default_factory=dict)  # task -> loss_<split> -> [Example]
    loss_dropped: dict[str, int] = field(default_factory=dict)  # task -> loss-pool items dropped (trained prompts)


def build_task_data(exp: Experiment) -> TaskData:
    """Every task's splits from its recipe (over the shared world when the recipe needs one) and the world corpus;
    each task's splits pass the split check (:mod:`data_recipes.split_check`) or stop as a :class:`DataError`."""
    world = build_world(exp.world.people, exp.world.seed)
    recipes, splits, loss = {}, {}, {}
    for name, spec in exp.tasks.items():
        cls = get_recipe(spec.recipe)

        def recipe_of(cls=cls, spec=spec) -> Any:
            return cls(cls.Params.model_validate(spec.params), world if cls.needs_world else None)

        def built(recipe: Any, name=name, spec=spec) -> dict[str, list]:
            return recipe.build(name, spec.train, spec.eval, task_seed(exp, name))

        recipe = recipe_of()
        try:
            splits[name] = built(recipe)
            check_recipe_splits(recipe, splits[name], task_seed(exp, name), rebuild=lambda: built(recipe_of()))
        except (ValueError, OSError) as e:
            raise DataError(f"tasks.{name} (recipe {spec.recipe}): {e}") from None
        if exp.eval.loss_items and not recipe.has_images:  # the loss pool: a bigger held-out draw (loss_pool.py)
            try:
                loss[name] = loss_pool_splits(exp, name, recipe_of, splits[name]["train"])
            except ValueError as e:
                raise DataError(f"tasks.{name} (recipe {spec.recipe}): eval.loss_items: {e}") from None
        if spec.system is not None:
            splits[name] = with_system(name, splits[name], spec.system)
            if name in loss:
                loss[name] = (with_system(name, loss[name][0], spec.system), loss[name][1])
        recipes[name] = recipe
    pretraining = corpus(world, exp.world.seed, docs_per_person=exp.world.docs_per_person, permute=exp.world.permute)
    data = TaskData(recipes, splits, pretraining, world, reference_text(exp, world, pretraining))
    data.loss_splits = {name: pool for name, (pool, _) in loss.items()}
    data.loss_dropped = {name: n for name, (_, n) in loss.items() if n}
    return data


def reference_text(exp: Experiment, world: Any, pretraining: list[str]) -> tuple[str, list[str]] | None:
    """The forgetting probe's reference text as ``(name, documents)`` when ``eval.probes`` names ``forgetting``
    (None otherwise): the user's file (``eval.reference_text``), else a held-out sample of the world corpus
    (:func:`data_recipes.world.heldout_corpus`). A missing or empty file, and an HF base without one, are refused by
    the experiment's validation (``harness.config.load``), before anything runs."""
    if "forgetting" not in exp.eval.probes:
        return None
    if exp.eval.reference_text:
        path = Path(exp.eval.reference_text)
        return path.stem, file_documents(path)
    docs = heldout_corpus(world, pretraining, DEFAULT_DOCUMENTS, exp.world.docs_per_person, exp.world.permute)
    return "world", docs


def with_system(task: str, splits: dict[str, list], text: str) -> dict[str, list]:
    """Every split's examples with the task's system turn first (``tasks.<task>.system``)."""
    try:
        return {split: [ex.with_system(text) for ex in examples] for split, examples in splits.items()}
    except ValueError:
        raise DataError(
            f"tasks.{task}.system: the recipe's examples already carry a system turn (a data file's "
            "system column?); set one or the other"
        ) from None


def after_progress(on_progress: Callable[[], None] | None, then: Callable[..., Any] | None) -> Callable | None:
    """``then`` (an ``on_evaluation`` or a progress bar's ``advance``) preceded by ``on_progress()`` (a sweep
    trial's heartbeat); ``then`` itself when there is no ``on_progress``."""
    if on_progress is None:
        return then

    def call(*args: Any) -> Any:
        on_progress()
        return then(*args) if then is not None else None

    return call


def load_base(
    exp: Experiment, data: TaskData, console=None, on_progress: Callable[[], None] | None = None
) -> tuple[Any, Any, list[int], dict[str, Any]]:
    """The base model (on the GPU when there is one) and tokenizer — a hub/local model, or a builtin one,
    pretrained and cached, text or image-text (:func:`harness.models.modality.base_kind`) — the ids of the tokens
    the harness added to it, and facts about where it came from. ``on_progress()`` is called after every
    pretraining step."""
    transformers.utils.logging.disable_progress_bar()  # our own bars are enough
    build = {"image-text": _image_text_base, "hf": _hf_base, "builtin": _builtin_text_base}[base_kind(exp.model)]
    model, tokenizer, added, info = build(exp, data, console, on_progress)
    if torch.cuda.is_available():
        model = model.to("cuda")
    return model, tokenizer, added, info


@dataclass
class Base:
    """The run's base model as :func:`build_base` made it: the model and tokenizer (an image-text model's carries its
    processor: :func:`harness.models.modality.model_io`), the ids of the tokens the harness added, facts about where
    it came from (``summary.json``'s ``base``), its flagged special tokens (``None``: not checked) and the positions
    it can read (``None``: unbounded)."""

    model: Any
    tokenizer: Any
    added: list[int]
    info: dict[str, Any]
    undertrained: list[dict] | None
    max_positions: int | None


def build_base(exp: Experiment, data: TaskData, console, on_progress: Callable[[], None] | None = None) -> Base:
    """:func:`load_base`, timed, with its size and the under-trained check of its special-token rows
    (:func:`harness.models.undertrained.undertrained_tokens`) said on the console."""
    started = time.perf_counter()
    model, tokenizer, added, info = load_base(exp, data, console, on_progress)
    info = {**info, "seconds": time.perf_counter() - started}
    reports = undertrained_tokens(exp.model, data.corpus, model, tokenizer)
    line, flagged = special_token_note(reports, [(s.name, s.train.trainable) for s in exp.resolved_stages()], added)
    console.info(f"model: {count_parameters(model)[0] / 1e6:.2f}M parameters, vocabulary {len(tokenizer)}")
    if line:
        console.info(line)
    return Base(model, tokenizer, added, info, flagged, position_limit(model.config))


def _image_text_base(exp: Experiment, data: TaskData, console, on_progress) -> tuple[Any, Any, list[int], dict]:
    return load_vision_base(exp, data, console)


def _hf_base(exp: Experiment, data: TaskData, console, on_progress) -> tuple[Any, Any, list[int], dict]:
    model, tokenizer, added = load_hf(exp.model, return_added=True)
    return model, tokenizer, added, {"source": exp.model.hf}


def _builtin_text_base(exp: Experiment, data: TaskData, console, on_progress) -> tuple[Any, Any, list[int], dict]:
    all_train = [ex for splits in data.splits.values() for ex in splits["train"]]
    factory = console.progress_factory() if console is not None else None

    def pulsing(name: str, total: int):  # a trial pretraining its own base must not look hung
        return after_progress(on_progress, factory(name, total) if factory is not None else None)

    progress = pulsing if on_progress is not None else factory
    model, tokenizer, base = builtin_base(exp.model, data.corpus, all_train, exp.seed, progress)
    if exp.model.pretrain is not None and console is not None:
        console.info(
            "base model: "
            + ("cache hit" if base.cache_hit else f"pretrained (loss {base.final_loss:.3f})")
            + f" ({base.cache_dir})"
        )
    info = {
        "source": exp.model.builtin,
        "cache_hit": base.cache_hit,
        "cache_dir": str(base.cache_dir) if base.cache_dir else None,
        "pretrain_final_loss": base.final_loss,
    }
    return model, tokenizer, builtin_added_token_ids(tokenizer), info


def warm_base(exp: Experiment):
    """Pretrain (or find in the cache) the experiment's builtin base once, before the processes that will load it
    start (sweep workers, ranks other than 0): the cache's information (``cache_hit``, ``cache_dir``), or None when
    the base needs no pretraining (``model.hf``, or no ``model.pretrain``)."""
    if exp.model.hf or exp.model.pretrain is None:
        return None
    data = build_task_data(exp)
    all_train = [ex for splits in data.splits.values() for ex in splits["train"]]
    return builtin_base(exp.model, data.corpus, all_train, exp.seed, None)[2]


def builtin_tokenizer(exp: Experiment, data: TaskData):
    """The builtin base's tokenizer as the run trains it (on the world corpus and every task's training examples; well
    under a second), without the model."""
    all_train = [ex for splits in data.splits.values() for ex in splits["train"]]
    return train_tokenizer(
        tokenizer_texts(data.corpus, all_train), exp.model.tokenizer.vocab_size, exp.model.tokenizer.min_frequency
    )


def untrained_base(exp: Experiment, data: TaskData) -> tuple[Any, Any, list[int], str, list[str]]:
    """The base as :func:`load_base` builds it but without pretraining (what ``harness inspect`` shows: a builtin's
    architecture, tokenizer and shapes with freshly initialised weights; a hub model as loaded; an image-text
    base's untrained parts): ``(model, tokenizer, added token ids, source in words, notes)``. Kept beside
    :func:`load_base` so the choice of builder is made in one place."""
    kind = base_kind(exp.model)
    if kind == "image-text":
        return (*untrained_vision_base(exp, data), [])
    if kind == "hf":
        model, tokenizer, added = load_hf(exp.model, return_added=True)
        return model, tokenizer, added, f"model.hf {exp.model.hf}", []
    tokenizer = builtin_tokenizer(exp, data)
    source, notes = f"builtin {exp.model.builtin}", []
    if exp.model.pretrain is not None:
        source += " (untrained: the architecture as pretraining would start it; pretraining not run)"
        notes.append(
            "weights are freshly initialised, not pretrained: shapes, dtypes, counts and trainable "
            "flags are those of the run"
        )
    return build_builtin(exp.model, tokenizer, exp.seed), tokenizer, builtin_added_token_ids(tokenizer), source, notes


# ----------------------------------------------------------------------------------------------------------------
# Encoding and stage plans
# ----------------------------------------------------------------------------------------------------------------


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

    def too_long_counts(self) -> dict[str, int]:
        """``{"task/split": items dropped}``, as ``summary.json``'s ``too_long`` records them."""
        return {f"{t}/{s}": n for (t, s), n in sorted(self.too_long.items())}


# The last text encoding, by a hash of everything it reads (:func:`_encoding_key`): a sweep worker runs trial after
# trial on the same task data and tokenizer, and encoding them again costs part of every trial's setup
# (docs/performance.md, "The stage cache in a sweep"). One entry.
_last_encoding: dict[str, tuple[dict[str, dict[str, list]], EncodedData]] = {}


def encode_task_data(exp: Experiment, data: TaskData, tokenizer, max_positions: int | None = None) -> EncodedData:
    """The training pools, tokenised with their label masks (image tasks through the processor), and the fixed eval
    items of every task and split.

    A split a task does not have (a user file has no ``heldout_template``) is skipped and listed in
    ``empty_splits``; eval items longer than ``min(train.max_length, max_positions)`` (prompt plus answer or
    ``max_new_tokens``) are dropped and counted in ``too_long``, or raise :class:`DataError` with
    ``data.too_long: error``.

    The same encoding asked again in this process (same task data, tokenizer and settings) is the previous one,
    its arrays read-only; ``data.splits`` is left as encoding leaves it (``data.special_tokens_in_text``)."""
    key = _encoding_key(exp, data, tokenizer, max_positions)
    if key is not None and key in _last_encoding:
        splits, encoded = _last_encoding[key]
        for name, task_splits in splits.items():
            data.splits[name].update({split: list(examples) for split, examples in task_splits.items()})
        return _fresh_lists(encoded)
    _last_encoding.clear()
    encoded = _encode_task_data(exp, data, tokenizer, max_positions)
    if key is None:
        return encoded
    for pool in encoded.train.values():
        for enc in pool:  # shared with later runs: writing into them would change those runs' data
            enc.input_ids.setflags(write=False)
            enc.labels.setflags(write=False)
    _last_encoding[key] = (
        {
            name: {split: list(examples) for split, examples in task_splits.items()}
            for name, task_splits in data.splits.items()
        },
        encoded,
    )
    return _fresh_lists(encoded)


def _fresh_lists(encoded: EncodedData) -> EncodedData:
    """``encoded`` with containers of its own (the items and arrays inside are shared, and not to be changed)."""
    return replace(
        encoded,
        train={task: list(pool) for task, pool in encoded.train.items()},
        eval_items=list(encoded.eval_items),
        loss_items=list(encoded.loss_items),
        empty_splits=list(encoded.empty_splits),
        too_long=dict(encoded.too_long),
    )


def _encoding_key(exp: Experiment, data: TaskData, tokenizer, max_positions: int | None) -> str | None:
    """A hash of everything :func:`_encode_task_data` reads: the task data's content, the tokenizer (its whole
    serialised state, chat template and special tokens), the experiment's data / eval / tasks sections, seeds,
    ``train.max_length`` and ``max_positions``. None — never reused — for a slow tokenizer or image tasks."""
    from harness.runs.planning.stage_key import task_data_hash

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or any(recipe.has_images for recipe in data.recipes.values()):
        return None
    resolved = exp.resolved_dict()
    facts = {
        "data": task_data_hash(data.splits, data.corpus),
        "recipes": {name: type(recipe).__qualname__ for name, recipe in data.recipes.items()},
        "tokenizer": [
            type(tokenizer).__qualname__,
            backend.to_str(),
            tokenizer.chat_template,
            tokenizer.special_tokens_map,
            len(tokenizer),
        ],
        "settings": {k: resolved[k] for k in ("data", "eval", "tasks")},
        "seed": exp.seed,
        "data_seed": exp.data_seed,
        "max_length": exp.train.max_length,
        "max_positions": max_positions,
    }
    return content_hash(facts)


def _encode_task_data(exp: Experiment, data: TaskData, tokenizer, max_positions: int | None) -> EncodedData:
    """:func:`encode_task_data`, computed."""
    _check_special_token_text(exp, data, tokenizer)
    train, io = {}, model_io(tokenizer)
    for name, splits in data.splits.items():
        with _template_refusal(name):
            try:
                train[name] = io.encode_train(splits["train"], data.recipes[name].has_images)
            except TextOnlyModel as e:
                raise DataError(f"tasks.{name}: {e}") from None
        for index, (ex, enc) in enumerate(zip(splits["train"], train[name])):
            if enc.n_supervised <= 1:  # only the end-of-turn token: the answer tokenised to nothing
                raise DataError(
                    f"tasks.{name}: training example {index} has an answer that tokenises to nothing "
                    f"(prompt {ex.prompt[:60]!r})"
                )
    items, empty = [], []
    for name, splits in data.splits.items():
        if data.recipes[name].has_images:
            continue
        for split in exp.eval.splits:
            if split != "train" and not splits.get(split):
                empty.append((name, split))
                continue
            if split == "train":
                # A fixed random subsample of training items, so the memorisation gap is visible.
                pool = splits["train"]
                rng = np.random.default_rng(task_seed(exp, name))
                chosen = sorted(rng.choice(len(pool), size=min(exp.tasks[name].eval, len(pool)), replace=False))
                examples = [pool[i] for i in chosen]
            else:
                examples = splits[split]
            with _template_refusal(name):  # an eval-only task (train: 0) meets the template here first
                items.extend(eval_items(tokenizer, examples, split))
    too_short = too_short_errors(exp.eval.max_new_tokens, needed_new_tokens(items))
    if too_short:  # a cut-off answer would score wrong however good the model is
        raise DataError("\n".join(too_short))
    kept, too_long = _fit_eval(exp, items, max_positions)
    loss = [
        item
        for name, pools in data.loss_splits.items()
        for split, examples in pools.items()
        for item in eval_items(tokenizer, examples, split)
    ]
    loss_kept, loss_long = _fit_eval(exp, loss, max_positions)
    return EncodedData(
        train, kept, empty, {**too_long, **loss_long}, loss_items=loss_kept, loss_dropped=dict(data.loss_dropped)
    )


@contextlib.contextmanager
def _template_refusal(task: str):
    """A chat template raising on the task's messages (a hub template without a system role, Gemma's, meeting
    ``tasks.<task>.system``) as one :class:`DataError` naming the task."""
    try:
        yield
    except TemplateError as e:
        raise DataError(f"tasks.{task}: the model's chat template refused the task's messages: {e}") from None


def _check_special_token_text(exp: Experiment, data: TaskData, tokenizer) -> None:
    """Every split of every task through ``data.special_tokens_in_text`` (in place): a row whose text holds a
    special-token string would be tokenised into the control token itself."""
    for name, splits in data.splits.items():
        for split, examples in splits.items():
            try:
                splits[split] = apply_special_token_policy(
                    examples, tokenizer, exp.data.special_tokens_in_text, name, split
                )
            except ValueError as e:
                raise DataError(f"tasks.{name}: {e}") from None


def _fit_eval(exp: Experiment, items: list, max_positions: int | None) -> tuple[list, dict[tuple[str, str], int]]:
    """The eval items that fit the model and ``train.max_length``, and the dropped counts (see encode_task_data)."""
    limit = min(exp.train.max_length, max_positions or exp.train.max_length)
    # null max_new_tokens: what the longest answer needs (passes.py resolves it per evaluation, never longer)
    max_new_tokens = exp.eval.max_new_tokens or default_max_new_tokens(items)
    kept, dropped = fit_eval_items(items, limit, max_new_tokens)
    if dropped and exp.data.too_long == "error":
        (task, split), n = next(iter(dropped.items()))
        bound = f"max_length={limit}" if limit == exp.train.max_length else f"the model's {limit} positions"
        raise DataError(
            f"tasks.{task}: {n} {split} evaluation items (prompt plus answer) are longer than {bound} "
            "(data.too_long: error)"
        )
    return kept, dropped
