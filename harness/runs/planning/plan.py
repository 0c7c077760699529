"""The plan of one run: everything a run computes before its first training step, compiled once from the experiment
by :func:`plan_run` and only read after that (:class:`RunPlan`).

Planning (this module and :mod:`harness.runs.planning`'s others) is the one part of a run, past opening its
directory, that reads the whole :class:`~harness.config.Experiment`: it takes each step's slice first and calls the
step once in the layer that does it (task data, encoding, batches and steering items in :mod:`harness.data`, the base
in :mod:`harness.runs.planning.prepare`). The plan keeps, for the executor (:mod:`harness.runs.execution.runner`),
only the slices execution needs — the evaluation settings, tracking, the debug switches — beside what it built.
Every data error surfaces here, as a :class:`~harness.data.task_data.DataError`, before any training.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.config import DebugSpec, EvalSpec, Experiment, ResolvedStage, TrackingSpec, task_seed
from harness.data.stage_batches import StagePlan, plan_stage
from harness.data.steering_items import steering_items
from harness.data.task_data import TaskData, task_data_hash
from harness.data.task_encoding import EncodedData, encode_tasks
from harness.evaluation.image_use import ImageEvalPlan
from harness.runs.planning.prepare import Base, build_base, build_task_data, encoding_settings, stage_batching
from harness.runs.planning.stage_key import base_key, stage_keys
from harness.runs.planning.steering_split import SteeringSplits, steering_draws


@dataclass(frozen=True)
class RunPlan:
    """One run, compiled: what it trains on, from which base, in which stages and batches, what it evaluates, under
    which stage-cache keys and where its results go. Frozen: the executor reads it and never reassigns a part (the
    base model's weights are the one thing training changes, in place)."""

    name: str  # the experiment's name
    seed: int
    tasks: tuple[str, ...]  # the experiment's task names, in the file's order (the per-task rows' order)
    resolved: dict[str, Any]  # the experiment as config.resolved.yaml writes it (wandb's config)
    stages: tuple[ResolvedStage, ...]
    data: TaskData  # every task's splits, the world corpus, the loss pool, the forgetting probe's reference text
    base: Base  # the base model, its tokenizer, the tokens the harness added, where it came from
    encoded: EncodedData  # the training pools encoded, the fixed eval items, what was dropped and why
    stage_plans: tuple[StagePlan, ...]  # each stage's batches and effective composition
    steering: SteeringSplits  # the held-out items of the stages steered by a held-out score
    stage_keys: tuple[str, ...]  # each stage's stage-cache key (harness.runs.planning.stage_key)
    eval: EvalSpec  # what is evaluated and how often, and the seesaw test (the experiment's eval section)
    images: ImageEvalPlan  # what the image tasks' evaluation takes of the experiment
    tracking: TrackingSpec  # where results go besides the store: wandb, the console
    debug: DebugSpec  # faults to inject, a rank to kill, images to drop

    @property
    def stage_steps(self) -> list[int]:
        """Each stage's number of training steps."""
        return [len(p.batches) for p in self.stage_plans]

    @property
    def undertrained_ids(self) -> list[int]:
        """The ids of the base's special-token rows flagged as under-trained (none when unchecked)."""
        return [t["id"] for t in self.base.undertrained or []]


def plan_run(exp: Experiment, console, on_progress: Callable[[], None] | None = None) -> RunPlan:
    """``exp`` compiled into its :class:`RunPlan`: task data (split-checked), the base model (pretrained or found in
    the cache; ``on_progress()`` after every pretraining step), the encoded pools and eval items (their notes said on
    ``console``), each stage's batches, the steering splits and the stage-cache keys."""
    stages, images = exp.resolved_stages(), image_eval_plan(exp)
    settings, batching, draws = encoding_settings(exp), stage_batching(exp), steering_draws(exp, stages)
    data = build_task_data(exp)
    base = build_base(exp, data, console, on_progress)
    encoded = encode_tasks(base.io, data, settings, base.max_positions)
    for note in encoded.notes():
        console.info(note)
    pad_id = base.tokenizer.pad_token_id
    plans = [plan_stage(batching, stage, i, encoded.train, pad_id) for i, stage in enumerate(stages)]
    items = {i: steering_items(base.tokenizer, data, draw, base.max_positions) for i, draw in draws.items()}
    steering = SteeringSplits(exp.eval, data.recipes, base.tokenizer, items)
    data_hash, base_identity = task_data_hash(data.splits, data.corpus), base_key(base.info, base.model)
    device = next(base.model.parameters()).device.type
    keys = stage_keys(exp, base_identity, data_hash, device)
    return RunPlan(
        name=exp.name,
        seed=exp.seed,
        tasks=tuple(exp.tasks),
        resolved=exp.resolved_dict(),
        stages=tuple(stages),
        data=data,
        base=base,
        encoded=encoded,
        stage_plans=tuple(plans),
        steering=steering,
        stage_keys=tuple(keys),
        eval=exp.eval,
        images=images,
        tracking=exp.tracking,
        debug=exp.debug,
    )


def image_eval_plan(exp: Experiment) -> ImageEvalPlan:
    """What the image tasks' evaluation takes of the experiment (evaluation takes no whole experiment)."""
    return ImageEvalPlan(
        splits=tuple(exp.eval.splits),
        seed=exp.seed,
        batch_size=exp.eval.batch_size,
        max_new_tokens=exp.eval.max_new_tokens,
        drop_images=exp.debug.drop_images,
        task_seeds={name: task_seed(exp, name) for name in exp.tasks},
        train_items={name: spec.eval for name, spec in exp.tasks.items()},
    )
