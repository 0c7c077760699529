"""The experiment file: a pydantic schema (typos are errors), loading with ``yaml.safe_load``, ``--set``
overrides, cross-field checks, and error messages that name the YAML path (``stages[1].mixture.yesno``).

Validation happens in two passes, both collecting *every* error before reporting:

1. the schema (types, ranges, unknown keys) — pydantic;
2. the meaning (mixtures name known tasks, ``init`` points at an earlier stage, recipe params and names exist…),
   which needs the whole file and the registries.

A stage may override any field of ``train``; :meth:`Experiment.resolved_stages` merges the two.
"""

from __future__ import annotations

import copy
import math
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator, model_validator

from harness.registry import UnknownNameError, suggest

# ----------------------------------------------------------------------------------------------------------------
# Schema
# ----------------------------------------------------------------------------------------------------------------


class Strict(BaseModel):
    """Base for every section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class WorldSpec(Strict):
    """The synthetic world behind the knowledge tasks and the pretraining corpus."""

    people: int = Field(200, ge=1, description="Number of people in the world.")
    seed: int = Field(0, description="Seed of the world (independent of the experiment seed).")


class PretrainSpec(Strict):
    """Pretraining of the builtin base model on the built-in corpus; cached by a hash of everything that shapes it."""

    corpus: Literal["world"] = Field("world", description="Corpus to pretrain on.")
    steps: int = Field(300, ge=1)
    batch_size: int = Field(16, ge=1)
    seq_len: int = Field(128, ge=8, description="Tokens per packed pretraining sequence.")
    lr: float = Field(3e-3, gt=0)
    warmup: int = Field(10, ge=0)
    weight_decay: float = Field(0.0, ge=0)


class TokenizerSpec(Strict):
    """The byte-level BPE tokenizer trained for builtin models."""

    vocab_size: int = Field(2048, ge=300, description="Target vocabulary size, special tokens included.")
    min_frequency: int = Field(2, ge=1)


class ModelSpec(Strict):
    """The base model: a builtin tiny architecture (optionally pretrained here) or any HF causal LM."""

    builtin: Optional[str] = Field(None, description="Builtin tiny architecture, e.g. qwen2-tiny (the default).")
    hf: Optional[str] = Field(None, description="Hub id or local path of a causal LM with its tokenizer.")
    revision: Optional[str] = None
    config: dict[str, Any] = Field(default_factory=dict, description="Overrides of the builtin config's fields.")
    tokenizer: TokenizerSpec = Field(default_factory=TokenizerSpec)
    pretrain: Optional[PretrainSpec] = Field(None, description="Pretrain the builtin base on the world corpus.")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    trust_remote_code: bool = False

    @model_validator(mode="after")
    def _one_source(self) -> "ModelSpec":
        if self.builtin and self.hf:
            raise ValueError("give either builtin or hf, not both")
        if not self.builtin and not self.hf:
            self.builtin = "qwen2-tiny"
        if self.hf and (self.config or self.pretrain):
            raise ValueError("config and pretrain apply to builtin models only")
        return self


class TaskSpec(Strict):
    """One task: a recipe, pool sizes and the recipe's own params."""

    recipe: str = Field(..., description="Registered recipe name (repeat, yesno, math_reversed, jsonl, …).")
    train: int = Field(1000, ge=0, description="Training pool size.")
    eval: int = Field(32, ge=0, description="Items per evaluation split (heldout, heldout_template, train).")
    params: dict[str, Any] = Field(default_factory=dict, description="Recipe parameters.")
    seed: Optional[int] = Field(None, description="Data seed; default derived from the experiment seed.")


class OptimSpec(Strict):
    """AdamW with linear warmup then a cosine (or constant / linear) decay."""

    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0)
    warmup: int = Field(0, ge=0, description="Warmup steps.")
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final lr as a fraction of lr.")
    grad_clip: Optional[float] = Field(1.0, gt=0, description="Max global grad norm; null disables clipping.")


def _string_shorthand(field: str):
    """A before-validator reading ``key: value`` as ``key: {field: value}`` (``trainable: lora``, ``loss: gem``)."""

    def expand(cls, data: Any) -> Any:
        return {field: data} if isinstance(data, str) else data

    return model_validator(mode="before")(classmethod(expand))


