"""Padding-free training batches (``train.packing``): a step's examples — the very ones, in the same number, that
the mixture sampler drew for the padded batch — laid end to end in a few rows, each with its own positions
(``position_ids`` restart at 0 per example) and nothing to attend outside itself.

The layout is transformers' own padding-free format (``DataCollatorWithFlattening``'s): no attention mask, position
ids that restart per example; transformers derives each example's block of the causal mask from where the
positions restart (``masking_utils.find_packed_sequence_indices``: sdpa and eager build a block-diagonal mask, the
flash-attention kernels run varlen on the same boundaries). Whether a model honours it is not assumed: the run
proves it on the model before training (:mod:`harness.training.packing_check`).

Rows: the step's examples are spread over a few rows of nearly equal length (:func:`balanced_rows`), each about
``factor`` × the longest example wide; the rows' tails (what the fullest row has more) are padding, a segment of
their own (positions restart there too) with no label. ``factor=None`` puts the whole step in one row (no
padding at all: what flash-attention's varlen kernels want); with sdpa or eager attention, whose mask costs
``rows × width²``, a few rows cost less than one (docs/packing.md).

The supervised positions are listed in the *sampler's example order* (example 0's tokens, then example 1's, …),
as the padded batch lists them, so the per-token losses come out in the same order and every sum over them (the
loss, per-task sums) adds the same numbers in the same order as the padded batch does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from harness.data.batches import Batch, Layout
from harness.data.encoding import IGNORE_INDEX
from harness.data.segments import segment_plan

# Rows this many times the batch's longest example wide (measured on the micro model, docs/packing.md).
ROW_WIDTH_FACTOR = 4


def balanced_rows(lengths: Sequence[int], n_rows: int) -> list[list[int]]:
    """Example indices per row, ``n_rows`` rows of nearly equal token counts: longest first, each to the row with
    the fewest tokens so far (LPT; R. L. Graham, "Bounds on multiprocessing timing anomalies", SIAM J. Appl. Math.
    17(2), 1969: the fullest row holds at most 4/3 of the optimum). Within a row, examples keep sampler order."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = [[] for _ in range(max(1, min(n_rows, len(lengths))))]
    filled = [0] * len(rows)
    for i in order:
        r = min(range(len(rows)), key=lambda k: (filled[k], k))
        rows[r].append(i)
        filled[r] += lengths[i]
    return [sorted(row) for row in rows if row]


def row_count(lengths: Sequence[int], factor: int | None = ROW_WIDTH_FACTOR) -> int:
    """Rows of about ``factor`` × the longest example (``None``: one row holding every example)."""
    if factor is None:
        return 1
    return max(1, round(sum(lengths) / (factor * max(lengths))))


def pack(
    examples: Sequence[tuple[np.ndarray, np.ndarray]],
    tasks: Sequence[str],
    pad_id: int,
    factor: int | None = ROW_WIDTH_FACTOR,
    varlen: bool = False,
) -> Batch:
    """A packed :class:`~harness.data.batches.Batch` of ``examples`` (``(input_ids, labels)`` per example, labels
    already shifted and ending with ``IGNORE_INDEX``) and their ``tasks``; ``varlen``: the forward attends
    example by example (:class:`~harness.data.batches.Layout`)."""
    import torch

    lengths = [len(ids) for ids, _ in examples]
    placement = balanced_rows(lengths, row_count(lengths, factor))
    width = max(sum(lengths[i] for i in row) for row in placement)
    ids = np.full((len(placement), width), pad_id, dtype=np.int64)
    labels = np.full((len(placement), width), IGNORE_INDEX, dtype=np.int64)
    positions = np.zeros((len(placement), width), dtype=np.int64)
    mask = np.zeros((len(placement), width), dtype=np.int64)
    spans: list[tuple[int, int, int]] = [(0, 0, 0)] * len(examples)
    for r, row in enumerate(placement):
        start = 0
        for i in row:
            n = lengths[i]
            ids[r, start : start + n], labels[r, start : start + n] = examples[i][0], examples[i][1]
            positions[r, start : start + n] = np.arange(n)
            mask[r, start : start + n] = 1
            spans[i] = (r, start, n)
            start += n
        positions[r, start:] = np.arange(width - start)  # the tail: a padding segment of its own
    supervised, example_of_token = [], []
    for i, (r, start, n) in enumerate(spans):  # sampler order: the padded batch's order of supervised tokens
        at = np.flatnonzero(labels[r, start : start + n] != IGNORE_INDEX) + r * width + start
        supervised.append(at)
        example_of_token.append(np.full(len(at), i, dtype=np.int64))
    position_ids = torch.from_numpy(positions)
    return Batch(
        torch.from_numpy(ids),
        torch.from_numpy(mask),
        torch.from_numpy(labels),
        list(tasks),
        int(sum(lengths)),
        int(ids.size),
        torch.from_numpy(np.concatenate(supervised)),
        position_ids=position_ids,
        example_of_token=torch.from_numpy(np.concatenate(example_of_token)),
        layout=Layout(tuple(spans), pad_id, factor, varlen),
        segments=segment_plan(position_ids) if varlen else None,
    )


