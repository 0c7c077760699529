"""What differs between a text model and an image-text model on the data side, decided once: the run's
:func:`model_io` — :class:`TextIO` or :class:`ImageTextIO`, from whether the base model's tokenizer has a processor
(:func:`harness.models.image_text.register_processor`, which the image-text base loaders call) — encodes a task's
training examples, gives the sample batch ``harness inspect`` runs and names what a
checkpoint saves beside the weights. The training forward needs no choice (an image batch carries its pixels,
:meth:`harness.data.batches.Batch.extra_inputs`), and the base model is chosen by :func:`base_kind`.

Code downstream calls these instead of asking the model or the batch whether images are involved.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.data.batches import Batch, collate
from harness.data.encoding import Encoded, encode_examples
from harness.data.images import collate_mixed, encode_image_examples
from harness.data.task_data import TextOnlyModel
from harness.models.image_text import is_image_model, part_notes, processor_for


def base_kind(spec) -> str:
    """Which base model a :class:`~harness.config.ModelSpec` builds: ``image-text`` (``llava-tiny`` or an
    image-text ``hf`` architecture), ``hf`` (a text model by path or hub id) or ``builtin``."""
    if is_image_model(spec):
        return "image-text"
    return "hf" if spec.hf else "builtin"


class TextIO:
    """A text model's: examples through its tokenizer's chat template, batches right-padded (packed later, where the
    stage decides to pack)."""

    processor = None

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode_train(self, examples: Sequence[Any], has_images: bool) -> list[Encoded]:
        """A task's training examples with their label masks; ``has_images``: the task's recipe makes images."""
        if has_images:
            raise TextOnlyModel()
        return encode_examples(self.tokenizer, examples)

    def sample_batch(self, examples: Sequence[Any]) -> Batch:
        """A few examples as one batch, as the model reads them (``harness inspect``)."""
        return collate(encode_examples(self.tokenizer, examples), self.tokenizer.pad_token_id)

    def saved_with_weights(self):
        """What a Hugging Face checkpoint saves beside the weights: the tokenizer (an image-text model's processor)."""
        return self.tokenizer

    def part_notes(self, model, rows: list[dict[str, Any]], inputs: dict[str, Any]) -> list[str]:
        """``harness inspect``'s lines per model part (an image-text model's vision tower, projector, language
        model); a text model is one part."""
        return []


class ImageTextIO(TextIO):
    """An image-text model's: image tasks through its processor (one image token per patch, ``pixel_values``), text
    tasks as a text model's (a stage's batches: :func:`harness.data.images.stage_collator`)."""

    def __init__(self, tokenizer, processor):
        super().__init__(tokenizer)
        self.processor = processor

    def encode_train(self, examples: Sequence[Any], has_images: bool) -> list[Encoded]:
        if has_images:
            return encode_image_examples(self.processor, examples)
        return encode_examples(self.tokenizer, examples)

    def sample_batch(self, examples: Sequence[Any]) -> Batch:
        return collate_mixed(encode_image_examples(self.processor, examples), self.tokenizer.pad_token_id)

    def saved_with_weights(self):
        return self.processor

    def part_notes(self, model, rows: list[dict[str, Any]], inputs: dict[str, Any]) -> list[str]:
        return part_notes(model, rows, inputs)


def model_io(tokenizer) -> TextIO:
    """The data side of the model whose tokenizer is ``tokenizer`` (see the module docstring)."""
    processor = processor_for(tokenizer)
    return TextIO(tokenizer) if processor is None else ImageTextIO(tokenizer, processor)