class TrainableSpec(Strict):
    """What trains in a stage. ``trainable: full`` is short for ``trainable: {mode: full}``."""

    mode: Literal["full", "lora", "hira", "frozen"] = Field(
        "full", description="full | lora | hira (adapters through peft) | frozen (only new_token_rows / unfreeze)")
    r: int = Field(8, ge=1, description="Adapter rank (lora, hira).")
    alpha: float = Field(16.0, gt=0, description="Adapter scaling numerator (lora_alpha).")
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: Optional[list[str]] = Field(
        None, description="Modules that get adapters; default: q_proj, k_proj, v_proj, up_proj, down_proj "
                          "(the seed's HiRA choice: attention q/k/v and two MLP projections).")
    new_token_rows: bool = Field(False, description="Train the embedding / output rows of the tokens the harness "
                                                    "added (chat-role tokens; EOS / pad when new).")
    unfreeze: list[str] = Field(default_factory=list, description="Regexes of parameter names trained on top of "
                                                                  "the mode (e.g. lm_head, norm).")
    adapter: Literal["merge", "continue"] = Field(
        "merge", description="At the next stage: merge this stage's adapter into the weights, or keep training it.")

    _shorthand = _string_shorthand("mode")


class LossSpec(Strict):
    """The training loss. ``loss: gem`` is short for ``loss: {name: gem}``. Plain CE is always logged too."""

    name: Literal["ce", "gem"] = Field("ce", description="ce | gem (Li et al. 2024, entropic distribution matching)")
    beta: float = Field(0.7, gt=0, le=1, description="GEM beta.")
    h: Literal["linear", "logsigmoid"] = Field("linear", description="GEM's h function.")
    task_weights: dict[str, float] = Field(default_factory=dict, description="Per-task loss weights (default 1).")
    first_token_weight: float = Field(1.0, gt=0, description="Weight of each answer's first token.")

    _shorthand = _string_shorthand("name")


class NonFiniteSpec(Strict):
    """What to do when the loss or a gradient is NaN/Inf. ``nonfinite: skip_step`` is short for the action."""

    action: Literal["stop", "skip_step", "off"] = Field(
        "stop", description="stop (exit 3 with a report naming the module) | skip_step | off (no check)")
    max_consecutive: int = Field(5, ge=1, description="skip_step: stop after this many skipped steps in a row.")

    _shorthand = _string_shorthand("action")


class TrainSpec(Strict):
    """Training settings; the defaults for every stage, each overridable in a stage."""

    trainable: TrainableSpec = Field(default_factory=TrainableSpec)
    loss: LossSpec = Field(default_factory=LossSpec)
    precision: Literal["fp32", "bf16-autocast"] = Field(
        "fp32", description="bf16-autocast keeps fp32 master weights and optimiser state.")

    batch_size: int = Field(16, ge=1, description="Examples per optimiser step.")
    max_length: int = Field(256, ge=8, description="Longer examples are dropped (counted per task).")
    optim: OptimSpec = Field(default_factory=OptimSpec)
    log_every: int = Field(10, ge=1, description="Steps per training-metrics window.")
    length_grouping: int = Field(
        50, ge=1, description="Batches drawn together and sorted by length, so batches pad little (1 = off; 50 is "
                              "the window of transformers' group_by_length sampler)."
    )
    checkpoint: bool = Field(True, description="Save a Hugging Face checkpoint at the end of the stage.")
    checkpoint_every: Optional[int] = Field(None, ge=1, description="Also save a resumable checkpoint every N "
                                                                     "steps (model, optimiser, RNG, data position).")
    keep_checkpoints: int = Field(2, ge=1, description="Periodic checkpoints kept (the newest).")
    nonfinite: NonFiniteSpec = Field(default_factory=NonFiniteSpec)
    diagnostics: bool = Field(True, description="Per-module-group grad norms and update ratios (diag/...).")
    compile: bool = Field(False, description="torch.compile the model's forward for training (dynamic shapes): "
                                             "fused norms/RoPE/SiLU, 20-30 % faster steps on the tiny CPU model, "
                                             "after a one-off compile of 10-30 s; pays off on long stages.")


def _partial(model: type[BaseModel], name: str) -> dict[str, Any]:
    """Field definitions of ``model`` with every field optional (default None), nested models made partial too."""
    fields: dict[str, Any] = {}
    for field_name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            annotation = create_model(f"{name}{annotation.__name__}", __base__=annotation, **_partial(annotation, name))
        info = copy.copy(info)
        info.default, info.default_factory = None, None
        fields[field_name] = (Optional[annotation], info)
    return fields