def pack_encoded(examples: Sequence, pad_id: int, factor: int | None = ROW_WIDTH_FACTOR, varlen: bool = False) -> Batch:
    """:func:`pack` of encoded examples (:class:`harness.data.encoding.Encoded`)."""
    return pack([(e.input_ids, e.labels) for e in examples], [e.task for e in examples], pad_id, factor, varlen)


def examples_of(batch: Batch) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(input_ids, labels)`` of every example of a batch, in sampler order (packed or padded)."""
    ids, labels = batch.input_ids.cpu().numpy(), batch.labels.cpu().numpy()
    if batch.layout is not None:
        return [(ids[r, s : s + n], labels[r, s : s + n]) for r, s, n in batch.layout.spans]
    lengths = batch.attention_mask.sum(dim=1).tolist()
    return [(ids[r, :n], labels[r, :n]) for r, n in enumerate(lengths)]


def rows_of(batch: Batch, start: int, end: int) -> Batch:
    """Rows ``start:end`` of a packed ``batch``, with the examples they hold (in sampler order): a data-parallel
    rank's share that computes each row exactly as one process does (same rows, same width) — the counterpart of
    a padded batch's row slice. The ranks hold different examples than contiguous slices would give them, which
    changes nothing: the loss is the global token mean (:meth:`harness.training.parallel.ddp.DataParallel.global_mean`),
    and every example lies within one row (``reduction: example`` normalises within the rank)."""
    import torch

    width = batch.input_ids.shape[1]
    kept = [i for i, (row, _, _) in enumerate(batch.layout.spans) if start <= row < end]
    labels = batch.labels[start:end]
    supervised, example_of_token, spans = [], [], []
    for k, i in enumerate(kept):
        row, offset, n = batch.layout.spans[i]
        at = torch.nonzero(labels[row - start, offset : offset + n] != IGNORE_INDEX).flatten()
        supervised.append(at + (row - start) * width + offset)
        example_of_token.append(torch.full((len(at),), k, dtype=torch.int64))
        spans.append((row - start, offset, n))
    mask, position_ids = batch.attention_mask[start:end], batch.position_ids[start:end]
    return Batch(
        batch.input_ids[start:end],
        mask,
        labels,
        [batch.tasks[i] for i in kept],
        int(mask.sum()),
        int(mask.numel()),
        torch.cat(supervised),
        position_ids=position_ids,
        example_of_token=torch.cat(example_of_token),
        layout=replace(batch.layout, spans=tuple(spans)),
        segments=segment_plan(position_ids) if batch.layout.varlen else None,
    )


def pack_like(batch: Batch, examples: Sequence[tuple[np.ndarray, np.ndarray]], tasks: Sequence[str]) -> Batch:
    """:func:`pack` of ``examples`` with the layout settings (pad id, row factor, attention) of packed ``batch``."""
    layout = batch.layout
    return pack(examples, tasks, layout.pad_id, layout.factor, layout.varlen)


def repacked(batch: Batch, start: int, end: int) -> Batch:
    """The packed batch of examples ``start:end`` of a packed ``batch`` (a data-parallel rank's slice), laid out
    as the whole batch was."""
    return pack_like(batch, examples_of(batch)[start:end], batch.tasks[start:end])
