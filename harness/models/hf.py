"""Any Hugging Face causal LM by hub id or local path, its tokenizer made chat-ready; parameter counts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harness.models.tokenizer import CHAT_TEMPLATE, IM_END, IM_START

if TYPE_CHECKING:  # pragma: no cover
    from harness.config.schema import ModelSpec


def load_hf(spec: ModelSpec, return_added: bool = False):
    """Load any causal LM and its tokenizer by hub id or local path (``trust_remote_code`` off unless asked).

    Returns ``(model, tokenizer)``, or ``(model, tokenizer, added_ids)`` with ``return_added=True``: the ids of the
    tokens this function added to the vocabulary (the ChatML role tokens when the tokenizer has no chat template;
    ``<|im_end|>`` then becomes EOS), sorted — the rows ``trainable.new_token_rows`` trains. Embeddings are resized
    (new rows: transformers' mean-resizing) only when the vocabulary outgrows the embedding matrix.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, spec.dtype)
    tokenizer = AutoTokenizer.from_pretrained(spec.hf, revision=spec.revision, trust_remote_code=spec.trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(
        spec.hf, revision=spec.revision, trust_remote_code=spec.trust_remote_code, dtype=dtype
    )
    before = set(tokenizer.get_vocab().values())
    if tokenizer.pad_token is None:
        # A pad token is needed for batching; reuse EOS rather than growing the vocabulary (pad is always masked).
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        # A base model without a template gets ChatML; the role tokens are added (and their rows must train).
        tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, IM_END]})
        tokenizer.eos_token = IM_END
        tokenizer.chat_template = CHAT_TEMPLATE
        if tokenizer.pad_token is None:
            tokenizer.pad_token = IM_END
        if len(tokenizer) > model.get_input_embeddings().weight.shape[0]:
            model.resize_token_embeddings(len(tokenizer))
        model.config.eos_token_id = tokenizer.eos_token_id
    if model.generation_config is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    added = sorted(set(tokenizer.get_vocab().values()) - before)
    return (model, tokenizer, added) if return_added else (model, tokenizer)


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
