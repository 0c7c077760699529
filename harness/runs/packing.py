"""Which batches a stage trains on (``train.packing``), decided at the stage's start on the model it trains: the
plan's padded batches, or the same examples packed (:mod:`harness.data.packing`) once
:func:`harness.training.packing.check_packing` has shown them exact on that model.

``auto`` (the default) packs when exact and otherwise pads, with one warning line naming the model type and what
leaked; ``true`` stops with :class:`~harness.training.packing.PackingError` (exit 2) instead; ``false`` pads
without checking. Image batches are padded (``true`` is refused when the stage is planned, before training), and
so are stages that compile their forward under ``auto`` (packed compiled steps are slow: docs/packing.md).
The check's result is a store row at the stage's first step: ``train/packing_max_rel_diff`` (and the tolerance it
was held to, ``train/packing_tolerance``; ``train/packed`` 1 or 0 says which batches trained).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from harness.core.store import Row
from harness.data.packing import ROW_WIDTH_FACTOR, pack_encoded
from harness.runs.prepare import StagePlan
from harness.training.compiling import compile_decision
from harness.training.packing import PackingError, check_packing

log = logging.getLogger(__name__)


def stage_batches(plan: StagePlan, model, tasks: list[str], pad_id: int, step: int,
                  record: Optional[Callable[[list[Row], int], None]]) -> list:
    """The batches stage ``plan`` trains on; the check's rows go to ``record(rows, step)`` (the tracker's log;
    None: a resumed stage, whose rows were recorded when it began), the decision's warning to the log."""
    stage = plan.stage
    setting = stage.train.packing
    if setting is False or plan.has_images or not plan.examples:
        return plan.batches
    device = next(model.parameters()).device.type
    if setting == "auto" and compile_decision(stage.train.compile, len(plan.batches), device):
        # Compiled, packed steps ran ~100x slower on a CPU (bench/train_speed.py, harness-compile, 12 steps): the
        # cause is not measured yet (recompiles on the rows' shapes?). Until it is solved, auto keeps them padded.
        log.info("stage %r: compiled stages train on padded batches (train.packing: auto)", stage.name)
        return plan.batches
    packed = [pack_encoded(examples, pad_id, row_factor(model)) for examples in plan.examples]
    result = check_packing(model, plan.batches, packed, stage.train.loss, tasks, stage.train.precision)
    if record is not None:
        record(_rows(stage.name, step, result, result.exact), step)
    if result.exact:
        return packed
    if setting is True:
        raise PackingError(f"stage {stage.name!r}: train.packing: true, but {result.why()}; set train.packing "
                           "to auto (pads instead) or false")
    log.warning("stage %r: %s; training on padded batches (train.packing: auto)", stage.name, result.why())
    return plan.batches


def row_factor(model) -> Optional[int]:
    """One row under flash attention (its varlen kernels cost nothing for the boundaries); rows of
    :data:`~harness.data.packing.ROW_WIDTH_FACTOR` × the longest example under sdpa / eager, whose block-diagonal
    mask costs rows × width² (docs/packing.md has the measurement)."""
    implementation = str(getattr(getattr(model, "config", None), "_attn_implementation", "") or "")
    return None if implementation.startswith("flash") else ROW_WIDTH_FACTOR


def _rows(stage: str, step: int, result: Any, packed: bool) -> list[Row]:
    return [Row(stage, step, None, "train", "packing_max_rel_diff", result.max_rel_diff),
            Row(stage, step, None, "train", "packing_tolerance", result.tolerance),
            Row(stage, step, None, "train", "packed", float(packed))]
