"""Encoding image examples for image-text models, and collating batches that mix image and text-only rows.

An example with an ``image`` (see :class:`data_recipes.base.Example`) is rendered with the processor's chat
template, the image placed as an ``{"type": "image"}`` part before the first user turn's text; the processor
expands the placeholder into one image token per patch and turns the image into ``pixel_values``. Labels are
completion-only, as in :mod:`harness.data.batches`: a token is supervised when it overlaps an assistant turn's
characters (found with :func:`harness.data.batches.assistant_spans` on the unexpanded text, then shifted by the
expansion, which happens before every assistant turn), and image-token positions are never supervised. Text-only
examples go through the same processor with no image and encode exactly as
:func:`harness.data.batches.encode_examples` would.

Batches: :func:`collate_mixed` right-pads like :func:`harness.data.batches.collate` and stacks ``pixel_values`` of
the rows that have an image, in row order — LLaVA-style models scatter image features into the image-token positions
in row-major order, so text-only rows simply have no image tokens and take no pixel values. ``drop_images=True``
replaces every image's pixels by zeros while keeping the image tokens: the vision tower and projector stay in the
graph (a projector-only stage still trains) but every image looks the same, which reproduces the seed's "trained
for days without its images" bug on purpose.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.data.batches import Batch, collate
from harness.data.encoding import IGNORE_INDEX, Encoded, assistant_spans


@dataclass(frozen=True)
class ImageEncoded(Encoded):
    """An :class:`~harness.data.batches.Encoded` example plus its image (``None`` for text-only examples)."""

    pixel_values: np.ndarray | None = None  # float32 [3, H, W], the processor's output
    image_id: str | None = None
    prompt_length: int = 0  # tokens before the last assistant turn's content: the evaluation prompt

    @property
    def has_image(self) -> bool:
        return self.pixel_values is not None


def chat_messages(messages: Sequence[dict[str, str]], with_image: bool) -> list[dict[str, Any]]:
    """Messages in the processors' structured form; the image (if any) leads the first user turn (after a system
    turn, when the task has one)."""
    first = 1 if messages and messages[0]["role"] == "system" else 0
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        parts: list[dict[str, Any]] = [{"type": "text", "text": message["content"]}]
        if with_image and i == first:
            if message["role"] != "user":
                raise ValueError("an image example must start with a user turn (after an optional system turn)")
            parts.insert(0, {"type": "image"})
        out.append({"role": message["role"], "content": parts})
    return out


def encode_image_examples(
    processor, examples: Sequence[Any], images: Sequence[Any] | None = None
) -> list[ImageEncoded]:
    """Encode examples with completion-only labels; ``images`` replaces each example's image (the probe's blank
    and swapped conditions), ``None`` entries meaning "no image". Examples without images encode as text."""
    images = [ex.image for ex in examples] if images is None else list(images)
    if len(images) != len(examples):
        raise ValueError("one image (or None) per example")
    out: list[ImageEncoded | None] = [None] * len(examples)
    for with_image in (True, False):  # one processor call per kind: a batch call needs one image per placeholder
        rows = [i for i, image in enumerate(images) if (image is not None) == with_image]
        if rows:
            for i, encoded in zip(
                rows,
                _encode_group(
                    processor, [examples[i] for i in rows], [images[i] for i in rows] if with_image else None
                ),
            ):
                out[i] = encoded
    return out  # type: ignore[return-value]


def _encode_group(processor, examples: Sequence[Any], images: Sequence[Any] | None) -> list[ImageEncoded]:
    with_image = images is not None
    rendered = [assistant_spans(processor, chat_messages(ex.messages, with_image)) for ex in examples]
    kwargs: dict[str, Any] = dict(images=list(images)) if with_image else {}
    batch = processor(text=[text for text, _ in rendered], return_offsets_mapping=True, padding=False, **kwargs)
    image_id = _image_token_id(processor)
    out = []
    for row, (ex, (text, spans)) in enumerate(zip(examples, rendered)):
        ids = np.asarray(batch["input_ids"][row], dtype=np.int64)
        offsets = np.asarray(batch["offset_mapping"][row])
        # The expansion (one placeholder → one token per patch) happens before the first assistant turn, so the
        # rendered text's tail is unchanged and every span moves by the same number of characters.
        placeholder = text.rfind(processor.image_token) if with_image else -1
        if spans and placeholder >= spans[0][0]:
            raise ValueError(f"task {ex.task!r}: the image placeholder follows an assistant turn")
        shift = int(offsets[:, 1].max()) - len(text)
        labels = np.full_like(ids, IGNORE_INDEX)
        for t, (s, e) in enumerate(offsets):
            if e > s and any(s < end + shift and e > start + shift for start, end in spans):
                labels[t] = ids[t]
        labels[ids == image_id] = IGNORE_INDEX  # never supervise an image position, whatever the template does
        last_start = spans[-1][0] + shift
        prompt_length = int((offsets[:, 0] < last_start).sum())
        if prompt_length and offsets[prompt_length - 1, 1] > last_start:
            raise ValueError(f"task {ex.task!r}: a token straddles the prompt and the answer; cannot split them")
        pixels = np.asarray(batch["pixel_values"][row], dtype=np.float32) if with_image else None
        out.append(
            ImageEncoded(
                ex.task,
                ids,
                np.concatenate([labels[1:], [IGNORE_INDEX]]),
                pixels,
                ex.meta.get("image_id") if with_image else None,
                prompt_length,
            )
        )
    return out


def _image_token_id(processor) -> int:
    token_id = getattr(processor, "image_token_id", None)
    return int(token_id if token_id is not None else processor.tokenizer.convert_tokens_to_ids(processor.image_token))


@dataclass
class VisionBatch(Batch):
    """A :class:`~harness.data.batches.Batch` plus the stacked images of its image rows (``None`` when none)."""

    pixel_values: Any = None  # FloatTensor [n_images, 3, H, W], rows with an image in row order
    image_rows: tuple[int, ...] = ()

    @classmethod
    def of(cls, text: Batch, pixels: Any, image_rows: tuple[int, ...]) -> VisionBatch:
        """A text batch's tensors with the images of its ``image_rows``."""
        return cls(
            text.input_ids,
            text.attention_mask,
            text.labels,
            text.tasks,
            text.n_real_tokens,
            text.n_padded_tokens,
            text.supervised,
            pixel_values=pixels,
            image_rows=image_rows,
        )

    def row_slice(self, start: int, end: int) -> VisionBatch:
        """Rows ``start:end`` with the images of those rows (a data-parallel rank's share keeps its pixels)."""
        text = super().row_slice(start, end)
        kept = [k for k, row in enumerate(self.image_rows) if start <= row < end]
        pixels = self.pixel_values[kept[0] : kept[-1] + 1] if kept else None  # image rows are in row order
        return VisionBatch.of(text, pixels, tuple(self.image_rows[k] - start for k in kept))

    def extra_inputs(self) -> dict[str, Any]:
        """The stacked images, when the batch has any (the forward casts them to the model's dtype)."""
        return {} if self.pixel_values is None else {"pixel_values": self.pixel_values}

    def to(self, device) -> VisionBatch:
        moved = super().to(device)
        if moved is self:
            return self
        pixels = None if self.pixel_values is None else self.pixel_values.to(device)
        return VisionBatch.of(moved, pixels, self.image_rows)