_MIXTURE_SCHEMA = {
    "anyOf": [
        {"const": "natural", "description": "Concatenate the pools of all tasks and shuffle."},
        {"type": "object", "additionalProperties": {"type": "number", "minimum": 0},
         "description": "Shorthand for weights: {task: weight}."},
        {"type": "object", "properties": {
            "weights": {"type": "object", "additionalProperties": {"type": "number", "minimum": 0}},
            "natural": {"type": "array", "items": {"type": "string"}},
            "counts": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
            "replace": {"type": "boolean"},
        }, "additionalProperties": False},
    ]
}


class _StageCore(Strict):
    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$", description="Stage name (used in paths and metrics).")
    steps: Optional[int] = Field(None, ge=1, description="Optimiser steps (derived from counts if omitted).")
    init: str = Field("previous", description="previous | base | the name of an earlier stage.")
    mixture: Any = Field(..., description="weights {task: w} | natural | {natural: [tasks]} | {counts: {task: n}}",
                         json_schema_extra=_MIXTURE_SCHEMA)


StageSpec = create_model("StageSpec", __base__=_StageCore, **_partial(TrainSpec, "Stage"))
StageSpec.__doc__ = "One curriculum stage: its mixture, length, init, and any train field overridden."

EVAL_SPLITS = ("heldout", "heldout_template", "train")


class EvalSpec(Strict):
    """Evaluation cadence, splits, evaluators and probes."""

    every: int = Field(50, ge=1, description="Evaluate every N steps (and at both edges of every stage).")
    splits: list[Literal["heldout", "heldout_template", "train"]] = Field(
        default_factory=lambda: ["heldout", "heldout_template"])
    evaluators: list[str] = Field(default_factory=lambda: ["greedy", "mode_ok", "teacher_forced"])
    probes: list[str] = Field(default_factory=lambda: ["first_token"])
    max_new_tokens: int = Field(32, ge=1)
    batch_size: int = Field(64, ge=1)
    hijack_words: list[str] = Field(default_factory=lambda: ["yes", "no"])
    seesaw_delta: float = Field(0.15, gt=0, le=1)
    samples: int = Field(4, ge=0, description="Samples per task and split in each wandb samples table.")


class WandbSpec(Strict):
    mode: Literal["offline", "online", "disabled"] = "offline"
    project: str = "harness"
    entity: Optional[str] = None
    group: Optional[str] = None
    tags: list[str] = Field(default_factory=list)


class TrackingSpec(Strict):
    wandb: WandbSpec = Field(default_factory=WandbSpec)
    console: bool = Field(True, description="Progress bars and tables on the console.")


class DataSpec(Strict):
    """How bad training data is handled."""

    too_long: Literal["drop", "error"] = Field(
        "drop", description="Examples longer than train.max_length: drop them (counted per task) or stop.")


class InjectSpec(Strict):
    step: int = Field(..., ge=1, description="Global step at which to inject.")
    repeat: int = Field(1, ge=1, description="Inject at this many consecutive steps.")
    where: Literal["forward", "grad"] = "forward"
    module: str = Field(..., description="Regex over module names (forward) or parameter names (grad).")


class DebugSpec(Strict):
    """Switches for seeing the safety nets work."""

    inject_nonfinite: Optional[InjectSpec] = Field(None, description="Make an output / gradient NaN at a step.")


