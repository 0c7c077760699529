"""The experiment file's ``train`` section and its parts (``optim``, ``trainable``, ``loss``, ``nonfinite``): the
defaults of every stage, each field overridable in a stage (:data:`harness.config.schema.StageSpec`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from harness.config.strict import Strict, omitted_unless_set


class OptimSpec(Strict):
    """AdamW with linear warmup then a cosine (or constant / linear) decay."""

    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = Field(1e-8, gt=0)
    warmup: int = Field(0, ge=0, description="Warmup steps.")
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Final lr as a fraction of lr.")
    grad_clip: float | None = Field(1.0, gt=0, description="Max global grad norm; null disables clipping.")


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
    target_modules: list[str] | None = Field(
        None,
        description="Modules that get adapters; default: q_proj, k_proj, v_proj, up_proj, down_proj "
        "(the seed's HiRA choice: attention q/k/v and two MLP projections).",
    )
    new_token_rows: Literal["auto"] | bool = Field(
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

    _omit_added = omitted_unless_set("reduction")


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
        "task's data, which can hold a task back badly; what it costs and saves: "
        "docs/experiment-file.md, Length grouping.",
    )
    checkpoint: bool = Field(True, description="Save a Hugging Face checkpoint at the end of the stage.")
    checkpoint_every: int | None = Field(
        None, ge=1, description="Also save a resumable checkpoint every N steps (model, optimiser, RNG, data position)."
    )
    keep_checkpoints: int = Field(2, ge=1, description="Periodic checkpoints kept (the newest).")
    nonfinite: NonFiniteSpec = Field(default_factory=NonFiniteSpec)
    diagnostics: bool = Field(True, description="Per-module-group grad norms and update ratios (diag/...).")
    compile: bool | Literal["auto"] = Field(
        "auto",
        description="torch.compile the model's training forward (dynamic shapes; fused norms/RoPE/SiLU): "
        "true | false | auto (the default: compile CPU stages of at least 1,000 steps when a "
        "C++ compiler is there, else eager — GPU stages too, unmeasured there; a failed "
        "compile falls back to eager with one warning line). What compiling gains and costs: "
        "docs/performance.md, Compiling.",
    )
    stage_cache: bool | Literal["read_only"] = Field(
        True,
        description="Keep the stage's outcome under $HARNESS_CACHE/stages and start from it when a later run "
        "shares every stage up to it (true); only read it (read_only); neither (false).",
    )
    packing: bool | Literal["auto"] = Field(
        "auto",
        description="Padding-free batches: each step's examples (the same ones) laid end to end, "
        "positions restarting per example, attention confined to each: example by example under "
        "sdpa/eager (harness/models/packed_attention.py), else rows with a block-diagonal mask "
        "(harness/data/packed_batches.py). Proven exact on the model at each stage's start against "
        "the same batches padded (train/packing_max_rel_diff): auto (the default) packs when "
        "exact, else pads with one warning line; true stops (exit 2) when not exact; false "
        "always pads. Image batches are never packed (auto pads them; true is refused). "
        "docs/packing.md.",
    )
    loss_chunking: bool | Literal["auto"] = Field(
        "auto",
        description="The loss a chunk of supervised rows at a time, never all [N, V] logits (one process, same loss "
        "up to summation order): auto (chunk when N·V exceeds one chunk) | true | false. docs/performance.md.",
    )
    loss_chunk_tokens: int | None = Field(
        None, ge=1, description="Supervised tokens per loss chunk (default: the rows whose fp32 logits take 256 MiB)."
    )

    _omit_added = omitted_unless_set("packing", "loss_chunking", "loss_chunk_tokens")