def collate_mixed(examples: Sequence[Encoded], pad_id: int, drop_images: bool = False) -> VisionBatch:
    """Right-pad a batch that may mix image and text-only rows (see the module docstring for ``drop_images``)."""
    import torch

    base = collate(list(examples), pad_id)
    rows = tuple(i for i, e in enumerate(examples) if getattr(e, "pixel_values", None) is not None)
    pixels = None
    if rows:
        pixels = torch.from_numpy(np.stack([examples[i].pixel_values for i in rows]))
        if drop_images:
            pixels = torch.zeros_like(pixels)
    return VisionBatch.of(base, pixels, rows)


def left_padded_prompts(
    encoded: Sequence[ImageEncoded], pad_id: int, drop_images: bool = False
) -> tuple[Any, Any, dict[str, Any]]:
    """``(input_ids, attention_mask, images)`` of the items' prompts, left-padded for ``generate``; ``images`` the
    keyword inputs of their stacked images when every item has one (zeros with ``drop_images``), else empty."""
    import torch

    width = max(e.prompt_length for e in encoded)
    ids = torch.full((len(encoded), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, e in enumerate(encoded):
        ids[row, width - e.prompt_length :] = torch.from_numpy(e.input_ids[: e.prompt_length])
        mask[row, width - e.prompt_length :] = 1
    if not all(e.has_image for e in encoded):
        return ids, mask, {}
    pixels = torch.from_numpy(np.stack([e.pixel_values for e in encoded]))
    return ids, mask, {"pixel_values": torch.zeros_like(pixels) if drop_images else pixels}


def stage_collator(examples: Sequence[Encoded], pad_id: int, drop_images: bool = False) -> tuple[Callable, bool]:
    """``(collate, holds_images)`` for a stage whose examples are ``examples``: when any has an image, every batch
    is collated with the images (:func:`collate_mixed`, a :class:`VisionBatch` even for a batch without one), else
    plainly (:func:`harness.data.batches.collate`: a text stage of an image-text model trains as a text model's)."""
    if any(getattr(e, "pixel_values", None) is not None for e in examples):
        return functools.partial(collate_mixed, pad_id=pad_id, drop_images=drop_images), True
    return functools.partial(collate, pad_id=pad_id), False
