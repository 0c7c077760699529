"""A stage's plan, made before any training: its batches — a list drawn from the mixture and length-grouped, or for an
adaptive mixture an :class:`~harness.data.steering.stream.AdaptiveStream` that draws them as the stage trains — and its
effective composition (examples, tokens and too-long drops per task). The packed/padded choice is made at the stage's
start (:mod:`harness.runs.execution.packing_decision`); a plan that cannot be trained as asked is a :class:`DataError`.
What a stage's batches read of the experiment besides the stage comes as a :class:`Batching`
(:func:`harness.runs.planning.prepare.stage_batching` takes it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.config import ResolvedStage
from harness.data.batches import length_grouped_batches
from harness.data.images import stage_collator
from harness.data.steering.stream import AdaptiveStream
from harness.data.stream import mixture_stream
from harness.data.task_data import DataError


@dataclass(frozen=True)
class Batching:
    """What a stage's batches read of the experiment besides the stage."""

    seed: int  # the run's seed: stage i draws its batches from numpy's default_rng([seed, i])
    too_long: str  # data.too_long: "drop" or "error"
    drop_images: bool  # debug.drop_images: image batches collated without their pixels


@dataclass
class StagePlan:
    """A stage's batches — a list, or for an adaptive mixture an :class:`~harness.data.steering.stream.AdaptiveStream`
    that draws them as the stage trains — and its effective composition (an adaptive stream's fills as it draws)."""

    stage: ResolvedStage
    # list[Batch], padded (harness.runs.execution.packing_decision decides at the stage's start whether it trains them
    # packed), or
    # an AdaptiveStream (always padded: its batches are drawn as the stage trains)
    batches: Any
    composition: dict[str, dict[str, float]]
    examples: list = field(default_factory=list)  # per batch, its encoded examples in sampler order
    has_images: bool = False

    def recorded(self, rows: list) -> StagePlan:
        """This plan, an adaptive stage's composition read from its ``mix_*`` rows when the stage was not trained in
        this process (replayed from the stage cache, or finished before a resume point)."""
        if not isinstance(self.batches, list) and not any(c["examples"] for c in self.composition.values()):
            for r in rows:
                if r.stage == self.stage.name and r.metric.startswith("mix_") and r.task in self.composition:
                    self.composition[r.task][r.metric[len("mix_") :]] = r.value
        return self

    def token_batches(self) -> Any:
        """Batches holding every token the stage can train on (the special-token check reads them)."""
        if isinstance(self.batches, list):
            return self.batches
        pool = self.batches.pool_examples()
        return [self.batches.collate(pool[i : i + 256]) for i in range(0, len(pool), 256)]


def plan_stage(batching: Batching, stage: ResolvedStage, index: int, pools: dict[str, list], pad_id: int) -> StagePlan:
    """The stage's batches and its effective composition (examples and tokens per task, too-long drops)."""
    kept, dropped = {}, {}
    for task in stage.mixture.tasks:
        kept[task] = [e for e in pools[task] if e.length <= stage.train.max_length]
        dropped[task] = len(pools[task]) - len(kept[task])
        if dropped[task] and batching.too_long == "error":
            raise DataError(
                f"stage {stage.name!r}: {dropped[task]} examples of task {task!r} are longer than "
                f"max_length={stage.train.max_length} (data.too_long: error)"
            )
        if not kept[task]:
            raise DataError(
                f"stage {stage.name!r}: every example of task {task!r} is longer than "
                f"max_length={stage.train.max_length}; its pool is empty"
            )
    rng = np.random.default_rng([batching.seed, index])
    if stage.mixture.kind == "adaptive":
        return _adaptive_plan(batching, stage, kept, dropped, rng, pad_id)
    n = sum(stage.mixture.counts.values()) if stage.mixture.kind == "counts" else stage.steps * stage.train.batch_size
    draws = mixture_stream(stage.mixture, {t: len(p) for t, p in kept.items()}, n, rng)
    examples = [kept[t][i] for t, i in draws]
    grouped = length_grouped_batches(examples, stage.train.batch_size, stage.train.length_grouping, rng)
    composition: dict[str, dict[str, float]] = {}
    for e in examples:
        c = composition.setdefault(e.task, {"examples": 0, "tokens": 0, "supervised_tokens": 0})
        c["examples"] += 1
        c["tokens"] += e.length
        c["supervised_tokens"] += e.n_supervised
    for task, c in composition.items():
        c["share"] = c["examples"] / len(examples)
        c["dropped_too_long"] = dropped.get(task, 0)
    collate_batch, has_images = stage_collator(examples, pad_id, batching.drop_images)
    if has_images and stage.train.packing is True:
        raise DataError(
            f"stage {stage.name!r}: train.packing: true, but its batches hold images; packed batches "
            "are text-only (set train.packing to auto, which pads image batches, or false)"
        )
    return StagePlan(stage, [collate_batch(b) for b in grouped], composition, grouped, has_images=has_images)


def _adaptive_plan(
    batching: Batching,
    stage: ResolvedStage,
    kept: dict[str, list],
    dropped: dict[str, int],
    rng: np.random.Generator,
    pad_id: int,
) -> StagePlan:
    """An adaptive stage's plan: a stream that draws each step's batch from the controller's current weights."""
    collate_batch, _ = stage_collator([e for pool in kept.values() for e in pool], pad_id, batching.drop_images)

    if stage.train.packing is True:
        raise DataError(
            f"stage {stage.name!r}: train.packing: true, but an adaptive mixture draws its batches as the "
            "stage trains and they are padded (set train.packing to auto or false)"
        )
    spec = stage.mixture.adaptive
    stream = AdaptiveStream(
        spec, kept, stage.steps, stage.train.batch_size, rng, collate_batch, dropped, reference_losses(spec, stage.name)
    )
    return StagePlan(stage, stream, stream.composition)


def reference_losses(spec, stage: str) -> dict[str, float] | None:
    """DoReMi's per-task reference (``adaptive.reference``): None for ``start`` (the stage's first losses), the
    numbers given, or an earlier run's last training loss of each task (its ``metrics.parquet``)."""
    params = dict(spec.params)
    reference = params.get("reference", "start")
    if reference == "start":
        return None
    if isinstance(reference, tuple):
        return dict(reference)
    from harness.core.store import read_metrics

    where = f"stage {stage!r}: mixture.adaptive.reference {reference!r}"
    try:
        frame = read_metrics(reference)
    except OSError as e:
        raise DataError(f"{where}: cannot read the run's metrics ({e})") from None
    losses = {}
    for task in spec.tasks:
        rows = frame.filter((frame["metric"] == "loss") & (frame["split"] == "train") & (frame["task"] == task))
        if rows.is_empty():
            raise DataError(f"{where}: the run has no training loss of task {task!r}")
        losses[task] = float(rows.sort("step")["value"][-1])
    return losses
