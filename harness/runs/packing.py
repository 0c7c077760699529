"""Which batches a stage trains on (``train.packing``), decided at the stage's start on the model it trains: the
plan's padded batches, or the same examples packed (:mod:`harness.data.packing`) once
:func:`harness.training.packing.check_packing` has shown them exact on that model.

Packed layouts are tried best first (:func:`layouts`): under sdpa or eager attention one row attended example by
example (:mod:`harness.models.packed_attention`), then rows with transformers' block-diagonal mask; under flash
attention one row. ``auto`` (the default) packs with the first layout proven exact and otherwise pads, with one
warning line naming the model type and what leaked; ``true`` stops with :class:`~harness.training.packing.PackingError`
(exit 2) instead; ``false`` pads without checking. Image batches are padded (``true`` is refused when the stage is
planned, before training), and so are stages that compile their forward under ``auto`` (packed compiled steps are
slow: docs/packing.md). The check's result is a store row at the stage's first step: ``train/packing_max_rel_diff``
(and the tolerance it was held to, ``train/packing_tolerance``; ``train/packed`` 1 or 0 says which batches trained,
``train/packing_varlen`` 1 when they attend example by example).

The decision (:func:`decision`: packed or not, and which layout) goes into the stage's resume points
(:class:`harness.training.loop.LoopState` ``packing``): a resumed stage trains the layout its first part trained,
without checking again on the partly trained model (which could decide otherwise and finish the stage on other
batches than the uninterrupted run).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from harness.core.store import Row
from harness.data.packing import ROW_WIDTH_FACTOR, pack_encoded
from harness.models.packed_attention import UnsupportedAttention, can_replace
from harness.runs.stage_plan import StagePlan
from harness.training.compiling import compile_decision
from harness.training.packing import PackingError, check_packing

log = logging.getLogger(__name__)


def decision(packed: bool, varlen: bool = False, factor: Optional[int] = None) -> dict[str, Any]:
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
    record: Optional[Callable[[list[Row], int], None]],
    stored: Optional[dict[str, Any]] = None,
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
    plan: StagePlan, model, tasks: list[str], pad_id: int, step: int, record: Optional[Callable[[list[Row], int], None]]
) -> list:
    """The batches of :func:`stage_layout` for a stage that begins (its decision made now)."""
    return stage_layout(plan, model, tasks, pad_id, step, record)[0]


def _decide(plan: StagePlan, model, tasks: list[str], pad_id: int, step: int, record) -> Optional[tuple[list, dict]]:
    """``(packed batches, decision)`` when the check proved a packed layout exact on ``model``; None: padded."""
    stage = plan.stage
    setting = stage.train.packing
    if setting is False or plan.has_images or not plan.examples:
        return None
    device = next(model.parameters()).device.type
    compiled = compile_decision(stage.train.compile, len(plan.batches), device)
    if setting == "auto" and compiled:
        # Compiled, packed steps ran ~100x slower on a CPU (bench/train_speed.py, harness-compile, 12 steps): the
        # cause is not measured yet (recompiles on the rows' shapes?). Until it is solved, auto keeps them padded.
        log.info("stage %r: compiled stages train on padded batches (train.packing: auto)", stage.name)
        return None
    result = None
    for varlen, factor in layouts(model, compiled):
        packed = [pack_encoded(examples, pad_id, factor, varlen) for examples in plan.examples]
        try:
            result = check_packing(model, plan.batches, packed, stage.train.loss, tasks, stage.train.precision)
        except UnsupportedAttention as error:  # the model's attention asks for more than harness_varlen does
            log.info("stage %r: example-by-example attention unavailable (%s); trying masked rows", stage.name, error)
            continue
        if result.exact:
            break
    if result is None:  # no layout could be tried (a replaced layouts list): nothing proven, so padded
        log.warning("stage %r: no packed layout could be checked; training on padded batches", stage.name)
        return None
    if record is not None:
        record(_rows(stage.name, step, result, varlen), step)
    if result.exact:
        return packed, decision(True, varlen, factor)
    if setting is True:
        raise PackingError(
            f"stage {stage.name!r}: train.packing: true, but {result.why()}; set train.packing "
            "to auto (pads instead) or false"
        )
    log.warning("stage %r: %s; training on padded batches (train.packing: auto)", stage.name, result.why())
    return None


def layouts(model, compiled: bool = False) -> list[tuple[bool, Optional[int]]]:
    """The packed layouts to try, best first, as ``(varlen, row factor)``: under sdpa or eager attention, one row
    attended example by example (:mod:`harness.models.packed_attention`: no padding, no mask; not in a compiled
    forward, whose graph would be traced through the per-step plan), then rows of
    :data:`~harness.data.packing.ROW_WIDTH_FACTOR` × the longest example with transformers' block-diagonal mask
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
