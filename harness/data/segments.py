"""The segment plan of a packed batch whose forward attends example by example (``varlen``: the attention of
:mod:`harness.models.packed_attention`): blocks of examples of similar length, each example's tokens gathered into one
block row, and where each token's output comes back from. Planned on the host once, when the batch is packed
(:func:`harness.data.packed_batches.pack`, :func:`harness.data.packed_batches.rows_of`), and moved to the device with
the batch (:meth:`harness.data.batches.Batch.to`): a planning step at every forward would read the positions back from
the GPU (a device-to-host sync per step).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from harness.data.batches import to_device  # the plan moves as the batch's own tensors do

if TYPE_CHECKING:
    import torch

# A block more costs about this many query-key pairs of work (kernel launches, gathers, forward and backward):
# measured with bench/packed_attention.py (docs/packing.md, Speed).
BLOCK_OVERHEAD_PAIRS = 16384
MAX_BLOCKS = 8


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

    def to(self, device) -> SegmentPlan:
        """The plan on ``device`` (itself when already there)."""
        import torch

        device = torch.device(device)
        if self.source.device == device:
            return self
        blocks = tuple(Block(to_device(b.gather, device), b.n, b.length) for b in self.blocks)
        return SegmentPlan(blocks, to_device(self.source, device), self.tokens)


def _blocks_of(lengths: Sequence[int]) -> list[tuple[int, int]]:
    """Cut lengths sorted longest first into at most :data:`MAX_BLOCKS` runs ``(start, end)`` minimising
    ``Σ n·L² + BLOCK_OVERHEAD_PAIRS`` per run (dynamic programming over the sorted lengths, each step over every
    (start, end) pair at once: plain loops were slow on large batches, docs/packing.md, Speed)."""
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
    is a segment of its own): segments are the runs between restarts, row by row. Reads ``position_ids`` on the
    host: call it where they are (packing, on the CPU)."""
    import torch

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
