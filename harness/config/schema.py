"""The experiment file's schema: pydantic models in which typos are errors (``extra="forbid"``), with defaults and
descriptions (``harness schema`` prints it as JSON Schema), and :meth:`Experiment.resolved_stages`, which merges
each stage's overrides over the ``train`` defaults.

The sections live by theme: ``world`` and ``model`` in :mod:`harness.config.model_specs`, ``train`` and its parts in
:mod:`harness.config.train_specs`, ``tracking`` / ``data`` / ``debug`` in :mod:`harness.config.run_specs`; this
module holds ``tasks``, ``stages``, ``eval`` and the :class:`Experiment` that joins them, and re-exports the rest.

This module checks types, ranges and unknown keys only; the checks that need the registries (recipes, models,
evaluators) or the whole file live in :mod:`harness.config.load`, so the schema imports no model code.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from typing import Any, Literal, Optional

from pydantic import BaseModel, Field, create_model, field_validator

from harness.config.benchmark_spec import BenchmarkSpec
from harness.config.mixture import Mixture, parse_mixture
from harness.config.model_specs import ModelSpec, PretrainSpec, TokenizerSpec, WorldSpec
from harness.config.run_specs import DataSpec, DebugSpec, TrackingSpec
from harness.config.strict import Strict, omitted_unless_set
from harness.config.train_specs import LossSpec, NonFiniteSpec, OptimSpec, TrainableSpec, TrainSpec
from harness.core.names import check_safe_name

__all__ = [
    "EVAL_SPLITS",
    "EvalSpec",
    "Experiment",
    "LossSpec",
    "ModelSpec",
    "NonFiniteSpec",
    "OptimSpec",
    "PretrainSpec",
    "ResolvedStage",
    "StageSpec",
    "TaskSpec",
    "TokenizerSpec",
    "TrainSpec",
    "TrainableSpec",
    "WorldSpec",
]


class TaskSpec(Strict):
    """One task: a recipe, pool sizes and the recipe's own params."""

    recipe: str = Field(..., description="Registered recipe name (repeat, yesno, math_reversed, jsonl, …).")
    train: int = Field(1000, ge=0, description="Training pool size.")
    eval: int = Field(32, ge=0, description="Items per evaluation split (heldout, heldout_template, train).")
    params: dict[str, Any] = Field(default_factory=dict, description="Recipe parameters.")
    seed: int | None = Field(None, description="Data seed; default derived from the experiment seed.")
    system: str | None = Field(
        None,
        min_length=1,
        description="A system turn put before every example of the task, in every split (a task "
        "instruction such as 'Answer yes or no.'); the recipe's own examples must not carry one.",
    )

    _omit_added = omitted_unless_set("system")


def _partial(model: type[BaseModel], name: str) -> dict[str, Any]:
    """Field definitions of ``model`` with every field optional (default None), nested models made partial too."""
    fields: dict[str, Any] = {}
    for field_name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            annotation = create_model(
                f"{name}{annotation.__name__}", __base__=annotation, __module__=__name__, **_partial(annotation, name)
            )
            # Published as a module attribute so pickle finds it by name: `harness repro --jobs` sends experiments
            # (a stage's optim / loss overrides are instances of these classes) to spawned processes.
            globals()[annotation.__name__] = annotation
        info = copy.copy(info)
        info.default, info.default_factory = None, None
        fields[field_name] = (Optional[annotation], info)  # noqa: UP045 — a runtime type built from a field: Optional[] takes any annotation
    return fields


_MIXTURE_SCHEMA = {
    "anyOf": [
        {"const": "natural", "description": "Concatenate the pools of all tasks and shuffle."},
        {
            "type": "object",
            "additionalProperties": {"type": "number", "minimum": 0},
            "description": "Shorthand for weights: {task: weight}.",
        },
        {
            "type": "object",
            "properties": {
                "weights": {"type": "object", "additionalProperties": {"type": "number", "minimum": 0}},
                "natural": {"type": "array", "items": {"type": "string"}},
                "counts": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
                "replace": {"type": "boolean"},
            },
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {
                "adaptive": {
                    "type": "object",
                    "required": ["method"],
                    "description": (
                        "Weights a controller moves as the stage trains: method odm | doremi | groupdro, … "
                        "(docs/steering.md)."
                    ),
                }
            },
            "required": ["adaptive"],
            "additionalProperties": False,
        },
    ]
}


class _StageCore(Strict):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$", description="Stage name (used in paths and metrics).")
    steps: int | None = Field(None, ge=1, description="Optimiser steps (derived from counts if omitted).")
    init: str = Field("previous", description="previous | base | the name of an earlier stage.")
    mixture: Any = Field(
        ...,
        description="weights {task: w} | natural | {natural: [tasks]} | {counts: {task: n}} | {adaptive: …}",
        json_schema_extra=_MIXTURE_SCHEMA,
    )

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        return check_safe_name(name, "stage name")  # "." would save its checkpoint over checkpoints/ itself


StageSpec = create_model("StageSpec", __base__=_StageCore, **_partial(TrainSpec, "Stage"))
StageSpec.__doc__ = "One curriculum stage: its mixture, length, init, and any train field overridden."

EVAL_SPLITS = ("heldout", "heldout_template", "train")


