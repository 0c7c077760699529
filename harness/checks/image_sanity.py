"""``harness sanity`` for image-text models: the overfit check scored with the images, and the *images matter* check.

*images matter* runs the :func:`~harness.evaluation.image_use.image_use` probe on the overfit set's image examples
(the model has just memorised them) and fails when the share of predictions that change when each item's image is
swapped for another's stays below a threshold: a model that memorised "What colour is the triangle?" for 128
different pictures without reading them cannot do better than the answer prior, and its predictions do not move
with the image. ``debug.drop_images: true`` trains and probes with all-zero pixels, so the check fails by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from harness.checks.result import CheckResult
from harness.data.images import collate_mixed, encode_image_examples
from harness.evaluation.image_use import image_use
from harness.models.modality import model_io
from harness.training.forward import batch_logits


def encode_with_processor(tokenizer, examples: Sequence[Any]) -> list | None:
    """The examples encoded through the tokenizer's processor (images included); ``None`` for a text model."""
    processor = model_io(tokenizer).processor
    return None if processor is None else encode_image_examples(processor, examples)


def teacher_forced_exact(model, encoded: Sequence[Any], pad_id: int, drop_images: bool, batch_size: int = 32) -> float:
    """Share of examples whose every supervised token is the argmax given the gold prefix, images included."""
    was_training = model.training
    model.eval()
    exact: list[bool] = []
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for start in range(0, len(encoded), batch_size):
                batch = collate_mixed(list(encoded[start : start + batch_size]), pad_id, drop_images).to(device)
                hits = batch_logits(model, batch).argmax(-1) == batch.labels.flatten()[batch.supervised]
                row_of = batch.supervised // batch.labels.shape[1]
                misses = torch.zeros(batch.labels.shape[0], device=device).index_add_(0, row_of, (~hits).float())
                exact += (misses == 0).tolist()
    finally:
        model.train(was_training)
    return float(np.mean(exact)) if exact else 0.0


def images_matter_check(
    model,
    tokenizer,
    examples: Sequence[Any],
    recipes: dict[str, Any],
    threshold: float,
    drop_images: bool,
    seed: int = 0,
):
    """The *images matter* :class:`~harness.checks.result.CheckResult` on the image examples, or ``None`` when there
    are none (a text model or no image task)."""
    processor = model_io(tokenizer).processor
    with_images = [ex for ex in examples if getattr(ex, "image", None) is not None]
    if processor is None or len(with_images) < 2:
        return None
    stats = image_use(
        model, processor, with_images, recipes, "train", seed=seed, drop_images=drop_images, max_new_tokens=8
    )
    changed = sum(round(s.dependence.value * s.dependence.n) for s in stats)
    n = sum(s.dependence.n for s in stats)
    dependence = changed / n
    details = {
        "items": n,
        "changed": changed,
        **{f"{s.task}_acc_real/blank": f"{s.acc.value:.2f}/{s.acc_blank.value:.2f}" for s in stats},
    }
    return CheckResult("images_matter", dependence >= threshold, dependence, threshold, details)