class Experiment(Strict):
    """A declarative multi-stage SFT experiment."""

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$")
    seed: int = 0
    world: WorldSpec = Field(default_factory=WorldSpec)
    model: ModelSpec = Field(default_factory=ModelSpec)
    tasks: dict[str, TaskSpec] = Field(..., min_length=1)
    train: TrainSpec = Field(default_factory=TrainSpec)
    eval: EvalSpec = Field(default_factory=EvalSpec)
    stages: list[StageSpec] = Field(..., min_length=1)  # type: ignore[valid-type]
    tracking: TrackingSpec = Field(default_factory=TrackingSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    debug: DebugSpec = Field(default_factory=DebugSpec)

    @field_validator("tasks")
    @classmethod
    def _task_names(cls, tasks: dict[str, TaskSpec]) -> dict[str, TaskSpec]:
        for name in tasks:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
                raise ValueError(f"task name {name!r} may only use letters, digits, _ . -")
        return tasks

    def resolved_stages(self) -> list["ResolvedStage"]:
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
        data["stages"] = [
            {"name": s.name, "steps": s.steps, "init": s.init, "mixture": s.mixture.to_yaml(),
             **s.train.model_dump(mode="json")}
            for s in self.resolved_stages()
        ]
        return data


# ----------------------------------------------------------------------------------------------------------------
# Mixtures
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mixture:
    """A parsed stage mixture. ``kind`` is one of:

    - ``weights``: each example drawn picks task t with probability w_t / Σw (0 allowed);
    - ``natural``: the listed tasks' pools are concatenated and shuffled, so a task's share is its pool size;
    - ``counts``: exactly n_t examples of task t in the stage, drawn without replacement unless ``replace``.
    """

    kind: Literal["weights", "natural", "counts"]
    weights: dict[str, float]
    counts: dict[str, int]
    replace: bool = False

    @property
    def tasks(self) -> list[str]:
        """Tasks that can appear in this stage."""
        if self.kind == "weights":
            return [t for t, w in self.weights.items() if w > 0]
        if self.kind == "counts":
            return [t for t, n in self.counts.items() if n > 0]
        return list(self.weights)

    def to_yaml(self) -> Any:
        if self.kind == "weights":
            return {"weights": dict(self.weights)}
        if self.kind == "natural":
            return {"natural": list(self.weights)}
        return {"counts": dict(self.counts), "replace": self.replace}


def parse_mixture(raw: Any, path: str, tasks: list[str], errors: list[tuple[str, str]]) -> Mixture | None:
    """Parse a stage's ``mixture`` value, appending ``(yaml_path, message)`` to ``errors``; None if invalid."""
    n_before = len(errors)

    def err(where: str, message: str) -> None:
        errors.append((where, message))

    def check_tasks(names: Any, where: str) -> None:
        for name in names:
            if name not in tasks:
                err(f"{where}.{name}", f"unknown task {name!r}{suggest(str(name), tasks)}; tasks: {', '.join(tasks)}")

    if raw == "natural":
        return Mixture("natural", {t: 1.0 for t in tasks}, {})
    if isinstance(raw, str):
        return err(path, f"unknown mixture {raw!r}{suggest(raw, ['natural'])}; use natural, {{task: weight}}, "
                         "{natural: [tasks]} or {counts: {task: n}}")
    if not isinstance(raw, dict) or not raw:
        return err(path, "mixture is empty; give {task: weight}, natural, {natural: [tasks]} or {counts: {task: n}}")

    keywords = {"weights", "natural", "counts", "replace"}
    if set(raw) & keywords:
        unknown = set(raw) - keywords
        for key in sorted(unknown):
            err(f"{path}.{key}", f"unknown mixture key {key!r}{suggest(key, sorted(keywords))}")
        kinds = [k for k in ("weights", "natural", "counts") if k in raw]
        if len(kinds) != 1:
            return err(path, "give exactly one of weights, natural, counts")
        kind, where = kinds[0], f"{path}.{kinds[0]}"
        if "replace" in raw and kind != "counts":
            err(f"{path}.replace", "replace applies to counts only")
        if kind == "natural":
            names = raw["natural"]
            if not isinstance(names, list) or not names:
                return err(where, "natural needs a non-empty list of task names")
            check_tasks(names, where)
            return None if len(errors) > n_before else Mixture("natural", {t: 1.0 for t in names}, {})
        values = raw[kind]
        if not isinstance(values, dict) or not values:
            return err(where, f"{kind} needs a non-empty mapping of task to number")
    else:
        kind, where, values = "weights", path, raw

    check_tasks(values, where)
    parsed: dict[str, float] = {}
    for name, value in values.items():
        if kind == "counts":
            if isinstance(value, bool) or not isinstance(value, int):
                err(f"{where}.{name}", f"count must be a whole number, got {value!r}")
            elif value < 0:
                err(f"{where}.{name}", "count must be >= 0")
            else:
                parsed[name] = value
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            err(f"{where}.{name}", f"weight must be a finite number, got {value!r}")
        elif value < 0:
            err(f"{where}.{name}", "weight must be >= 0")
        else:
            parsed[name] = float(value)
    if len(errors) > n_before:
        return None
    if not any(v > 0 for v in parsed.values()):
        return err(where, f"every {'count' if kind == 'counts' else 'weight'} is zero: the stage would have no data")
    if kind == "counts":
        replace = raw.get("replace", False)
        if not isinstance(replace, bool):
            return err(f"{path}.replace", "replace must be true or false")
        return Mixture("counts", {t: 1.0 for t in parsed}, {t: int(v) for t, v in parsed.items()}, replace)
    return Mixture("weights", parsed, {})


@dataclass(frozen=True)
class ResolvedStage:
    name: str
    steps: int
    init: str  # "base" | "previous" | a stage name
    mixture: Mixture
    train: TrainSpec


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {k: _drop_none(v) if isinstance(v, dict) else v for k, v in data.items() if v is not None}


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


# ----------------------------------------------------------------------------------------------------------------
# Loading and errors
# ----------------------------------------------------------------------------------------------------------------


class ConfigError(Exception):
    """An invalid experiment file; ``errors`` holds ``(yaml_path, message)`` pairs, ``str()`` the report."""

    def __init__(self, source: str, errors: list[tuple[str, str]]):
        self.source, self.errors = source, errors
        lines = [f"{source}: {len(errors)} error{'s' if len(errors) != 1 else ''}"]
        lines += [f"  {path}: {message}" if path else f"  {message}" for path, message in errors]
        super().__init__("\n".join(lines))


def format_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """``('stages', 1, 'mixture', 'yesno')`` → ``stages[1].mixture.yesno``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class that the YAML location ``loc`` points into (for near-miss key suggestions)."""
    current: Any = Experiment
    for part in loc:
        while True:  # unwrap Optional / list / dict to reach a model
            origin = typing.get_origin(current)
            if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
                models = [a for a in typing.get_args(current) if a is not type(None)]
                current = models[0] if len(models) == 1 else current
                if len(models) != 1:
                    return None
                continue
            break
        if isinstance(current, type) and issubclass(current, BaseModel):
            if not isinstance(part, str) or part not in current.model_fields:
                return None
            current = current.model_fields[part].annotation
        elif typing.get_origin(current) in (list, dict):
            current = typing.get_args(current)[-1]
        else:
            return None
    while typing.get_origin(current) is typing.Union:
        current = [a for a in typing.get_args(current) if a is not type(None)][0]
    if typing.get_origin(current) in (list, dict):
        return None
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _pydantic_errors(exc: ValidationError) -> list[tuple[str, str]]:
    out = []
    for e in exc.errors():
        loc = tuple(e["loc"])
        if e["type"] == "extra_forbidden":
            parent = _model_at(loc[:-1])
            known = list(parent.model_fields) if parent else []
            key = str(loc[-1])
            hint = suggest(key, known) if known else ""
            out.append((format_path(loc), f"unknown key {key!r}{hint}" + (f"; allowed: {', '.join(known)}" if known and not hint else "")))
        elif e["type"] == "missing":
            out.append((format_path(loc), "required field is missing"))
        else:
            message = e["msg"]
            if message.startswith("Value error, "):
                message = message[len("Value error, "):]
            out.append((format_path(loc), message))
    return out


def _semantic_errors(exp: Experiment, raw: dict[str, Any]) -> list[tuple[str, str]]:
    """Checks that need the whole file and the registries. Imports are local: validation stays light."""
    from data_recipes import get_recipe

    from harness.models import check_model_spec

    errors: list[tuple[str, str]] = []
    task_names = list(exp.tasks)

    for name, task in exp.tasks.items():
        try:
            recipe = get_recipe(task.recipe)
        except UnknownNameError as e:
            errors.append((f"tasks.{name}.recipe", str(e)))
            continue
        try:
            recipe.Params.model_validate(task.params)
        except ValidationError as e:
            errors += [(f"tasks.{name}.params" + ("." + p if p else ""), m) for p, m in _pydantic_errors(e)]

    errors += check_model_spec(exp.model)

    from harness.evaluation import EVALUATORS, PROBES

    for field, registry in (("evaluators", EVALUATORS), ("probes", PROBES)):
        for i, name in enumerate(getattr(exp.eval, field)):
            if name not in registry:
                errors.append((f"eval.{field}[{i}]", str(UnknownNameError(registry.kind, name, registry.names()))))

    loss_specs = [("train.loss", exp.train.loss)] + [
        (f"stages[{i}].loss", stage.loss) for i, stage in enumerate(exp.stages) if stage.loss is not None]
    for where, loss in loss_specs:
        for name in loss.task_weights or {}:
            if name not in task_names:
                errors.append((f"{where}.task_weights.{name}", f"unknown task {name!r}{suggest(name, task_names)}"))

    seen: list[str] = []
    for i, stage in enumerate(exp.stages):
        path = f"stages[{i}]"
        if stage.name in seen:
            errors.append((f"{path}.name", f"duplicate stage name {stage.name!r}"))
        if stage.init not in ("previous", "base") and stage.init not in seen:
            later = [s.name for s in exp.stages[i:]]
            if stage.init in later:
                errors.append((f"{path}.init", f"stage {stage.init!r} does not come before {stage.name!r}; init can "
                                               "only name an earlier stage"))
            else:
                errors.append((f"{path}.init", f"unknown stage {stage.init!r}"
                                               f"{suggest(stage.init, seen + ['previous', 'base'])}; use previous, "
                                               f"base or an earlier stage ({', '.join(seen) or 'none yet'})"))
        seen.append(stage.name)

        mixture = parse_mixture(stage.mixture, f"{path}.mixture", task_names, errors)
        if mixture is None:
            continue
        if mixture.kind == "counts":
            if stage.steps is not None:
                errors.append((f"{path}.steps", "steps is derived from counts (Σ counts / batch_size); remove it"))
            if not mixture.replace:
                for task, n in mixture.counts.items():
                    if n > exp.tasks[task].train:
                        errors.append((f"{path}.mixture.counts.{task}",
                                       f"{n} examples without replacement, but the pool has {exp.tasks[task].train}; "
                                       "lower the count, raise tasks." f"{task}.train, or set replace: true"))
        elif stage.steps is None:
            errors.append((f"{path}.steps", "required field is missing"))
        for task in mixture.tasks:
            if exp.tasks[task].train == 0:
                errors.append((f"{path}.mixture", f"task {task!r} has an empty training pool (tasks.{task}.train: 0)"))
    return errors


class _Loader(yaml.SafeLoader):
    """``yaml.safe_load`` that also reads ``1e-4`` as a float (YAML 1.1 wants ``1.0e-4``; people write both)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+|\.[0-9_]+"
               r"(?:[eE][-+]?[0-9]+)?|\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."),
)


def safe_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 — a SafeLoader subclass


def _set_path(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``a.b[2].c`` (or ``a.b.2.c``) in nested dicts/lists, creating dicts on the way."""
    parts: list[Any] = []
    for token in re.findall(r"[^.\[\]]+", dotted):
        parts.append(int(token) if token.isdigit() else token)
    if not parts:
        raise ValueError(f"empty --set path in {dotted!r}")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(node, list):
            if not isinstance(part, int) or part >= len(node):
                raise ValueError(f"--set {dotted}: index {part!r} out of range at {format_path(parts[:i + 1])}")
            node = node[part]
        else:
            if part not in node or not isinstance(node[part], (dict, list)):
                node[part] = [] if isinstance(nxt, int) else {}
            node = node[part]
    last = parts[-1]
    if isinstance(node, list):
        if not isinstance(last, int) or last >= len(node):
            raise ValueError(f"--set {dotted}: index {last!r} out of range")
    node[last] = value


def apply_overrides(raw: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """Apply ``key.path=value`` strings; values are parsed as YAML (``3``, ``1e-3``, ``[a, b]``, ``{x: 1}``)."""
    data = copy.deepcopy(raw)
    for item in overrides or []:
        if "=" not in item:
            raise ValueError(f"--set expects key.path=value, got {item!r}")
        key, text = item.split("=", 1)
        _set_path(data, key.strip(), safe_load(text))
    return data


def load_raw(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with ``safe_load``; errors name the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), [("", "file not found")])
    try:
        data = safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(str(path), [("", f"{where}invalid YAML ({getattr(e, 'problem', None) or e})")]) from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), [("", "the file must hold a mapping of sections (name, tasks, stages, …)")])
    return data


def validate_data(data: dict[str, Any], source: str = "<experiment>") -> Experiment:
    """Validate a raw mapping; raises :class:`ConfigError` with every error found."""
    try:
        exp = Experiment.model_validate(data)
    except ValidationError as e:
        raise ConfigError(source, _pydantic_errors(e)) from None
    errors = _semantic_errors(exp, data)
    if errors:
        raise ConfigError(source, errors)
    return exp


def load_experiment(path: str | Path, overrides: list[str] | None = None) -> Experiment:
    """Load, override and validate an experiment file."""
    raw = load_raw(path)
    try:
        raw = apply_overrides(raw, overrides)
    except ValueError as e:
        raise ConfigError(str(path), [("", str(e))]) from None
    return validate_data(raw, str(path))


def dump_yaml(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
