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
tokens, so the causal mask alone keeps every real query from it: no mask is built.

It is written by hand because no library provides it on a CPU (it is the CPU counterpart of flash-attention's
``flash_attn_varlen_func``, T. Dao, "FlashAttention-2", 2023, whose ``cu_seqlens`` convention it follows). Whether
a model honours it is not assumed: :func:`harness.training.packing.check_packing` proves the packed forward equal
to the padded one on the model before a stage trains on it.

The implementation is active only inside :func:`packed_attention` (the training forward of a packed batch), so
evaluation, generation and padded batches keep the model's own attention and masks.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from transformers import AttentionInterface

NAME = "harness_varlen"
SEGMENTS_KWARG = "harness_segments"  # the keyword argument that carries the plan through the model to attention
# Implementations this one may stand in for during a packed forward: both are exact attention (flash-attention is
# left alone: its varlen kernels already skip the boundaries).
REPLACES = ("sdpa", "eager")
# A block more costs about this many query-key pairs of work (kernel launches, gathers, forward and backward):
# measured with bench/packed_attention.py (qwen2-tiny shape, batch 32 of 15-81 tokens; docs/packing.md, Speed).
BLOCK_OVERHEAD_PAIRS = 16384
MAX_BLOCKS = 8


class UnsupportedAttention(ValueError):
    """The attention call asks for something this implementation does not do (a sliding window, soft-capping,
    attention weights, a mask): the packed check then tries the masked layout instead."""


@dataclass(frozen=True)
class Block:
    """Examples of similar length attended together: ``gather`` [n·L] flat token indices (example-major, each
    example's tokens then its padding, which points at token 0 and is never attended by
    an example's own queries: causality keeps it after them), ``n`` examples of at most
    ``length`` tokens."""

    gather: torch.Tensor
    n: int
    length: int


@dataclass(frozen=True)
class SegmentPlan:
    """Blocks covering every token of the packed rows once, and ``source`` [tokens]: where each flat token's output
    sits in the blocks' outputs laid end to end."""

    blocks: tuple[Block, ...]
    source: torch.Tensor
    tokens: int


def _blocks_of(lengths: Sequence[int]) -> list[tuple[int, int]]:
    """Cut lengths sorted longest first into at most :data:`MAX_BLOCKS` runs ``(start, end)`` minimising
    ``Σ n·L² + BLOCK_OVERHEAD_PAIRS`` per run (dynamic programming over the sorted lengths, each step over every
    (start, end) pair at once: it runs at every packed forward, and a batch of 256 examples made the plain loops
    cost 30 ms)."""
    n = len(lengths)
    longest = np.asarray(lengths, dtype=np.float64)
    ends = np.arange(n + 1)
    # span[i, j]: the run lengths[i:j] (its longest is lengths[i]); inf where it would be empty
    span = np.where(ends[None, :] > ends[:n, None], (ends[None, :] - ends[:n, None]) * longest[:, None] ** 2, np.inf)
    best = np.full((MAX_BLOCKS + 1, n + 1), np.inf)  # best[k, j]: the first j lengths in k runs
    cut = np.zeros((MAX_BLOCKS + 1, n + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for k in range(1, MAX_BLOCKS + 1):
        total = best[k - 1, :n, None] + span  # the k-th run is lengths[i:j]
        cut[k] = total.argmin(axis=0)  # the first minimum: the shortest earlier runs win ties
        best[k] = total.min(axis=0) + BLOCK_OVERHEAD_PAIRS
    k = int(best[1:, n].argmin()) + 1
    runs, j = [], n
    while k > 0:
        runs.append((int(cut[k, j]), j))
        j, k = int(cut[k, j]), k - 1
    return runs[::-1]


def segment_plan(position_ids: torch.Tensor) -> SegmentPlan:
    """The plan of packed rows whose positions restart at 0 at every example (a row's padded tail restarts too and
    is a segment of its own): segments are the runs between restarts, row by row."""
    flat = position_ids.reshape(-1).cpu()
    width = position_ids.shape[-1]
    starts = torch.nonzero((flat == 0) | (torch.arange(flat.numel()) % width == 0)).flatten().tolist()
    bounds = starts + [flat.numel()]
    segments = sorted(((bounds[i + 1] - bounds[i], bounds[i]) for i in range(len(starts))), key=lambda s: -s[0])
    lengths = [length for length, _ in segments]
    blocks, source = [], torch.empty(flat.numel(), dtype=torch.long)
    offset = 0
    for lo, hi in _blocks_of(lengths):
        length = lengths[lo]
        gather = torch.zeros(hi - lo, length, dtype=torch.long)
        for e, (n_tokens, start) in enumerate(segments[lo:hi]):
            gather[e, :n_tokens] = torch.arange(start, start + n_tokens)
            source[start : start + n_tokens] = torch.arange(n_tokens) + offset + e * length
        blocks.append(Block(gather.flatten().to(position_ids.device), hi - lo, length))
        offset += (hi - lo) * length
    return SegmentPlan(tuple(blocks), source.to(position_ids.device), flat.numel())


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
