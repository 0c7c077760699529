"""Image-text models inside runs: the ``model`` section's checks, the base model, and the per-evaluation image probe.

- ``model.builtin: llava-tiny`` (with ``text`` — a builtin text architecture, ``qwen2-tiny`` by default —,
  ``config`` — overrides of that text config — and ``vision`` — overrides of the SigLIP tower's config) builds
  :func:`harness.vision.build_llava_tiny`; the text model comes from :func:`harness.pretrain.builtin_base` first
  (so ``model.pretrain`` pretrains the language model on the world corpus, cached as for text builtins) and its
  weights are copied into the language model.
- ``model.hf`` naming a model whose architecture transformers lists as image-text-to-text loads through
  :func:`harness.vision.load_image_text_model`.

The processor of such a model is found from its tokenizer with :func:`processor_for` (a weak map filled by the
loaders here), so the pipeline keeps passing one ``tokenizer`` around and the steps that need images (encoding,
checkpoints) ask for the processor where they need it.

:class:`ImageEval` runs :func:`harness.evaluation.image_use.image_use` on every image task and eval split at each
evaluation: ``greedy`` (accuracy with the real image, so image tasks sit next to text tasks in reports and seesaw
detection) and the ``img_*`` rows, and one sample per item with its ``image_id``.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

import numpy as np

from harness.vision import VISION_DEFAULTS, build_llava_tiny, load_image_text_model

VISION_BUILTIN = "llava-tiny"
DEFAULT_TEXT = "qwen2-tiny"

_PROCESSORS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


IMAGE_MAX_NEW_TOKENS = 12  # image tasks' decoding budget when eval.max_new_tokens is null (auto)


def register_processor(tokenizer, processor) -> None:
    """Remember ``processor`` as the one owning ``tokenizer`` (for :func:`processor_for`)."""
    _PROCESSORS[tokenizer] = processor


def processor_for(tokenizer) -> Optional[Any]:
    """The processor of an image-text model's tokenizer; ``None`` for a text model's."""
    try:
        return _PROCESSORS.get(tokenizer)
    except TypeError:  # not weak-referenceable: certainly not one of ours
        return None


def is_image_text_hf(spec) -> bool:
    """Whether ``model.hf`` names an architecture transformers lists under image-text-to-text."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    try:
        config = AutoConfig.from_pretrained(spec.hf, revision=spec.revision, trust_remote_code=spec.trust_remote_code)
    except (OSError, ValueError):  # not readable here: load_hf reports it as a text model would
        return False
    return config.model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES


def is_image_model(spec) -> bool:
    return spec.builtin == VISION_BUILTIN or (spec.hf is not None and is_image_text_hf(spec))


def text_spec(spec):
    """The text builtin's :class:`~harness.config.ModelSpec` inside a ``llava-tiny`` spec."""
    from harness.config import ModelSpec

    return ModelSpec(builtin=spec.text or DEFAULT_TEXT, config=spec.config, tokenizer=spec.tokenizer,
                     pretrain=spec.pretrain, dtype=spec.dtype)


def check_vision_spec(spec) -> list[tuple[str, str]]:
    """Errors of the vision fields: ``text`` / ``vision`` only with llava-tiny, a known text builtin, known
    vision config fields."""
    from transformers import SiglipVisionConfig

    from harness.models import check_model_spec

    if spec.builtin != VISION_BUILTIN:
        return [(f"model.{key}", f"applies to builtin {VISION_BUILTIN} only")
                for key in ("text", "vision") if getattr(spec, key)]
    if (spec.text or DEFAULT_TEXT) == VISION_BUILTIN:
        return [("model.text", f"must be a text architecture, not {VISION_BUILTIN}")]
    errors = [(key.replace("model.builtin", "model.text"), message)
              for key, message in check_model_spec(text_spec(spec))]
    known = set(SiglipVisionConfig().to_dict()) | {"pixel_gain"}
    errors += [(f"model.vision.{key}", "not a field of the siglip_vision_model config") for key in spec.vision
               if key not in known]
    vision = {**VISION_DEFAULTS, **spec.vision}
    gain = vision.get("pixel_gain", 1.0)
    if not errors and (not isinstance(gain, (int, float)) or gain <= 0):
        errors.append(("model.vision.pixel_gain", "must be a positive number"))
    if not errors and vision["image_size"] % vision["patch_size"]:
        errors.append(("model.vision.patch_size", f"must divide image_size ({vision['image_size']})"))
    return errors


