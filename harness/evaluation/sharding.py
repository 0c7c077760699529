"""Evaluation shared out over data-parallel ranks: what each rank sends and how the whole is put back together.

Each rank runs every pass (greedy, teacher forced, first-token) on its share of that pass's *batches*
(:func:`harness.evaluation.passes._batches`), so every batch is computed exactly as one process computes it and
no prediction depends on the number of ranks. The passes sort items differently, so one item's fields may come
from different ranks; each rank therefore sends, per item it touched, the fields it filled in
(:func:`computed_fields`), and every rank merges all of them (:func:`merge_computed`) before the metrics, which are
then computed from complete records in item order: the same metrics and ``samples.jsonl`` lines as one process.
"""

from __future__ import annotations

from typing import Any, Protocol

from harness.evaluation.components import ItemRecord

#: The :class:`ItemRecord` fields the model passes fill in (``pred``, ``correct`` and ``mode_ok`` are derived from
#: ``pred_ids`` afterwards, on the merged records).
MODEL_FIELDS = (
    "pred_ids",
    "truncated",
    "tf_hits",
    "tf_nll",
    "gold_first_token",
    "gold_first_rank",
    "first_nonfinite",
    "top1_id",
    "top1_token",
    "top5",
    "choice_p",
)


class Shard(Protocol):
    """This rank's place among the ranks that evaluate together
    (:class:`harness.training.parallel.ddp.DataParallel`)."""

    rank: int
    world: int

    def all_gather(self, obj: Any) -> list[Any]:
        """``obj`` of every rank, in rank order (a collective: every rank calls it)."""


def computed_fields(records: list[ItemRecord]) -> dict[int, dict[str, Any]]:
    """``{item index: {field: value}}`` of the model fields this rank filled in (plain Python values)."""
    out = {}
    for i, rec in enumerate(records):
        fields = {name: getattr(rec, name) for name in MODEL_FIELDS if getattr(rec, name) is not None}
        if fields:
            out[i] = fields
    return out


def merge_computed(records: list[ItemRecord], parts: list[dict[int, dict[str, Any]]]) -> None:
    """Fill ``records`` in place with every rank's :func:`computed_fields`."""
    for part in parts:
        for i, fields in part.items():
            for name, value in fields.items():
                setattr(records[i], name, value)
