"""The experiment file's ``world`` and ``model`` sections: the synthetic world behind the knowledge tasks and the
pretraining corpus, and the base model (a builtin tiny architecture, its tokenizer and optional pretraining, or any
Hugging Face causal LM)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from harness.config.strict import Strict


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

    builtin: str | None = Field(None, description="Builtin tiny architecture, e.g. qwen2-tiny (the default).")
    hf: str | None = Field(None, description="Hub id or local path of a causal LM with its tokenizer.")
    revision: str | None = None
    config: dict[str, Any] = Field(default_factory=dict, description="Overrides of the builtin config's fields.")
    text: str | None = Field(None, description="llava-tiny only: its text architecture (default qwen2-tiny).")
    vision: dict[str, Any] = Field(
        default_factory=dict,
        description="llava-tiny only: overrides of its SigLIP vision config (image_size, patch_size, …).",
    )
    tokenizer: TokenizerSpec = Field(default_factory=TokenizerSpec)
    pretrain: PretrainSpec | None = Field(None, description="Pretrain the builtin base on the world corpus.")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    trust_remote_code: bool = False

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if self.builtin and self.hf:
            raise ValueError("give either builtin or hf, not both")
        if not self.builtin and not self.hf:
            self.builtin = "qwen2-tiny"
        if self.hf and (self.config or self.pretrain):
            raise ValueError("config and pretrain apply to builtin models only")
        return self