def load_vision_base(exp, data, console=None) -> tuple[Any, Any, list[int], dict[str, Any]]:
    """``(model, tokenizer, added token ids, info)`` of an image-text base model; its processor is registered."""
    from harness.models import builtin_added_token_ids
    from harness.pretrain import builtin_base

    spec = exp.model
    if spec.hf:
        model, processor = load_image_text_model(spec.hf, spec.dtype, spec.revision, spec.trust_remote_code)
        register_processor(processor.tokenizer, processor)
        return model, processor.tokenizer, [], {"source": spec.hf}
    all_train = [ex for splits in data.splits.values() for ex in splits["train"]]
    progress = console.progress_factory() if console is not None else None
    text_model, tokenizer, base = builtin_base(text_spec(spec), data.corpus, all_train, exp.seed, progress)
    model, processor = build_llava_tiny(tokenizer, exp.seed, spec.text or DEFAULT_TEXT, spec.config, spec.vision)
    copy_text_weights(text_model, model)
    register_processor(tokenizer, processor)
    info = {"source": f"{VISION_BUILTIN} ({spec.text or DEFAULT_TEXT})", "cache_hit": base.cache_hit,
            "cache_dir": str(base.cache_dir) if base.cache_dir else None, "pretrain_final_loss": base.final_loss}
    return model, tokenizer, builtin_added_token_ids(tokenizer), info


def with_processor(spec, tokenizer):
    """The tokenizer an image-text run encodes with, its processor registered — without building the model (for
    ``harness validate``): llava-tiny's processor around ``tokenizer`` (``<image>`` added, as the run does), or an
    ``hf`` model's own processor and its tokenizer."""
    from harness.vision import llava_tiny_processor, load_image_text_processor

    if spec.hf:
        processor = load_image_text_processor(spec.hf, spec.revision, spec.trust_remote_code)
        register_processor(processor.tokenizer, processor)
        return processor.tokenizer
    register_processor(tokenizer, llava_tiny_processor(tokenizer, spec.vision))
    return tokenizer


def copy_text_weights(text_model, llava) -> None:
    """Load a causal LM's weights into LLaVA's language model and head. Vocabulary matrices are copied row by
    row: LLaVA's vocabulary is the text model's plus ``<image>``, whose rows keep their initialisation."""
    import torch

    targets = dict(llava.model.language_model.named_parameters())
    targets.update({f"lm_head.{n}": p for n, p in llava.lm_head.named_parameters()})
    with torch.no_grad():
        for name, source in text_model.named_parameters():
            key = name.removeprefix("model.")
            target = targets.get(key)
            if target is None:
                raise ValueError(f"llava-tiny: the text model's {name} has no counterpart in the language model")
            target[: source.shape[0]].copy_(source)


def image_tasks(data) -> list[str]:
    return [name for name, recipe in data.recipes.items() if getattr(recipe, "has_images", False)]


