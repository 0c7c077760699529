"""Which batches a stage trains on (``train.packing``), decided at the stage's start on the model it trains: the
plan's padded batches, or the same examples packed (:mod:`harness.data.packed_batches`) once
:func:`harness.training.packing_check.check_packing` has shown them exact on that model.

Packed layouts are tried best first (:func:`layouts`): under sdpa or eager attention one row attended example by example
(:mod:`harness.models.packed_attention`), then rows with transformers' block-diagonal mask; under flash attention one
row. ``auto`` (the default) packs with the first layout proven exact and otherwise pads, with one warning line naming
the model type and what leaked; ``true`` stops with :class:`~harness.training.packing_check.PackingError` (exit 2)
instead; ``false`` pads without checking. Image batches are padded (``true`` is refused when the stage is planned,
before training), and so are stages that compile their forward under ``auto`` (packed compiled steps are slow:
docs/packing.md). The check's result is a store row at the stage's first step: ``train/packing_max_rel_diff`` (and the
tolerance it was held to, ``train/packing_tolerance``; ``train/packed`` 1 or 0 says which batches trained,
``train/packing_varlen`` 1 when they attend example by example).

On several ranks each rank checks its own slice of the batches (the rows the loop will train on that rank, and the
same examples padded), so no rank holds more activations for the check than it trains with; the ranks' checks are
then exchanged and every rank acts on the same one, the check closest to failing: all pack with the same layout, or
all pad, or under ``true`` all stop with the same one-line error (exit 2) — none is left waiting in a collective.

The decision (:func:`decision`: packed or not, and which layout) goes into the stage's resume points
(:class:`harness.training.loop.LoopState` ``packing``): a resumed stage trains the layout its first part trained,
without checking again on the partly trained model (which could decide otherwise and finish the stage on other
batches than the uninterrupted run).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from harness.core.store import Row
from harness.data.batches import collate
from harness.data.encoding import Encoded
from harness.data.packed_batches import ROW_WIDTH_FACTOR, examples_of, pack_encoded
from harness.data.stage_batches import StagePlan
from harness.models.packed_attention import UnsupportedAttention, can_replace
from harness.training.chunked_loss import Chunking
from harness.training.compiling import compile_decision
from harness.training.packing_check import CHECK_BATCHES, PackingError, check_packing
from harness.training.parallel import SingleProcess, loop_hooks

log = logging.getLogger(__name__)


def decision(packed: bool, varlen: bool = False, factor: int | None = None) -> dict[str, Any]:
    """The layout a stage trains on, as a resume point keeps it (JSON): padded, or packed with ``varlen`` rows
    (example by example) or rows ``factor`` × the longest example wide (None: one row)."""
    return {"packed": packed, "varlen": packed and varlen, "factor": factor if packed else None}


PADDED = decision(False)


def stage_layout(
    plan: StagePlan,
    model,
    tasks: list[str],
    pad_id: int,
    step: int,
    record: Callable[[list[Row], int], None] | None,
    stored: dict[str, Any] | None = None,
) -> tuple[list, dict[str, Any]]:
    """``(batches, decision)``: the batches stage ``plan`` trains on and the :func:`decision` behind them. ``stored``:
    a resume point's decision, which is used as it is (no check). Otherwise the check's rows go to ``record(rows,
    step)`` (the tracker's log; None: a resumed stage, whose rows were recorded when it began), the decision's
    warning to the log."""
    if stored is not None:
        if not stored["packed"]:
            return plan.batches, stored
        return [pack_encoded(ex, pad_id, stored["factor"], stored["varlen"]) for ex in plan.examples], stored
    return _decide(plan, model, tasks, pad_id, step, record) or (plan.batches, PADDED)


def stage_batches(
    plan: StagePlan, model, tasks: list[str], pad_id: int, step: int, record: Callable[[list[Row], int], None] | None
) -> list:
    """The batches of :func:`stage_layout` for a stage that begins (its decision made now)."""
    return stage_layout(plan, model, tasks, pad_id, step, record)[0]


def _decide(plan: StagePlan, model, tasks: list[str], pad_id: int, step: int, record) -> tuple[list, dict] | None:
    """``(packed batches, decision)`` when the check proved a packed layout exact on ``model`` on every rank; None:
    padded. Each rank checks its own slice (:func:`_rank_slices`), then the ranks agree (:func:`_agreed`)."""
    stage = plan.stage
    setting = stage.train.packing
    if setting is False or plan.has_images or not plan.examples:
        return None
    device = next(model.parameters()).device.type
    compiled = compile_decision(stage.train.compile, len(plan.batches), device)
    if setting == "auto" and compiled:
        # Compiled, packed steps ran far slower than eager ones on a CPU (docs/packing.md, "Not with torch.compile
        # (yet)"): the cause is not measured yet (recompiles on the rows' shapes?). Until it is solved, auto keeps
        # them padded.
        log.info("stage %r: compiled stages train on padded batches (train.packing: auto)", stage.name)
        return None
    # This rank's share of a batch (an fsdp stage's hooks shard batches as these do) and the verdicts' exchange.
    hooks = loop_hooks()
    # The loss path the stage trains with: chunked only in one process (harness.training.loop.batch_loss).
    chunking = Chunking.of(stage.train) if isinstance(hooks, SingleProcess) else Chunking(False)
    agreed, layout = None, (False, None)
    for varlen, factor in layouts(model, compiled):
        padded, packed = _rank_slices(plan, hooks, pad_id, factor, varlen)
        try:
            result = check_packing(
                model, padded, packed, stage.train.loss, tasks, stage.train.precision, chunking=chunking
            )
        except UnsupportedAttention as error:  # the model's attention asks for more than harness_varlen does
            log.info("stage %r: example-by-example attention unavailable (%s); trying masked rows", stage.name, error)
            result = None
        except Exception as error:
            with contextlib.suppress(Exception):  # tell the other ranks, so that none waits for this one
                hooks.all_gather(f"{type(error).__name__}: {error}")
            raise
        outcome = _agreed(hooks, result, stage.name)
        if outcome is not None:
            agreed, layout = outcome, (varlen, factor)
            if outcome[1].exact:
                break
    if agreed is None:  # no layout could be tried on every rank (or a replaced layouts list): nothing proven
        log.warning("stage %r: no packed layout could be checked; training on padded batches", stage.name)
        return None
    (where, result), (varlen, factor) = agreed, layout
    if record is not None:
        record(_rows(stage.name, step, result, varlen), step)
    if result.exact:
        return [pack_encoded(ex, pad_id, factor, varlen) for ex in plan.examples], decision(True, varlen, factor)
    if setting is True:
        raise PackingError(
            f"stage {stage.name!r}: train.packing: true, but {result.why()}{where}; set train.packing "
            "to auto (pads instead) or false"
        )
    log.warning("stage %r: %s%s; training on padded batches (train.packing: auto)", stage.name, result.why(), where)
    return None


def _rank_slices(plan: StagePlan, hooks, pad_id: int, factor: int | None, varlen: bool) -> tuple[list, list]:
    """``(padded, packed)`` for the check: of the first :data:`~harness.training.packing_check.CHECK_BATCHES` batches
    packed with ``(factor, varlen)``, this rank's slice as the loop will train it (``hooks.shard``: whole rows of
    the step's packed batch), and the same examples padded, in the same order. A rank holds its share of the
    activations during the check, not world size x it. In one process: the whole packed batch and the plan's
    padded batch (the same examples, collated alike)."""
    padded, packed = [], []
    for examples in plan.examples[:CHECK_BATCHES]:
        part = hooks.shard(pack_encoded(examples, pad_id, factor, varlen))
        own = [Encoded(task, ids, labels) for task, (ids, labels) in zip(part.tasks, examples_of(part))]
        padded.append(collate(own, pad_id))
        packed.append(part)
    return padded, packed


def _agreed(hooks, result, stage: str) -> tuple[str, Any] | None:
    """Every rank's check of one layout, exchanged (one object collective, which every rank calls as often as the
    others), and the one all ranks act on: ``(where, check)``, the check of the rank closest to failing — a
    failing one when any fails, so all ranks pad, or all stop with the same message — with ``where`` naming that
    rank when there are several. None when some rank could not try the layout. Another rank's error raises here."""
    results = hooks.all_gather(result)
    for rank, other in enumerate(results):
        if isinstance(other, str):  # that rank's check raised (out of memory, say): this rank stops as well
            raise RuntimeError(f"stage {stage!r}: the packing check failed on rank {rank}: {other}")
    if any(other is None for other in results):
        return None

    def closeness(item: tuple[int, Any]) -> tuple[bool, float]:
        diff, tolerance = item[1].max_rel_diff, item[1].tolerance
        return not item[1].exact, diff / tolerance if tolerance > 0 else (float("inf") if diff > 0 else 0.0)

    rank, check = max(enumerate(results), key=closeness)
    return (f" (on rank {rank}'s slice, of {len(results)} ranks)" if len(results) > 1 else ""), check


