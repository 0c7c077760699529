"""The pipeline steps before training, shared by runs, the sanity checks, ``harness inspect``, sweep workers and the
benches, as the experiment asks for them: its slice for each step taken here (task building, encoding, a stage's
batching), the step done in the layer that owns it (:mod:`harness.data.task_build`,
:mod:`harness.data.task_encoding`, :mod:`harness.data.stage_batches`), and the base model built here (its builders
stay behind this module). Bad task data raises :class:`~harness.data.task_data.DataError`, before any training.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import transformers

from harness.config import Experiment, task_seed
from harness.data.encoding import position_limit
from harness.data.stage_batches import Batching
from harness.data.task_build import TaskBuild, build_tasks
from harness.data.task_data import TaskData
from harness.data.task_encoding import EncodedData, EncodingSettings, encode_tasks
from harness.models.builtin import build_builtin, builtin_added_token_ids
from harness.models.hf import count_parameters, load_hf
from harness.models.modality import base_kind, model_io
from harness.models.tokenizer import train_tokenizer
from harness.models.undertrained import special_token_note, undertrained_tokens
from harness.runs.planning.images import load_vision_base, untrained_vision_base
from harness.runs.planning.pretrain import builtin_base, tokenizer_texts

# ----------------------------------------------------------------------------------------------------------------
# Task data and the base model
# ----------------------------------------------------------------------------------------------------------------


def build_task_data(exp: Experiment) -> TaskData:
    """Every task's splits from its recipe, split-checked, with its loss pool and system turn, the world corpus and
    the reference text (:func:`harness.data.task_build.build_tasks`), or a :class:`DataError` naming the task."""
    return build_tasks(
        TaskBuild(
            tasks=dict(exp.tasks),
            seeds={name: task_seed(exp, name) for name in exp.tasks},
            world=exp.world,
            loss_items=exp.eval.loss_items,
            eval_splits=tuple(exp.eval.splits),
            reference=exp.eval.reference_text,
            forgetting="forgetting" in exp.eval.probes,
        )
    )


def stage_batching(exp: Experiment) -> Batching:
    """What every stage's batches read of ``exp`` besides the stage
    (:func:`harness.data.stage_batches.plan_stage`)."""
    return Batching(seed=exp.seed, too_long=exp.data.too_long, drop_images=exp.debug.drop_images)


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
    it came from (``summary.json``'s ``base``), its flagged special tokens (``None``: not checked), the positions
    it can read (``None``: unbounded) and its data side (the IO that encodes for it)."""

    model: Any
    tokenizer: Any
    added: list[int]
    info: dict[str, Any]
    undertrained: list[dict] | None
    max_positions: int | None
    io: Any


def build_base(exp: Experiment, data: TaskData, console, on_progress: Callable[[], None] | None = None) -> Base:
    """:func:`load_base`, timed, with its size and the under-trained check of its special-token rows
    (:func:`harness.models.undertrained.undertrained_tokens`) said on the console."""
    started = time.perf_counter()
    model, tokenizer, added, info = load_base(exp, data, console, on_progress)
    info = {**info, "seconds": time.perf_counter() - started}
    io = model_io(tokenizer)
    reports = undertrained_tokens(exp.model, data.corpus, model, tokenizer)
    line, flagged = special_token_note(reports, [(s.name, s.train.trainable) for s in exp.resolved_stages()], added)
    console.info(f"model: {count_parameters(model)[0] / 1e6:.2f}M parameters, vocabulary {len(tokenizer)}")
    if line:
        console.info(line)
    return Base(model, tokenizer, added, info, flagged, position_limit(model.config), io)


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
# Encoding and batching: the experiment's slices
# ----------------------------------------------------------------------------------------------------------------


def encode_task_data(exp: Experiment, data: TaskData, tokenizer, max_positions: int | None = None) -> EncodedData:
    """The training pools and the fixed eval items of every task, encoded through ``tokenizer``'s model IO under
    ``exp``'s settings (:func:`harness.data.task_encoding.encode_tasks`; the same request again in this process is the
    previous encoding)."""
    return encode_tasks(model_io(tokenizer), data, encoding_settings(exp), max_positions)


def encoding_settings(exp: Experiment) -> EncodingSettings:
    """What encoding reads of ``exp`` (:class:`harness.data.task_encoding.EncodingSettings`)."""
    return EncodingSettings(
        eval_splits=tuple(exp.eval.splits),
        train_sample={name: (spec.eval, task_seed(exp, name)) for name, spec in exp.tasks.items()},
        max_new_tokens=exp.eval.max_new_tokens,
        max_length=exp.train.max_length,
        too_long=exp.data.too_long,
        special_tokens_in_text=exp.data.special_tokens_in_text,
    )
