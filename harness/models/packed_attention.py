"""Attention over packed rows without a mask: each example attends only to itself, computed example by example
in a few padded blocks (``train.packing`` on a CPU, or wherever transformers' flash-attention varlen kernels are
not installed).

Why this exists: transformers' padding-free format (restarting ``position_ids``, no mask) makes sdpa and eager
attention build a block-diagonal mask over the whole packed row and attend over all of it — ``rows × width²``
scores and a mask as large, most of them masked out. Flash attention's varlen kernels (GPU) skip the masked blocks;
nothing in torch or transformers does that on a CPU (flex attention needs ``torch.compile``, whose packed steps
recompile on every row shape). So this module registers one more attention implementation, ``harness_varlen``,
with transformers' ``AttentionInterface``: the model's projections, MLPs and head run on the packed tokens (no
padding at all), and attention gathers each example's queries, keys and values into blocks of examples of
similar length, runs ``scaled_dot_product_attention`` with ``is_causal=True`` per block, and scatters the outputs
back — ``Σ blocks n·L²`` scores instead of ``rows × width²``. Padding inside a block sits after each example's
tokens, so the causal mask alone keeps every real query from it: no mask is built. The blocks (a
:class:`harness.data.segments.SegmentPlan`) are planned on the host once, when the batch is packed, and travel with
the batch to its device: the forward never reads positions back to plan them.

It is written by hand because no library provides it on a CPU (it is the CPU counterpart of flash-attention's
``flash_attn_varlen_func``, T. Dao, "FlashAttention-2", 2023, whose ``cu_seqlens`` convention it follows). Whether
a model honours it is not assumed: :func:`harness.training.packing_check.check_packing` proves the packed forward equal
to the padded one on the model before a stage trains on it.

The implementation is active only inside :func:`packed_attention` (the training forward of a packed batch), so
evaluation, generation and padded batches keep the model's own attention and masks.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

from harness.data.segments import SegmentPlan

NAME = "harness_varlen"
SEGMENTS_KWARG = "harness_segments"  # the keyword argument that carries the plan through the model to attention
# Implementations this one may stand in for during a packed forward: both are exact attention (flash-attention is
# left alone: its varlen kernels already skip the boundaries).
REPLACES = ("sdpa", "eager")


class UnsupportedAttention(ValueError):
    """The attention call asks for something this implementation does not do (a sliding window, soft-capping,
    attention weights, a mask): the packed check then tries the masked layout instead."""


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    dropout: float = 0.0,
    scaling=None,
    **kwargs,
):
    """transformers' attention-function signature: ``query`` [B, H, T, d], ``key``/``value`` [B, H_kv, T, d];
    returns ``([B, T, H, d], None)``. The plan comes in ``kwargs[SEGMENTS_KWARG]``."""
    plan: SegmentPlan = kwargs.get(SEGMENTS_KWARG)
    if plan is None or attention_mask is not None or kwargs.get("output_attentions"):
        raise UnsupportedAttention("harness_varlen attention needs a segment plan and no mask or attention weights")
    if kwargs.get("softcap") is not None or kwargs.get("sliding_window") is not None:
        raise UnsupportedAttention("harness_varlen attention does not do soft-capping or sliding windows")
    if kwargs.get("s_aux") is not None or kwargs.get("position_bias") is not None:
        raise UnsupportedAttention("harness_varlen attention does not do attention sinks or position biases")
    if kwargs.get("is_causal") is False or getattr(module, "is_causal", True) is False:
        raise UnsupportedAttention("harness_varlen attention is causal only")
    batch, heads, tokens, dim = query.shape
    if batch * tokens != plan.tokens:
        raise UnsupportedAttention(f"segment plan for {plan.tokens} tokens, attention over {batch * tokens}")
    groups = heads // key.shape[1]
    # [B, H, T, d] → [B·T, H, d]: usually the projections' own memory order, so usually views
    q, k, v = (x.transpose(1, 2).reshape(batch * tokens, x.shape[1], dim) for x in (query, key, value))
    outputs = []
    for block in plan.blocks:
        qb, kb, vb = (
            x.index_select(0, block.gather).view(block.n, block.length, x.shape[1], dim).transpose(1, 2)
            for x in (q, k, v)
        )
        if groups > 1:
            kb, vb = kb.repeat_interleave(groups, dim=1), vb.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(qb, kb, vb, dropout_p=dropout, is_causal=True, scale=scaling)
        outputs.append(out.transpose(1, 2).reshape(block.n * block.length, heads, dim))
    joined = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
    return joined.index_select(0, plan.source).view(batch, tokens, heads, dim), None


AttentionInterface.register(NAME, varlen_attention_forward)


def can_replace(model) -> bool:
    """Whether a packed forward of ``model`` may run through this implementation: sdpa or eager attention, a
    forward that passes extra keyword arguments on to attention (the plan travels as one), and no gradient
    checkpointing (its recomputation in the backward would run outside :func:`packed_attention`)."""
    if str(getattr(getattr(model, "config", None), "_attn_implementation", "") or "") not in REPLACES:
        return False
    if any(getattr(module, "gradient_checkpointing", False) is True for module in model.modules()):
        return False  # transformers' own test (is_activation_checkpointing), under any wrapper and version
    parameters = inspect.signature(model.forward).parameters.values()
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


@contextmanager
def packed_attention(model) -> Iterator[None]:
    """The model attends through ``harness_varlen`` inside this block (and its own implementation after it).
    transformers reads the implementation from the config at every forward, and builds no mask for an
    implementation without a registered mask function."""
    config = model.config
    # setting the implementation on a config sets it on its sub-configs too: each is restored to its own
    subs = [sub for key in getattr(config, "sub_configs", {}) if (sub := getattr(config, key, None)) is not None]
    before = [(config, config._attn_implementation)] + [(sub, sub._attn_implementation) for sub in subs]
    config._attn_implementation = NAME
    try:
        yield
    finally:
        for owner, implementation in before:
            owner._attn_implementation = implementation
