"""Training batches: length-grouped (and task-stratified) batching of encoded examples, and padded collation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.data.encoding import IGNORE_INDEX, Encoded


def length_grouped_batches(
    examples: list[Encoded], batch_size: int, group: int, rng: np.random.Generator
) -> list[list[Encoded]]:
    """Split the stream into batches of ``batch_size``; with ``group`` > 1, group similar lengths together.

    Grouping works on windows of batches: the stream is split evenly into windows of at least ``group`` batches
    (fewer than ``2 × group``; a shorter stream is one window: a 37-step stage with ``group: 32`` is one window of
    37, not 32 and a short one of 5 that would pad much more). Within a window the grouping is *stratified by
    task*: each task's examples are sorted by length and dealt across the window's batches in that order, so batch
    ``j`` holds the ``j``-th slice of every task — similar lengths within a task, and the window's task
    composition (≈ the stage's mixture) in every batch. A plain length sort would instead fill each batch with one
    task (the longest-answer task's batch, the shortest's…): consecutive steps then train on different single
    tasks, a seesaw made by the batcher. The window's batches are then shuffled, so long and short interleave.

    Within one task, grouped batches still hold one length class of the data (for addition, one answer length):
    ``bench/plain_vs_harness.py`` measures what that costs, which is why grouping is off by default.
    """
    if group <= 1:
        return [examples[i : i + batch_size] for i in range(0, len(examples), batch_size)]
    batches: list[list[Encoded]] = []
    n_batches = -(-len(examples) // batch_size)
    n_windows = max(1, n_batches // group)
    bounds = [k * n_batches // n_windows * batch_size for k in range(n_windows + 1)]
    for start, end in zip(bounds, bounds[1:]):
        chunk = _stratified_by_task(examples[start:end])
        chunk_batches = [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
        batches.extend(chunk_batches[j] for j in rng.permutation(len(chunk_batches)))
    return batches


def _stratified_by_task(window: list[Encoded]) -> list[Encoded]:
    """The window ordered by each example's length *quantile within its task*: cutting the result into
    consecutive batches deals every task's examples across all batches in length order."""
    by_task: dict[str, list[Encoded]] = {}
    for example in window:
        by_task.setdefault(example.task, []).append(example)
    keyed = []
    for task_index, members in enumerate(by_task.values()):
        members.sort(key=lambda e: e.length)  # stable: equal lengths keep their stream order
        keyed += [((rank + 0.5) / len(members), task_index, e) for rank, e in enumerate(members)]
    keyed.sort(key=lambda k: (k[0], k[1]))
    return [e for _, _, e in keyed]


@dataclass(frozen=True)
class Layout:
    """Where a packed batch's examples are (:mod:`harness.data.packed_batches`): ``spans[i] = (row, start, length)`` of
    example ``i`` in sampler order, the pad id of the rows' tails, the row-width factor that laid them out, and
    whether the forward attends example by example (``varlen``: :mod:`harness.models.packed_attention`) rather
    than through the block-diagonal mask transformers derives from the positions."""

    spans: tuple[tuple[int, int, int], ...]
    pad_id: int
    factor: int | None
    varlen: bool = False


def to_device(t: Any, device: Any) -> Any:
    """Tensor ``t`` on ``device`` (a ``torch.device``): to a GPU through pinned memory, without blocking the host."""
    if device.type != "cuda":
        return t.to(device)
    return (t.pin_memory() if t.device.type == "cpu" else t).to(device, non_blocking=True)


@dataclass
class Batch:
    input_ids: Any  # LongTensor [B, T]
    attention_mask: Any  # LongTensor [B, T]: 1 on real tokens (a packed batch's model forward gets no mask)
    labels: Any  # LongTensor [B, T], already shifted (position t predicts token t+1)
    tasks: list[str]  # one per example, in sampler order
    n_real_tokens: int
    n_padded_tokens: int
    # Flat positions (row × T + t) of the supervised tokens, in row-major order: the loop gathers hidden states and
    # labels with them, so it never searches the label mask on the device (no host sync). Computed when absent.
    # A packed batch lists them in sampler order (example by example), as a padded one does.
    supervised: Any = None  # LongTensor [N]
    # Packed batches only (None when padded): positions restarting at 0 per example [B, T], and the layout.
    position_ids: Any = None
    example_of_token: Any = None  # LongTensor [N]: the example (index into tasks) of each supervised token
    layout: Layout | None = None
    # A varlen packed batch's attention plan (harness.data.segments.SegmentPlan), planned on the host when packed.
    segments: Any = None

    def __post_init__(self):
        if self.supervised is None:
            self.supervised = (self.labels.flatten() != IGNORE_INDEX).nonzero().flatten()
        if self.example_of_token is None:  # padded: one example per row
            self.example_of_token = self.supervised // self.labels.shape[1]

    @property
    def packed(self) -> bool:
        return self.position_ids is not None

    def row_slice(self, start: int, end: int) -> Batch:
        """Rows ``start:end`` of a padded batch, at the batch's width (a data-parallel rank's share)."""
        mask = self.attention_mask[start:end]
        return Batch(
            self.input_ids[start:end],
            mask,
            self.labels[start:end],
            self.tasks[start:end],
            int(mask.sum()),
            int(mask.numel()),
        )

    def extra_inputs(self) -> dict[str, Any]:
        """Model inputs beyond the tokens (an image batch's pixels: :class:`harness.data.images.VisionBatch`)."""
        return {}

    def to(self, device) -> Batch:
        """The batch on ``device``; to a GPU through pinned memory, without blocking the host."""
        import torch

        device = torch.device(device)
        if self.input_ids.device == device:
            return self

        def move(t):
            return None if t is None else to_device(t, device)

        return Batch(
            move(self.input_ids),
            move(self.attention_mask),
            move(self.labels),
            self.tasks,
            self.n_real_tokens,
            self.n_padded_tokens,
            move(self.supervised),
            move(self.position_ids),
            move(self.example_of_token),
            self.layout,
            None if self.segments is None else self.segments.to(device),
        )


def collate(examples: list[Encoded], pad_id: int) -> Batch:
    """Right-pad a batch; padding gets attention 0 and no label."""
    import torch

    width = max(e.length for e in examples)
    ids = np.full((len(examples), width), pad_id, dtype=np.int64)
    labels = np.full((len(examples), width), IGNORE_INDEX, dtype=np.int64)
    mask = np.zeros((len(examples), width), dtype=np.int64)
    for row, e in enumerate(examples):
        ids[row, : e.length] = e.input_ids
        labels[row, : e.length] = e.labels
        mask[row, : e.length] = 1
    real = int(mask.sum())
    supervised = np.flatnonzero(labels != IGNORE_INDEX)
    return Batch(
        torch.from_numpy(ids),
        torch.from_numpy(mask),
        torch.from_numpy(labels),
        [e.task for e in examples],
        real,
        int(mask.size),
        torch.from_numpy(supervised),
    )


def task_share_max(tasks: list[str]) -> float:
    """The largest single task's share of a batch's examples (``train/batch_task_share_max``)."""
    return max(map(tasks.count, set(tasks))) / len(tasks)