def layouts(model, compiled: bool = False) -> list[tuple[bool, int | None]]:
    """The packed layouts to try, best first, as ``(varlen, row factor)``: under sdpa or eager attention, one row
    attended example by example (:mod:`harness.models.packed_attention`: no padding, no mask; not in a compiled
    forward, whose graph would be traced through the per-step plan), then rows of
    :data:`~harness.data.packed_batches.ROW_WIDTH_FACTOR` × the longest example with transformers' block-diagonal mask
    (which costs rows × width²: docs/packing.md has the measurement); under flash attention one row (its varlen
    kernels cost nothing for the boundaries)."""
    implementation = str(getattr(getattr(model, "config", None), "_attn_implementation", "") or "")
    if implementation.startswith("flash"):
        return [(False, None)]
    return ([(True, None)] if can_replace(model) and not compiled else []) + [(False, ROW_WIDTH_FACTOR)]


def _rows(stage: str, step: int, result: Any, varlen: bool) -> list[Row]:
    return [
        Row(stage, step, None, "train", "packing_max_rel_diff", result.max_rel_diff),
        Row(stage, step, None, "train", "packing_tolerance", result.tolerance),
        Row(stage, step, None, "train", "packed", float(result.exact)),
        Row(stage, step, None, "train", "packing_varlen", float(result.exact and varlen)),
    ]
