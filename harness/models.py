"""Base models: builtin tiny architectures built from transformers configs, or any HF causal LM by id or path.

Builtin models get the harness's own tokenizer (trained on the world corpus and the experiment's task data) and,
with ``model.pretrain``, are pretrained on the world corpus and cached (see :mod:`harness.pretrain`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.registry import Registry, suggest

if TYPE_CHECKING:  # pragma: no cover
    from harness.config import ModelSpec


@dataclass(frozen=True)
class BuiltinArch:
    """A builtin architecture: a transformers model type and the tiny defaults of its config."""

    model_type: str
    defaults: dict[str, Any]


BUILTIN_MODELS: Registry[BuiltinArch] = Registry("builtin model")

_TINY = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
             max_position_embeddings=512, tie_word_embeddings=True)
BUILTIN_MODELS.add("qwen2-tiny", BuiltinArch("qwen2", dict(_TINY, num_key_value_heads=2, rope_theta=10000.0)))
BUILTIN_MODELS.add("llama-tiny", BuiltinArch("llama", dict(_TINY, num_key_value_heads=2, rope_theta=10000.0)))


def _config_class(model_type: str):
    from transformers import AutoConfig

    return type(AutoConfig.for_model(model_type))


def check_model_spec(spec: "ModelSpec") -> list[tuple[str, str]]:
    """Errors in the ``model`` section that the schema cannot see (unknown builtin, unknown config fields)."""
    errors: list[tuple[str, str]] = []
    if spec.builtin is None:
        return errors
    if spec.builtin not in BUILTIN_MODELS:
        known = BUILTIN_MODELS.names()
        errors.append(("model.builtin", f"unknown builtin model {spec.builtin!r}{suggest(spec.builtin, known)}; "
                                        f"known: {', '.join(known)}"))
        return errors
    arch = BUILTIN_MODELS.get(spec.builtin)
    known_fields = list(_config_class(arch.model_type)().to_dict())
    for key in spec.config:
        if key not in known_fields:
            errors.append((f"model.config.{key}", f"not a field of the {arch.model_type} config"
                                                  f"{suggest(key, known_fields)}"))
    return errors


def builtin_config(spec: "ModelSpec", tokenizer) -> Any:
    """The transformers config of a builtin model, sized to ``tokenizer``."""
    arch = BUILTIN_MODELS.get(spec.builtin)
    fields = {**arch.defaults, **spec.config}
    fields.update(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return _config_class(arch.model_type)(**fields)


def build_builtin(spec: "ModelSpec", tokenizer, seed: int):
    """A freshly initialised builtin model (deterministic for ``seed``)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = builtin_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model


def load_hf(spec: "ModelSpec"):
    """Load any causal LM and its tokenizer by hub id or local path (``trust_remote_code`` off unless asked)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, spec.dtype)
    tokenizer = AutoTokenizer.from_pretrained(spec.hf, revision=spec.revision, trust_remote_code=spec.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        spec.hf, revision=spec.revision, trust_remote_code=spec.trust_remote_code, dtype=dtype
    )
    if tokenizer.pad_token is None:
        # A pad token is needed for batching; reuse EOS rather than growing the vocabulary (pad is always masked).
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        from harness.tokenizer import CHAT_TEMPLATE, IM_END, IM_START

        # A base model without a template gets ChatML; the role tokens are added (and their rows must train).
        tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
        tokenizer.eos_token = IM_END
        tokenizer.chat_template = CHAT_TEMPLATE
        model.resize_token_embeddings(len(tokenizer))
        model.config.eos_token_id = tokenizer.eos_token_id
    if model.generation_config is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer


def count_parameters(model) -> tuple[int, int]:
    """(total, trainable) parameter counts; tied weights counted once."""
    seen, total, trainable = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return total, trainable
