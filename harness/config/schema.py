"""The experiment file's schema: pydantic models in which typos are errors (``extra="forbid"``), with defaults and
descriptions (``harness schema`` prints it as JSON Schema), and :meth:`Experiment.resolved_stages`, which merges
each stage's overrides over the ``train`` defaults.

This module checks types, ranges and unknown keys only; the checks that need the registries (recipes, models,
evaluators) or the whole file live in :mod:`harness.config.load`, so the schema imports no model code.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field, create_model, field_validator, model_serializer, model_validator

from harness.config.benchmark_spec import BenchmarkSpec
from harness.config.mixture import Mixture, parse_mixture
from harness.config.run_specs import DataSpec, DebugSpec, TrackingSpec
from harness.config.strict import Strict
from harness.core.names import check_safe_name


class WorldSpec(Strict):
    """The synthetic world behind the knowledge tasks and the pretraining corpus."""

    people: int = Field(200, ge=1, description="Number of people in the world.")
    seed: int = Field(0, description="Seed of the world (independent of the experiment seed).")
    docs_per_person: int = Field(
        4,
        ge=1,
        description="Pretraining documents per person, each in freshly drawn phrasings (1: one biography per person).",
    )
    permute: bool = Field(True, description="Shuffle the order of each document's facts (false: one fixed order).")


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
    text: Optional[str] = Field(None, description="llava-tiny only: its text architecture (default qwen2-tiny).")
    vision: dict[str, Any] = Field(
        default_factory=dict,
        description="llava-tiny only: overrides of its SigLIP vision config (image_size, patch_size, …).",
    )
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


def _omitted_unless_set(*fields: str):
    """A serializer leaving ``fields`` out of dumps unless the experiment set them (to a value other than null).

    For fields added after runs and stage-cache entries existed: finished runs (``changed_sections``) and cache keys
    made before a field still match the same experiment. Set — even to its default, as a stage putting ``reduction``
    back to ``token`` over the experiment's ``example`` does — a field is kept."""

    def omit(self, handler):
        data = handler(self)
        for name in fields:
            if name not in self.model_fields_set or getattr(self, name) is None:
                data.pop(name, None)
        return data

    return model_serializer(mode="wrap")(omit)


class TaskSpec(Strict):
    """One task: a recipe, pool sizes and the recipe's own params."""

    recipe: str = Field(..., description="Registered recipe name (repeat, yesno, math_reversed, jsonl, …).")
    train: int = Field(1000, ge=0, description="Training pool size.")
    eval: int = Field(32, ge=0, description="Items per evaluation split (heldout, heldout_template, train).")
    params: dict[str, Any] = Field(default_factory=dict, description="Recipe parameters.")
    seed: Optional[int] = Field(None, description="Data seed; default derived from the experiment seed.")
    system: Optional[str] = Field(
        None,
        min_length=1,
        description="A system turn put before every example of the task, in every split (a task "
        "instruction such as 'Answer yes or no.'); the recipe's own examples must not carry one.",
    )

    _omit_added = _omitted_unless_set("system")


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
        "full", description="full | lora | hira (adapters through peft) | frozen (only new_token_rows / unfreeze)"
    )
    r: int = Field(8, ge=1, description="Adapter rank (lora, hira).")
    alpha: float = Field(16.0, gt=0, description="Adapter scaling numerator (lora_alpha).")
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: Optional[list[str]] = Field(
        None,
        description="Modules that get adapters; default: q_proj, k_proj, v_proj, up_proj, down_proj "
        "(the seed's HiRA choice: attention q/k/v and two MLP projections).",
    )
    new_token_rows: Union[Literal["auto"], bool] = Field(
        "auto",
        description="Train the embedding / output rows of the tokens the harness added (chat-role tokens; "
        "EOS / pad when new): true | false | auto (default: in lora / hira / frozen stages, "
        "those rows and the rows of special tokens the under-trained check flags).",
    )
    unfreeze: list[str] = Field(
        default_factory=list,
        description="Regexes of parameter names trained on top of "
        "the mode (e.g. lm_head, norm), or an image-text "
        "part: vision_tower, projector, language_model.",
    )
    adapter: Literal["merge", "continue"] = Field(
        "merge", description="At the next stage: merge this stage's adapter into the weights, or keep training it."
    )

    _shorthand = _string_shorthand("mode")


class LossSpec(Strict):
    """The training loss. ``loss: gem`` is short for ``loss: {name: gem}``. Plain CE is always logged too."""

    name: Literal["ce", "gem"] = Field("ce", description="ce | gem (Li et al. 2024, entropic distribution matching)")
    beta: float = Field(0.7, gt=0, le=1, description="GEM beta.")
    h: Literal["linear", "logsigmoid"] = Field("linear", description="GEM's h function.")
    task_weights: dict[str, float] = Field(default_factory=dict, description="Per-task loss weights (default 1).")
    first_token_weight: float = Field(1.0, gt=0, description="Weight of each answer's first token.")
    reduction: Literal["token", "example"] = Field(
        "token",
        description="token: every supervised token weighs the same, so a 15-token answer outweighs a 1-token "
        "one 15 to 1 (Hugging Face Trainer's mean) | example: each example's supervised tokens "
        "share one unit of weight, so every example counts the same whatever its answer's length.",
    )

    _shorthand = _string_shorthand("name")

    _omit_added = _omitted_unless_set("reduction")


class NonFiniteSpec(Strict):
    """What to do when the loss or a gradient is NaN/Inf. ``nonfinite: skip_step`` is short for the action."""

    action: Literal["stop", "skip_step", "off"] = Field(
        "stop", description="stop (exit 3 with a report naming the module) | skip_step | off (no check)"
    )
    max_consecutive: int = Field(5, ge=1, description="skip_step: stop after this many skipped steps in a row.")

    _shorthand = _string_shorthand("action")


