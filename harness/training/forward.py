"""The training forward: the model's logits at the supervised positions only (the loop's and DDP's one forward), for
text and image-text models alike (an image batch's pixels come as :meth:`harness.data.batches.Batch.extra_inputs`).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from harness.models.packed_attention import SEGMENTS_KWARG, packed_attention
from harness.training.compiling import forward_of

# Model types whose logits are exactly lm_head(last hidden state); for them the loss projects only supervised
# positions. Others (logit soft-capping, scaling) go through the model's own forward.
# LLaVA's too: its logits are its head on the language model's last hidden state (the projector feeds the image
# features in as input embeddings), which its body (:func:`_body`) returns with the images.
_HEAD_ONLY_TYPES = {"qwen2", "qwen3", "llama", "mistral", "gpt2", "qwen3_5", "qwen3_5_text", "olmo2", "phi3", "llava"}


def model_inputs(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor | None = None
) -> dict:
    """The keyword arguments of the model's forward: a padded batch's mask, or a packed batch's restarting
    positions with no mask and no cache — transformers' padding-free format (a cache, or any 2-D mask, turns off
    its detection of where examples start: attention would then cross them)."""
    if position_ids is None:
        return {"input_ids": input_ids, "attention_mask": attention_mask}
    return {"input_ids": input_ids, "position_ids": position_ids, "use_cache": False}


def _body(model) -> torch.nn.Module:
    """The module that returns the last hidden state: ``base_model``, or LLaVA's ``model`` where ``base_model`` is the
    whole model (transformers before 5 gave LLaVA an empty ``base_model_prefix``)."""
    body = model.base_model
    return model.model if body is model and hasattr(model, "model") else body


def supervised_logits(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    selected: torch.Tensor,
    compiled: bool | str = False,
    position_ids: torch.Tensor | None = None,
    segments: Any = None,
    extra_inputs: dict | None = None,
) -> torch.Tensor:
    """Logits ``[N, V]`` at the ``selected`` flat positions (row × T + t, as
    :attr:`harness.data.batches.Batch.supervised`) only; they gather without a host sync. ``compiled``: run the
    forward through ``torch.compile`` (:func:`harness.training.compiling.forward_of`: ``"auto"`` falls back to eager
    if compiling fails, ``True`` raises).
    ``position_ids``: a packed batch's (:mod:`harness.data.packed_batches`); ``attention_mask`` is then not passed.
    ``segments``: a varlen packed batch's plan (:class:`harness.data.segments.SegmentPlan`, planned on the host when
    the batch was packed and moved with it): the batch attends example by example
    (:mod:`harness.models.packed_attention`).
    ``extra_inputs``: an image batch's images (:meth:`~harness.data.batches.Batch.extra_inputs`), cast to the
    model's dtype; such a forward runs eager (a compiled vision tower is not measured), and without them an
    image-text model would silently see no images."""

    def pick(x: torch.Tensor) -> torch.Tensor:  # [B, T, …] → [N, …]
        return x.flatten(0, 1).index_select(0, selected)

    inputs, compiled, attending = _prepared(
        model, input_ids, attention_mask, compiled, position_ids, segments, extra_inputs
    )
    with attending:
        if _head_only(model):
            hidden = forward_of(_body(model), compiled)(**inputs).last_hidden_state
            return model.get_output_embeddings()(pick(hidden))
        return pick(forward_of(model, compiled)(**inputs).logits)


def _head_only(model) -> bool:
    return getattr(model.config, "model_type", None) in _HEAD_ONLY_TYPES and model.get_output_embeddings() is not None


def _prepared(model, input_ids, attention_mask, compiled, position_ids, segments, extra_inputs):
    """``(forward keyword arguments, compiled, attention context)`` of :func:`supervised_logits`."""
    inputs = model_inputs(input_ids, attention_mask, position_ids)
    if extra_inputs:
        dtype = next(model.parameters()).dtype
        inputs.update({k: v.to(dtype) if v.is_floating_point() else v for k, v in extra_inputs.items()})
        compiled = False
    attending = nullcontext()
    if segments is not None and position_ids is not None:
        inputs[SEGMENTS_KWARG] = segments
        attending = packed_attention(model)
    return inputs, compiled, attending


def output_head(model) -> torch.nn.Module | None:
    """The head module whose output on the last hidden state is the model's logits (a peft LoRA / HiRA layer when
    an adapter wraps it), or None where the logits are more than that (see ``_HEAD_ONLY_TYPES``)."""
    return model.get_output_embeddings() if _head_only(model) else None


def supervised_hidden(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    selected: torch.Tensor,
    compiled: bool | str = False,
    position_ids: torch.Tensor | None = None,
    segments: Any = None,
    extra_inputs: dict | None = None,
) -> torch.Tensor:
    """The last hidden state ``[N, H]`` at the ``selected`` flat positions: what :func:`supervised_logits` hands the
    head, for a model with an :func:`output_head` (the chunked loss, :mod:`harness.training.chunked_loss`)."""
    inputs, compiled, attending = _prepared(
        model, input_ids, attention_mask, compiled, position_ids, segments, extra_inputs
    )
    with attending:
        hidden = forward_of(_body(model), compiled)(**inputs).last_hidden_state
    return hidden.flatten(0, 1).index_select(0, selected)


def batch_logits(model, batch, selected: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`supervised_logits` of a whole :class:`~harness.data.batches.Batch` (images included), at ``selected``
    (default: its supervised positions), eager."""
    selected = batch.supervised if selected is None else selected
    return supervised_logits(
        model,
        batch.input_ids,
        batch.attention_mask,
        selected,
        position_ids=batch.position_ids,
        segments=batch.segments,
        extra_inputs=batch.extra_inputs(),
    )
