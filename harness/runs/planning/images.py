"""The base model of an image-text run: ``model.builtin: llava-tiny`` (with ``text`` — a builtin text architecture,
``qwen2-tiny`` by default —, ``config`` — overrides of that text config — and ``vision`` — overrides of the SigLIP
tower's config) builds :func:`harness.models.image_text.build_llava_tiny`, its text model from
:func:`harness.runs.planning.pretrain.builtin_base` first (so ``model.pretrain`` pretrains the language model on the
world corpus, cached as for text builtins) and its weights copied into the language model; ``model.hf`` naming an
image-text-to-text architecture loads through :func:`harness.models.image_text.load_image_text_model`.
"""

from __future__ import annotations

from typing import Any

from harness.models.builtin import builtin_added_token_ids
from harness.models.image_text import (
    DEFAULT_TEXT,
    VISION_BUILTIN,
    build_llava_tiny,
    copy_text_weights,
    load_image_text_model,
    register_processor,
    text_spec,
)
from harness.models.tokenizer import train_tokenizer
from harness.runs.planning.pretrain import builtin_base, tokenizer_texts


def load_vision_base(exp, data, console=None) -> tuple[Any, Any, list[int], dict[str, Any]]:
    """``(model, tokenizer, added token ids, info)`` of an image-text base model; its processor is registered."""
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
    info = {
        "source": f"{VISION_BUILTIN} ({spec.text or DEFAULT_TEXT})",
        "cache_hit": base.cache_hit,
        "cache_dir": str(base.cache_dir) if base.cache_dir else None,
        "pretrain_final_loss": base.final_loss,
    }
    return model, tokenizer, builtin_added_token_ids(tokenizer), info


def untrained_vision_base(exp, data) -> tuple[Any, Any, list[int], str]:
    """``(model, tokenizer, added ids, source)`` for ``harness inspect``: llava-tiny built on the tokenizer the run
    would train (no text pretraining), or the image-text ``model.hf`` as loaded; the processor is registered."""
    spec = exp.model
    if spec.hf:
        model, tokenizer, added, _ = load_vision_base(exp, data)
        return model, tokenizer, added, f"model.hf {spec.hf} (image-text)"
    all_train = [ex for splits in data.splits.values() for ex in splits["train"]]
    tokenizer = train_tokenizer(
        tokenizer_texts(data.corpus, all_train), spec.tokenizer.vocab_size, spec.tokenizer.min_frequency
    )
    model, processor = build_llava_tiny(tokenizer, exp.seed, spec.text or DEFAULT_TEXT, spec.config, spec.vision)
    register_processor(tokenizer, processor)
    source = f"builtin {VISION_BUILTIN} ({spec.text or DEFAULT_TEXT})"
    if spec.pretrain is not None:
        source += " (untrained: text pretraining not run)"
    return model, tokenizer, builtin_added_token_ids(tokenizer), source