class EvalSpec(Strict):
    """Evaluation cadence, splits, evaluators and probes."""

    every: int = Field(50, ge=1, description="Evaluate every N steps (and at both edges of every stage).")
    splits: list[Literal["heldout", "heldout_template", "train"]] = Field(
        default_factory=lambda: ["heldout", "heldout_template"]
    )
    evaluators: list[str] = Field(default_factory=lambda: ["greedy", "mode_ok", "teacher_forced"])
    probes: list[str] = Field(default_factory=lambda: ["first_token"])
    max_new_tokens: int | None = Field(
        None,
        ge=1,
        description="Greedy decoding budget; null: the longest gold answer of the eval pools plus a margin "
        "(a value below that is an error naming the task).",
    )
    batch_size: int = Field(64, ge=1)
    hijack_words: list[str] = Field(default_factory=lambda: ["yes", "no"])
    seesaw_delta: float = Field(0.15, gt=0, le=1)
    seesaw_alpha: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="False-discovery rate of the paired seesaw test "
        "(Benjamini-Hochberg over every change tested in the run).",
    )
    seesaw_test: Literal["paired", "none"] = Field(
        "paired",
        description="paired: an event needs both changes significant on the fixed items (exact McNemar); "
        "none: the untested threshold rule (exploratory runs with pools too small for any test; its events are "
        "movements, not findings).",
    )
    samples: int = Field(4, ge=0, description="Samples per task and split in each wandb samples table.")
    benchmarks: list[BenchmarkSpec] | None = Field(
        None, description="lm-evaluation-harness tasks run on the live model (see docs/benchmarks.md)."
    )
    reference_text: str | None = Field(
        None,
        description="The forgetting probe's reference text: a UTF-8 file, one document per non-blank line (a "
        "relative path is relative to the experiment file); null: a held-out sample of the builtin world corpus.",
    )

    loss_items: int | None = Field(
        None,
        ge=1,
        description="A loss pool: this many items per task and held-out split of eval.splits, from the recipe's "
        "held-out generation, evaluated teacher-forced only (eval_loss, gold_logprob) at the end of each stage, "
        "as split loss_<split>; null: none (see docs/evaluation.md).",
    )

    _omit_added = omitted_unless_set("benchmarks", "reference_text", "loss_items")


class Experiment(Strict):
    """A declarative multi-stage SFT experiment."""

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$")
    plugins: list[str] = Field(
        default_factory=list,
        description="Plug-in modules imported before the experiment's names are checked: a dotted module name "
        "(my_lab.tasks, found on sys.path) or a .py file (a relative path is relative to this file's directory); "
        "see docs/extending.md.",
    )
    seed: int = 0
    seeds: list[int] | None = Field(
        None,
        min_length=1,
        description="Run one replicate per seed (model init and "
        "data order) under <run dir>/seed-<s>/; see `harness run --seeds`.",
    )
    data_seed: int | None = Field(
        None,
        description="Seed of the task data (default: seed). Replicates of a "
        "seeds group keep it fixed, so every seed is scored on the same items.",
    )
    world: WorldSpec = Field(default_factory=WorldSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)
    tasks: dict[str, TaskSpec] = Field(..., min_length=1)
    train: TrainSpec = Field(default_factory=TrainSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    stages: list[StageSpec] = Field(..., min_length=1)  # type: ignore[valid-type]
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    debug: DebugSpec = Field(default_factory=DebugSpec)

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int] | None) -> list[int] | None:
        repeated = sorted({s for s in seeds or [] if (seeds or []).count(s) > 1})
        if repeated:
            raise ValueError(f"seed(s) {', '.join(map(str, repeated))} given more than once")
        return seeds

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        return check_safe_name(name, "experiment name")  # ".." would put runs/<name>/ outside runs/

    @field_validator("tasks")
    @classmethod
    def _task_names(cls, tasks: dict[str, TaskSpec]) -> dict[str, TaskSpec]:
        for name in tasks:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                raise ValueError(f"task name {name!r} may only use letters, digits, _ . -")
            check_safe_name(name, "task name")
        return tasks

    def resolved_stages(self) -> list[ResolvedStage]:
        """Stages with their mixture parsed and ``train`` defaults merged under their overrides."""
        out = []
        base = self.train.model_dump()
        for i, stage in enumerate(self.stages):
            overrides = stage.model_dump(exclude_unset=True, exclude={"name", "steps", "init", "mixture"})
            train = TrainSpec.model_validate(_deep_merge(base, _drop_none(overrides)))
            mixture = parse_mixture(stage.mixture, f"stages[{i}].mixture", list(self.tasks), [])
            assert mixture is not None, "validated experiments have valid mixtures"
            steps = stage.steps or math.ceil(sum(mixture.counts.values()) / train.batch_size)
            init = stage.init
            if i == 0 and init == "previous":
                init = "base"
            out.append(ResolvedStage(stage.name, steps, init, mixture, train))
        return out

    def resolved_dict(self) -> dict[str, Any]:
        """The experiment with every default filled in and every stage fully resolved (re-loadable)."""
        data = self.model_dump(mode="json")
        if not data["plugins"]:  # left out when empty: an experiment without plug-ins resolves (and keys) as before
            del data["plugins"]
        data["stages"] = [
            {
                "name": s.name,
                "steps": s.steps,
                "init": s.init,
                "mixture": s.mixture.to_yaml(),
                **s.train.model_dump(mode="json"),
            }
            for s in self.resolved_stages()
        ]
        return data


@dataclass(frozen=True)
class ResolvedStage:
    """A stage as it runs: ``steps`` known (derived from counts when omitted), the mixture parsed, ``train`` merged
    over the experiment's defaults; the first stage's ``init: previous`` reads ``base``."""

    name: str
    steps: int
    init: str  # "base" | "previous" | a stage name
    mixture: Mixture
    train: TrainSpec


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the keys a stage left unset (None), at every depth."""
    return {k: _drop_none(v) if isinstance(v, dict) else v for k, v in data.items() if v is not None}


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``base`` with ``override`` merged in, mappings merged key by key."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out