class TrainSpec(Strict):
    """Training settings; the defaults for every stage, each overridable in a stage."""

    trainable: TrainableSpec = Field(default_factory=TrainableSpec)
    loss: LossSpec = Field(default_factory=LossSpec)
    precision: Literal["fp32", "bf16-autocast"] = Field(
        "fp32", description="bf16-autocast keeps fp32 master weights and optimiser state."
    )

    batch_size: int = Field(16, ge=1, description="Examples per optimiser step.")
    parallel: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="With several ranks (--nproc / torchrun): ddp (DistributedDataParallel: every rank holds "
        "the whole model and optimiser state) | fsdp (FSDP2 fully_shard per transformer block: the "
        "trained weights, gradients and optimiser state sharded over ranks, one full copy kept "
        "for evaluation; harness/training/parallel/fsdp.py). Ignored in one process.",
    )
    max_length: int = Field(256, ge=8, description="Longer examples are dropped (counted per task).")
    optim: OptimSpec = Field(default_factory=OptimSpec)
    log_every: int = Field(10, ge=1, description="Steps per training-metrics window.")
    length_grouping: int = Field(
        1,
        ge=1,
        description="Windows of this many batches are grouped by length, stratified by task, so batches "
        "pad little (1 = off, the default; 50 is the window of transformers' group_by_length "
        "sampler). Off by default because grouped batches each hold one length class of a "
        "task's data: reversed 3-digit addition reaches 0.002 held-out at step 540 with 50, "
        "0.874 with 1 (bench/plain_vs_harness.py); grouping cuts the quickstart's pad fraction "
        "from ~0.30 to ~0.015.",
    )
    checkpoint: bool = Field(True, description="Save a Hugging Face checkpoint at the end of the stage.")
    checkpoint_every: Optional[int] = Field(
        None, ge=1, description="Also save a resumable checkpoint every N steps (model, optimiser, RNG, data position)."
    )
    keep_checkpoints: int = Field(2, ge=1, description="Periodic checkpoints kept (the newest).")
    nonfinite: NonFiniteSpec = Field(default_factory=NonFiniteSpec)
    diagnostics: bool = Field(True, description="Per-module-group grad norms and update ratios (diag/...).")
    compile: Union[bool, Literal["auto"]] = Field(
        "auto",
        description="torch.compile the model's training forward (dynamic shapes; fused norms/RoPE/SiLU): "
        "true | false | auto (the default: compile CPU stages of at least 1,000 steps when a "
        "C++ compiler is there, else eager — GPU stages too, unmeasured there; a failed "
        "compile falls back to eager with one warning line). On the tiny CPU model: 1.33-1.8x "
        "faster steps after a one-off 20-75 s compile (bench/compile_cost.py).",
    )
    stage_cache: Union[bool, Literal["read_only"]] = Field(
        True,
        description="Keep the stage's outcome under $HARNESS_CACHE/stages and start from it when a later run "
        "shares every stage up to it (true); only read it (read_only); neither (false).",
    )
    packing: Union[bool, Literal["auto"]] = Field(
        "auto",
        description="Padding-free batches: each step's examples (the same ones) laid end to end, "
        "positions restarting per example, attention confined to each: example by example under "
        "sdpa/eager (harness/models/packed_attention.py), else rows with a block-diagonal mask "
        "(harness/data/packing.py). Proven exact on the model at each stage's start against "
        "the same batches padded (train/packing_max_rel_diff): auto (the default) packs when "
        "exact, else pads with one warning line; true stops (exit 2) when not exact; false "
        "always pads. Image batches are never packed (auto pads them; true is refused). "
        "docs/packing.md.",
    )
    loss_chunking: Union[bool, Literal["auto"]] = Field(
        "auto",
        description="The loss a chunk of supervised rows at a time, never all [N, V] logits (one process, same loss "
        "up to summation order): auto (chunk when N·V exceeds one chunk) | true | false. docs/performance.md.",
    )
    loss_chunk_tokens: Optional[int] = Field(
        None, ge=1, description="Supervised tokens per loss chunk (default: the rows whose fp32 logits take 256 MiB)."
    )

    _omit_added = _omitted_unless_set("packing", "loss_chunking", "loss_chunk_tokens")


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
        fields[field_name] = (Optional[annotation], info)
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
    steps: Optional[int] = Field(None, ge=1, description="Optimiser steps (derived from counts if omitted).")
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
    max_new_tokens: Optional[int] = Field(
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
    benchmarks: Optional[list[BenchmarkSpec]] = Field(
        None, description="lm-evaluation-harness tasks run on the live model (see docs/benchmarks.md)."
    )
    reference_text: Optional[str] = Field(
        None,
        description="The forgetting probe's reference text: a UTF-8 file, one document per non-blank line (a "
        "relative path is relative to the experiment file); null: a held-out sample of the builtin world corpus.",
    )

    loss_items: Optional[int] = Field(
        None,
        ge=1,
        description="A loss pool: this many items per task and held-out split of eval.splits, from the recipe's "
        "held-out generation, evaluated teacher-forced only (eval_loss, gold_logprob) at the end of each stage, "
        "as split loss_<split>; null: none (see docs/evaluation.md).",
    )

    _omit_added = _omitted_unless_set("benchmarks", "reference_text", "loss_items")


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
    seeds: Optional[list[int]] = Field(
        None,
        min_length=1,
        description="Run one replicate per seed (model init and "
        "data order) under <run dir>/seed-<s>/; see `harness run --seeds`.",
    )
    data_seed: Optional[int] = Field(
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
    def _distinct_seeds(cls, seeds: Optional[list[int]]) -> Optional[list[int]]:
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
