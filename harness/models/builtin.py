"""Builtin tiny architectures built from transformers configs (any HF causal LM loads through :mod:`harness.models.hf`).

Builtin models get the harness's own tokenizer (trained on the world corpus and the experiment's task data) and,
with ``model.pretrain``, are pretrained on the world corpus and cached (see :mod:`harness.runs.planning.pretrain`).
Their embedding has one row per token unless the config asks for more rows (``vocab_size``, as ``qwen2.5-0.5b`` does):
the rows past the tokenizer are never produced by it, like a released model's padded vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.core.registry import BUILTIN_MODELS
from harness.models.tokenizer import ENDOFTEXT, IM_END, IM_START, PAD

if TYPE_CHECKING:  # pragma: no cover
    from harness.config.schema import ModelSpec


@dataclass(frozen=True)
class BuiltinArch:
    """A builtin architecture: a transformers model type and the tiny defaults of its config."""

    model_type: str
    defaults: dict[str, Any]


# The registry lives in harness.core.registry (harness.config validates model.builtin through it); it names this
# module as its provider.

_TINY = dict(
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=4,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)
BUILTIN_MODELS.add("qwen2-tiny", BuiltinArch("qwen2", dict(_TINY, num_key_value_heads=2, rope_theta=10000.0)))
BUILTIN_MODELS.add("llama-tiny", BuiltinArch("llama", dict(_TINY, num_key_value_heads=2, rope_theta=10000.0)))
# GPT-2: learned positions, LayerNorm, GELU MLP (c_fc → c_proj), fused q/k/v (attn.c_attn), tied head. Its config
# names are n_embd / n_layer / n_head / n_positions / n_inner; the generic names (hidden_size, …) are accepted as
# overrides too. Dropout off, like the other builtins (and so that runs stay deterministic).
BUILTIN_MODELS.add(
    "gpt2-tiny",
    BuiltinArch(
        "gpt2",
        dict(
            n_embd=128,
            n_inner=512,
            n_layer=4,
            n_head=4,
            n_positions=512,
            tie_word_embeddings=True,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        ),
    ),
)
# Qwen3.5's text model (transformers' qwen3_5_text → Qwen3_5ForCausalLM): hybrid layers, every 4th full (gated)
# attention and the others Gated DeltaNet linear attention (linear_attn.in_proj_qkv / in_proj_z / in_proj_a / in_proj_b
# / conv1d / out_proj); partial RoPE. Without a layer_types override, a model with fewer than 4 layers gets its last
# layer as full attention (so both kinds are always present when num_hidden_layers >= 2). On CPU (and without the
# flash-linear-attention / causal-conv1d kernels) transformers runs the reference PyTorch implementation.
BUILTIN_MODELS.add(
    "qwen3_5-tiny",
    BuiltinArch(
        "qwen3_5_text",
        dict(
            hidden_size=128,
            intermediate_size=512,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            linear_conv_kernel_dim=4,
            max_position_embeddings=512,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        ),
    ),
)

# Qwen2.5-0.5B's shape (its released config.json) with random weights, for measuring memory and speed at a size users
# train: 24 layers (override num_hidden_layers for a short run), 14 heads of 64 over 2 KV heads, tied embeddings, and
# its padded vocabulary of 151,936 rows. The builtin tokenizer trained here is far smaller (the world corpus has no
# 151k merges), so the rows past it are never produced — as Qwen2.5's own 151,665-token tokenizer leaves 271 rows
# unused. Memory (embedding, head, AdamW state) and full-vocabulary ranks then cost what the released model's do.
QWEN2_5_0_5B_VOCAB = 151_936
BUILTIN_MODELS.add(
    "qwen2.5-0.5b",
    BuiltinArch(
        "qwen2",
        dict(
            vocab_size=QWEN2_5_0_5B_VOCAB,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            rope_theta=1_000_000.0,
            tie_word_embeddings=True,
        ),
    ),
)

FULL_ATTENTION_INTERVAL = 4  # qwen3_5-tiny: layer i is full attention when (i + 1) % 4 == 0 (Qwen3.5's own pattern)


def _config_class(model_type: str):
    from transformers import AutoConfig

    return type(AutoConfig.for_model(model_type))


def builtin_config(spec: ModelSpec, tokenizer) -> Any:
    """The transformers config of a builtin model, sized to ``tokenizer``: one embedding row per token, or the config's
    ``vocab_size`` rows where it asks for more (rows the tokenizer never produces); fewer is an error."""
    arch = BUILTIN_MODELS.get(spec.builtin)
    config_class = _config_class(arch.model_type)
    aliases = getattr(config_class, "attribute_map", {}) or {}
    # Overrides may use a generic alias (hidden_size for GPT-2's n_embd): it replaces the default it aliases.
    overrides = {aliases.get(k, k): v for k, v in spec.config.items()}
    fields = {**arch.defaults, **overrides}
    if arch.model_type == "qwen3_5_text" and "layer_types" not in fields:
        n = int(fields["num_hidden_layers"])
        interval = min(FULL_ATTENTION_INTERVAL, n)
        fields["layer_types"] = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    rows = int(fields.get("vocab_size") or 0)
    if rows and rows < len(tokenizer):
        raise ValueError(f"vocab_size {rows} is smaller than the tokenizer's {len(tokenizer)} tokens")
    fields.update(
        vocab_size=max(rows, len(tokenizer)),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,  # every builtin config has the field (GPT-2's default, 50256, would be out of range)
    )
    return config_class(**fields)


def builtin_added_token_ids(tokenizer) -> list[int]:
    """The rows that ``new_token_rows`` trains on a builtin model: the tokens its pretraining corpus never contains
    (pad and the ChatML role tokens; ``<|endoftext|>`` separates pretraining documents, so it is not new)."""
    ids = tokenizer.convert_tokens_to_ids([PAD, IM_START, IM_END])
    return sorted({i for i in ids if i is not None and i != tokenizer.unk_token_id})


def builtin_unused_token_ids(tokenizer, corpus: list[str]) -> list[int]:
    """The ids a builtin's pretraining never saw — the under-trained check's known-unused reference rows
    (:func:`harness.models.undertrained.detect_undertrained`): tokens absent from the world corpus (the tokenizer also
    learned the task data, so its task-only tokens are here), except ``<|endoftext|>``, which pretraining puts
    between documents."""
    seen = {tokenizer.convert_tokens_to_ids(ENDOFTEXT)}
    for ids in tokenizer(list(corpus), add_special_tokens=False)["input_ids"]:
        seen.update(ids)
    return [i for i in range(len(tokenizer)) if i not in seen]


def build_builtin(spec: ModelSpec, tokenizer, seed: int):
    """A freshly initialised builtin model (deterministic for ``seed``)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = builtin_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model