class ImageEval:
    """The image tasks' evaluation: :func:`~harness.evaluation.image_use.image_use` per task and eval split."""

    def __init__(self, exp, data, processor):
        from harness.prepare import task_seed  # cycle: prepare imports this module

        self.processor, self.recipes, self.drop_images = processor, data.recipes, exp.debug.drop_images
        # null max_new_tokens (auto): image answers are a word or two; 12 lets an overlong one be seen ending
        self.seed, self.batch_size = exp.seed, exp.eval.batch_size
        self.max_new_tokens = exp.eval.max_new_tokens or IMAGE_MAX_NEW_TOKENS
        self.examples: dict[tuple[str, str], list] = {}
        for name in image_tasks(data):
            splits = data.splits[name]
            for split in exp.eval.splits:
                if split == "train":  # the same fixed subsample as the text tasks' train split
                    pool = splits["train"]
                    rng = np.random.default_rng(task_seed(exp, name))
                    chosen = sorted(rng.choice(len(pool), size=min(exp.tasks[name].eval, len(pool)), replace=False))
                    self.examples[(name, split)] = [pool[i] for i in chosen]
                elif splits[split]:
                    self.examples[(name, split)] = splits[split]

    def __call__(self, model) -> tuple[list[tuple], list[dict[str, Any]]]:
        """``(metric rows, samples)``: rows as :meth:`~harness.evaluation.image_use.ImageUseStats.rows` gives
        them (a proportion's with its n and Wilson interval)."""
        from harness.evaluation.image_use import image_use

        rows, samples = [], []
        for (task, split), examples in self.examples.items():
            (stats,) = image_use(model, self.processor, examples, self.recipes, split, seed=self.seed,
                                 batch_size=self.batch_size, max_new_tokens=self.max_new_tokens,
                                 drop_images=self.drop_images)
            rows += stats.rows()
            recipe = self.recipes[task]
            for index, (ex, item) in enumerate(zip(examples, stats.items)):
                samples.append({"task": task, "split": split, "index": index, "prompt": ex.prompt,
                                "gold": ex.answer, "pred": item["pred_real"],
                                "correct": recipe.is_correct(item["pred_real"], ex.answer), **item})
        return rows, samples


def image_eval(exp, data, tokenizer) -> Optional[ImageEval]:
    """The run's :class:`ImageEval`, or ``None`` when no task has images."""
    if not image_tasks(data):
        return None
    processor = processor_for(tokenizer)
    if processor is None:
        raise ValueError("image tasks need an image-text model (model.builtin: llava-tiny or an image-text "
                         "model.hf)")
    return ImageEval(exp, data, processor)


def untrained_vision_base(exp, data) -> tuple[Any, Any, list[int], str]:
    """``(model, tokenizer, added ids, source)`` for ``harness inspect``: llava-tiny built on the tokenizer the run
    would train (no text pretraining), or the image-text ``model.hf`` as loaded; the processor is registered."""
    from harness.models import builtin_added_token_ids
    from harness.pretrain import tokenizer_texts
    from harness.tokenizer import train_tokenizer

    spec = exp.model
    if spec.hf:
        model, tokenizer, added, _ = load_vision_base(exp, data)
        return model, tokenizer, added, f"model.hf {spec.hf} (image-text)"
    all_train = [ex for splits in data.splits.values() for ex in splits["train"]]
    tokenizer = train_tokenizer(tokenizer_texts(data.corpus, all_train), spec.tokenizer.vocab_size,
                                spec.tokenizer.min_frequency)
    model, processor = build_llava_tiny(tokenizer, exp.seed, spec.text or DEFAULT_TEXT, spec.config, spec.vision)
    register_processor(tokenizer, processor)
    source = f"builtin {VISION_BUILTIN} ({spec.text or DEFAULT_TEXT})"
    if spec.pretrain is not None:
        source += " (untrained: text pretraining not run)"
    return model, tokenizer, builtin_added_token_ids(tokenizer), source


def part_notes(model, rows: list[dict[str, Any]], inputs: dict[str, Any]) -> list[str]:
    """One line per part (vision tower, projector, language model): parameters, trainable, and what goes in and
    comes out on the sample batch (from the per-module rows of :func:`harness.inspection.inspect_model`)."""
    from harness.vision import image_token_id, model_part, parameters_by_part

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    params = dict(base.named_parameters())
    first_row = {}
    for row in rows:  # the outermost module of each part is the first one listed
        part = model_part(row["name"] + ".x")
        if part is not None and part not in first_row:
            first_row[part] = row
    ids = inputs["input_ids"]
    n_image = int((ids == image_token_id(base)).sum())
    pixels = inputs.get("pixel_values")
    lines = [f"sample: input_ids {list(ids.shape)} with {n_image} image tokens; pixel_values "
             + (f"{list(pixels.shape)}" if pixels is not None else "none (text-only sample)")]
    for part, names in parameters_by_part(base).items():
        total = sum(params[n].numel() for n in names)
        trainable = sum(params[n].numel() for n in names if params[n].requires_grad)
        row = first_row.get(part)
        out = f"; output {row['shape']} {row['dtype']} ({row['name']})" if row and row["shape"] else ""
        lines.append(f"part {part}: {total:,} parameters, {trainable:,} trainable{out}")
    return lines
