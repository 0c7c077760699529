"""Image-text models: the builtin ``llava-tiny``, loading any local image-text-to-text model, and the processor
that belongs to such a model's tokenizer (:func:`processor_for`: a weak map filled by the loaders, so the pipeline
keeps passing one ``tokenizer`` around and the steps that need images ask for the processor where they need it).

``llava-tiny`` is transformers' LLaVA (``LlavaConfig`` + ``LlavaForConditionalGeneration``): a tiny SigLIP vision
tower (32 px images, 8 px patches → 16 image tokens, no CLS token, so every patch is an image token), LLaVA's
two-layer MLP projector, and a builtin text model of :mod:`harness.models.builtin` (``qwen2-tiny`` by default,
``qwen3_5-tiny`` for the seed's hybrid backbone) sized to the builtin tokenizer plus the ``<image>`` token. Its
:class:`~transformers.LlavaProcessor` (a PIL image processor — no torchvision needed — the tokenizer and a ChatML
template that renders ``{"type": "image"}`` parts as ``<image>``) saves with ``save_pretrained`` next to the
model, and both reload with ``AutoModelForImageTextToText`` / ``AutoProcessor``.

:func:`model_part` names the three parts ``trainable`` can address: ``vision_tower``, ``projector`` and
``language_model`` (the LM head and the embeddings belong to the language model).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from harness.config import ModelSpec
from harness.models.builtin import builtin_config

IMAGE_TOKEN = "<image>"
VISION_PARTS: tuple[str, ...] = ("vision_tower", "projector", "language_model")

# How much the processor amplifies pixel values (SigLIP's normalisation divided by this). Measured (docs/images.md):
# at the default gain of 1 a from-scratch llava-tiny never reads its images — the scenes are mostly white, so the
# patch embeddings differ little from image to image next to the position embeddings, and the language model
# learns the answer prior and stops looking (img_dependence 0/64); at 20, with lr 1e-3, it reads them.
PIXEL_GAIN = 20.0

# A tiny SigLIP vision tower (siglip_vision_model): (32 / 8)² = 16 patches, each one image token.
VISION_DEFAULTS: dict[str, Any] = dict(
    image_size=32,
    patch_size=8,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    attention_dropout=0.0,
)

# ChatML, as harness.models.tokenizer.CHAT_TEMPLATE, but a message's content may also be a list of parts
# ({"type": "text", "text": ...} / {"type": "image"}), the form processors' apply_chat_template use. Plain string
# contents render exactly as the text template does, so text tasks tokenise the same with and without images.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '" + IMAGE_TOKEN + "' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Parameter-name prefixes of each part, across the image-text models transformers ships (LLaVA family:
# vision_tower / multi_modal_projector; Qwen-VL: visual with its merger; Idefics/SmolVLM: vision_model +
# connector). Projector prefixes are tried first: Qwen-VL's projector (visual.merger) sits inside its vision tower.
_PART_PREFIXES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("projector", ("multi_modal_projector", "mm_projector", "visual.merger", "connector")),
    ("vision_tower", ("vision_tower", "visual", "vision_model")),
    ("language_model", ("language_model", "lm_head", "text_model")),
)


def model_part(parameter_name: str) -> str | None:
    """Which of :data:`VISION_PARTS` a parameter belongs to (``None`` if the name matches none)."""
    dotted = "." + parameter_name
    for part, prefixes in _PART_PREFIXES:
        if any(f".{prefix}." in dotted for prefix in prefixes):
            return part
    return None


def parameters_by_part(model) -> dict[str, list[str]]:
    """``{part: [parameter names]}`` for the parts present; names matching no part go to ``other``."""
    out: dict[str, list[str]] = {}
    for name, _ in model.named_parameters():
        out.setdefault(model_part(name) or "other", []).append(name)
    return out


def add_image_token(tokenizer) -> int:
    """Add ``<image>`` as a special token (once) and return its id; the chat template learns list contents."""
    if IMAGE_TOKEN not in tokenizer.get_vocab():
        tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)


def llava_tiny_config(
    tokenizer,
    text: str = "qwen2-tiny",
    text_overrides: Mapping[str, Any] | None = None,
    vision_overrides: Mapping[str, Any] | None = None,
):
    """The ``LlavaConfig`` of llava-tiny for ``tokenizer`` (which must already hold ``<image>``).

    ``text`` names a builtin text architecture of :mod:`harness.models.builtin`; its config comes from
    :func:`harness.models.builtin.builtin_config` with ``text_overrides`` (the ``model.config`` of a text builtin).
    """
    from transformers import LlavaConfig, SiglipVisionConfig

    if IMAGE_TOKEN not in tokenizer.get_vocab():
        raise ValueError("the tokenizer has no <image> token; call add_image_token first")
    text_config = builtin_config(ModelSpec(builtin=text, config=dict(text_overrides or {})), tokenizer)
    vision_config = SiglipVisionConfig(**{**VISION_DEFAULTS, **dict(vision_overrides or {})})
    n_image_tokens = (vision_config.image_size // vision_config.patch_size) ** 2
    return LlavaConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=n_image_tokens,
        vision_feature_select_strategy="full",  # SigLIP has no CLS token to drop
        vision_feature_layer=-1,
        projector_hidden_act="gelu",
        tie_word_embeddings=text_config.tie_word_embeddings,
    )


def build_processor(tokenizer, vision_config, pixel_gain: float = PIXEL_GAIN):
    """A ``LlavaProcessor`` for a SigLIP-style tower: PIL resizing to the tower's size (no torchvision),
    SigLIP's normalisation with its spread divided by ``pixel_gain`` (see :data:`PIXEL_GAIN`; saved with the
    processor, so a reloaded checkpoint sees the same pixels), one ``<image>`` per patch."""
    from transformers import LlavaProcessor, SiglipImageProcessorPil

    size = vision_config.image_size
    image_processor = SiglipImageProcessorPil(
        size={"height": size, "width": size}, image_mean=[0.5] * 3, image_std=[0.5 / pixel_gain] * 3
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=vision_config.patch_size,
        vision_feature_select_strategy="full",
        chat_template=CHAT_TEMPLATE,
        image_token=IMAGE_TOKEN,
        num_additional_image_tokens=0,
    )


def build_llava_tiny(
    tokenizer,
    seed: int,
    text: str = "qwen2-tiny",
    text_overrides: Mapping[str, Any] | None = None,
    vision_overrides: Mapping[str, Any] | None = None,
):
    """``(model, processor)``: a freshly initialised llava-tiny (deterministic for ``seed``).

    ``vision_overrides`` are fields of ``SiglipVisionConfig``, plus ``pixel_gain`` (the processor's, see
    :data:`PIXEL_GAIN`).

    Adds ``<image>`` to ``tokenizer`` (in place) before sizing the vocabulary, so the tokenizer the processor
    holds is the one the model was built for.
    """
    import torch
    from transformers import AutoModelForImageTextToText

    processor = llava_tiny_processor(tokenizer, vision_overrides)  # adds <image> first
    config = llava_tiny_config(tokenizer, text, text_overrides, _vision_settings(vision_overrides)[0])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa")
    _set_generation_ids(model, tokenizer)
    return model, processor


def llava_tiny_processor(tokenizer, vision_overrides: Mapping[str, Any] | None = None):
    """llava-tiny's processor around ``tokenizer``, which gets ``<image>`` (in place); ``vision_overrides`` as
    :func:`build_llava_tiny` takes them. What a run builds and what ``harness validate`` encodes with."""
    from transformers import SiglipVisionConfig

    add_image_token(tokenizer)
    fields, pixel_gain = _vision_settings(vision_overrides)
    return build_processor(tokenizer, SiglipVisionConfig(**{**VISION_DEFAULTS, **fields}), pixel_gain)


def _vision_settings(vision_overrides: Mapping[str, Any] | None) -> tuple[dict[str, Any], float]:
    """``(SiglipVisionConfig fields, the processor's pixel gain)`` of llava-tiny's ``vision`` overrides."""
    fields = dict(vision_overrides or {})
    return fields, float(fields.pop("pixel_gain", PIXEL_GAIN))


def load_image_text_model(
    path: str, dtype: str = "float32", revision: str | None = None, trust_remote_code: bool = False
):
    """``(model, processor)`` of any image-text-to-text model transformers supports, by local path or hub id.

    A tokenizer without a pad token pads with EOS (pad positions are always masked), as
    :func:`harness.models.builtin.load_hf` does for text models.
    """
    import torch
    from transformers import AutoModelForImageTextToText

    processor = load_image_text_processor(path, revision, trust_remote_code)
    model = AutoModelForImageTextToText.from_pretrained(
        path, revision=revision, dtype=getattr(torch, dtype), trust_remote_code=trust_remote_code
    )
    _set_generation_ids(model, processor.tokenizer)
    return model, processor


def load_image_text_processor(path: str, revision: str | None = None, trust_remote_code: bool = False):
    """The processor of an image-text model, as a run uses it: EOS pads a tokenizer without a pad token; a
    processor without a chat template is a ValueError (image examples could not be rendered)."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    if processor.tokenizer.pad_token is None:
        processor.tokenizer.pad_token = processor.tokenizer.eos_token
    if getattr(processor, "chat_template", None) is None:
        raise ValueError(f"{path}: the processor has no chat template; image examples cannot be rendered")
    return processor


def image_token_id(model) -> int:
    """The id whose positions receive image features (``config.image_token_id`` across LLaVA-style models)."""
    config = model.config
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    raise ValueError(f"{type(model).__name__}: the config names no image token id")


def _set_generation_ids(model, tokenizer) -> None:
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id


VISION_BUILTIN = "llava-tiny"


DEFAULT_TEXT = "qwen2-tiny"


_PROCESSORS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def register_processor(tokenizer, processor) -> None:
    """Remember ``processor`` as the one owning ``tokenizer`` (for :func:`processor_for`)."""
    _PROCESSORS[tokenizer] = processor


def processor_for(tokenizer) -> Any | None:
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
    return ModelSpec(
        builtin=spec.text or DEFAULT_TEXT,
        config=spec.config,
        tokenizer=spec.tokenizer,
        pretrain=spec.pretrain,
        dtype=spec.dtype,
    )


def with_processor(spec, tokenizer):
    """The tokenizer an image-text run encodes with, its processor registered — without building the model (for
    ``harness validate``): llava-tiny's processor around ``tokenizer`` (``<image>`` added, as the run does), or an
    ``hf`` model's own processor and its tokenizer."""
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


def part_notes(model, rows: list[dict[str, Any]], inputs: dict[str, Any]) -> list[str]:
    """One line per part (vision tower, projector, language model): parameters, trainable, and what goes in and
    comes out on the sample batch (from the per-module rows of :func:`harness.checks.inspection.inspect_model`)."""
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
    lines = [
        f"sample: input_ids {list(ids.shape)} with {n_image} image tokens; pixel_values "
        + (f"{list(pixels.shape)}" if pixels is not None else "none (text-only sample)")
    ]
    for part, names in parameters_by_part(base).items():
        total = sum(params[n].numel() for n in names)
        trainable = sum(params[n].numel() for n in names if params[n].requires_grad)
        row = first_row.get(part)
        out = f"; output {row['shape']} {row['dtype']} ({row['name']})" if row and row["shape"] else ""
        lines.append(f"part {part}: {total:,} parameters, {trainable:,} trainable{out}")
    return lines
