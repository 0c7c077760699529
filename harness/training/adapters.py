"""What trains in a stage: full, LoRA / HiRA adapters (peft), a frozen base with only the new tokens' rows, and
``unfreeze`` regexes on top; the AdamW parameter groups that keep masked rows still; the special-token gradient
check. (Stage checkpoints, merged HF model + peft adapter, are written by :mod:`harness.training.checkpoint`.)

The loop's side, in order, for each stage (see the module functions for details):

1. ``model = prepare_stage_model(model, stage.train.trainable, added_ids, previous)`` — may wrap the model in a
   ``PeftModel`` (adapter modes) or unwrap it (``adapter: merge``); always use the returned model;
2. build the optimiser on :func:`param_groups` (:func:`weight_decay_exempt` parameters in the no-decay group);
3. forward through ``unwrap(model)`` (the ``*ForCausalLM`` module, adapters injected);
4. after the first ``backward()`` of the stage, before the optimiser step:
   ``check_special_token_gradients(model, stage_special_tokens(tokenizer, batches), batch=first_batch)``;
5. at the end: :func:`harness.training.checkpoint.save_stage_checkpoint` ``(model, tokenizer, directory, meta)``.

**New-token rows.** ``new_token_rows: true`` makes the input embedding and the output head (one matrix when they
are tied) trainable and registers a gradient hook on each that zeroes every row except the added tokens' (under
``auto``, the default, also the rows :mod:`harness.models.undertrained` flags, where the mode leaves the matrix
frozen) — the seed's mechanism, with the rows given by id (``grad.masked_fill``), never by a ``grad[:N]`` range (the
seed's ``grad[:32000]`` / ``grad[:31999]`` off-by-one froze ``<|endoftext|>`` for three days). A zero gradient alone
does not keep a row still under AdamW: decoupled weight decay shrinks every entry of a parameter
(``p -= lr·wd·p``) whatever its gradient. So a row-masked matrix must get no weight decay: the loop puts every
parameter for which :func:`weight_decay_exempt` is true in its ``weight_decay: 0`` group. With that, Adam's moments
of a masked row stay exactly 0 and its update is exactly 0, so masked rows stay bitwise equal to their initial
values (tests/training/test_adapters.py checks it against the checkpoint). The trained rows themselves then get no
weight decay either.

**Adapters** (peft ``LoraConfig`` / ``HiraConfig``): ``r``, ``alpha`` (LoRA's ``lora_alpha``; HiRA has no scaling
and ignores it), ``dropout``, ``target_modules`` — by default ``q_proj, k_proj, v_proj, up_proj, down_proj`` (the
seed's HiRA choice: attention q/k/v and two MLP projections). These canonical names are mapped per architecture
(:data:`TARGET_ALIASES`): GPT-2's q/k/v → ``attn.c_attn`` (one fused matrix), ``o_proj`` → ``attn.c_proj``,
``up_proj`` → ``mlp.c_fc``, ``down_proj`` → ``mlp.c_proj``; Qwen3.5's q/k/v → the full-attention layers'
``self_attn.q_proj`` … and the Gated DeltaNet layers' ``linear_attn.in_proj_qkv``, ``o_proj`` → ``self_attn.o_proj``
and ``linear_attn.out_proj``. Any other name is passed to peft as written; a target that matches no module is an
error. At the next stage the adapter is merged into the weights (``adapter: merge``, then that stage's mode applies)
or kept training (``adapter: continue``: that stage must use the same adapter type and settings).
"""

from __future__ import annotations

import copy
import re
import sys
import warnings
from collections.abc import Iterable
from typing import Any

import torch

from harness.config import TrainableSpec
from harness.models.image_text import VISION_PARTS, model_part

ADAPTER_MODES = ("lora", "hira")
DEFAULT_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "up_proj", "down_proj"]

# Canonical projection name → module-name suffixes, per transformers model_type (unlisted: used as written).
_QWEN35 = {
    "q_proj": ["self_attn.q_proj", "linear_attn.in_proj_qkv"],
    "k_proj": ["self_attn.k_proj", "linear_attn.in_proj_qkv"],
    "v_proj": ["self_attn.v_proj", "linear_attn.in_proj_qkv"],
    "o_proj": ["self_attn.o_proj", "linear_attn.out_proj"],
}
TARGET_ALIASES: dict[str, dict[str, list[str]]] = {
    "gpt2": {
        "q_proj": ["attn.c_attn"],
        "k_proj": ["attn.c_attn"],
        "v_proj": ["attn.c_attn"],
        "o_proj": ["attn.c_proj"],
        "up_proj": ["mlp.c_fc"],
        "down_proj": ["mlp.c_proj"],
    },
    "qwen3_5_text": _QWEN35,
    "qwen3_5": _QWEN35,
}

# Attributes set on a row-masked parameter (the embedding / head matrix under new_token_rows).
_ROWS = "_harness_trainable_rows"
_HOOK = "_harness_row_mask_hook"


# ----------------------------------------------------------------------------------------------------------------
# Small helpers
# ----------------------------------------------------------------------------------------------------------------


def is_peft_model(model) -> bool:
    """Whether ``model`` is a ``peft.PeftModel`` (without importing peft when nothing has)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def unwrap(model):
    """The underlying ``*ForCausalLM`` module (adapter layers injected, for a ``PeftModel``), so the loop can call
    ``unwrap(model).base_model(...)`` and ``unwrap(model).get_output_embeddings()``."""
    return model.get_base_model() if is_peft_model(model) else model


def vocab_parameters(model) -> list[tuple[str, torch.nn.Parameter, bool]]:
    """``(description, matrix, is_output)`` for the distinct matrices that hold one row per vocabulary token: the
    input embedding and the output head (one entry when they are tied, with ``is_output`` true)."""
    base = unwrap(model)
    emb = base.get_input_embeddings()
    head = base.get_output_embeddings()
    names: dict[int, list[str]] = {}
    for n, p in base.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    out = []
    head_w = getattr(head, "weight", None) if head is not None else None
    emb_w = getattr(emb, "weight", None)
    if head_w is not None:
        where = " = ".join(names.get(id(head_w), ["output head"]))
        out.append((where + (" (tied input embedding and output head)" if head_w is emb_w else ""), head_w, True))
    if emb_w is not None and emb_w is not head_w:
        out.append((" = ".join(names.get(id(emb_w), ["input embedding"])), emb_w, False))
    return out


def weight_decay_exempt(param: torch.Tensor) -> bool:
    """True for a row-masked matrix (``new_token_rows``): it must sit in the optimiser's ``weight_decay: 0`` group,
    or AdamW's decoupled decay would move the rows the mask keeps frozen."""
    return hasattr(param, _ROWS)


def masked_rows(param: torch.Tensor) -> list[int] | None:
    """The rows a row-masked matrix trains (``new_token_rows``), or None for any other parameter."""
    return getattr(param, _ROWS, None)


def mark_masked_rows(param: torch.Tensor, rows: list[int]) -> None:
    """Record ``rows`` as the rows ``param`` trains, under a mask applied elsewhere
    (:mod:`harness.training.parallel.fsdp`)."""
    setattr(param, _ROWS, list(rows))


def param_groups(model, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW parameter groups over the trainable parameters: decay for matrices, none for biases, norms and
    row-masked matrices (:func:`weight_decay_exempt`)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or weight_decay_exempt(p) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def resolve_target_modules(model, names: Iterable[str] | None) -> list[str]:
    """The peft ``target_modules`` for this architecture (canonical names mapped, see :data:`TARGET_ALIASES`);
    raises ``ValueError`` naming any target that matches no module."""
    base = unwrap(model)
    model_type = getattr(base.config, "model_type", "")
    aliases = TARGET_ALIASES.get(model_type, {})
    module_names = [n for n, _ in base.named_modules() if n]
    resolved: list[str] = []
    for name in names if names is not None else DEFAULT_TARGET_MODULES:
        candidates = aliases.get(name, [name])
        present = [c for c in candidates if any(m == c or m.endswith("." + c) for m in module_names)]
        if not present:
            leaves = sorted(
                {
                    m.split(".")[-1]
                    for m, mod in base.named_modules()
                    if isinstance(mod, torch.nn.Linear) or type(mod).__name__ == "Conv1D"
                }
            )
            raise ValueError(
                f"trainable.target_modules: {name!r} matches no module of this {model_type} model; "
                f"its linear layers are: {', '.join(leaves)}"
            )
        resolved.extend(c for c in present if c not in resolved)
    return resolved


def _remove_row_masks(model) -> None:
    for p in model.parameters():
        handle = getattr(p, _HOOK, None)
        if handle is not None:
            handle.remove()
            delattr(p, _HOOK)
        if hasattr(p, _ROWS):
            delattr(p, _ROWS)


def _frozen_rows(n_rows: int, rows: list[int], device) -> torch.Tensor:
    """[n_rows] bool: True on every row except ``rows`` (by id, never by a range)."""
    frozen = torch.ones(n_rows, dtype=torch.bool, device=device)
    frozen[torch.tensor(rows, dtype=torch.long, device=device)] = False
    return frozen


def _mask_rows(param: torch.nn.Parameter, rows: list[int]) -> None:
    """Make ``param`` trainable on ``rows`` only: a gradient hook zeroes every other row (masked_fill, so even a
    non-finite gradient becomes exactly 0 there). ``rows`` is recorded on the parameter as the rows meant to
    train (what :func:`check_special_token_gradients` holds the hook to)."""
    frozen = _frozen_rows(param.shape[0], rows, param.device).view(-1, *([1] * (param.ndim - 1)))
    cache = {frozen.device: frozen}

    def hook(grad: torch.Tensor) -> torch.Tensor:
        mask = cache.get(grad.device)
        if mask is None:
            mask = cache[grad.device] = frozen.to(grad.device)
        return grad.masked_fill(mask, 0)

    param.requires_grad_(True)
    setattr(param, _ROWS, list(rows))
    setattr(param, _HOOK, param.register_hook(hook))


def _adapter_config(model, spec: TrainableSpec):
    from peft import HiraConfig, LoraConfig  # peft is imported only when a stage uses an adapter (import cost)

    targets: Any = resolve_target_modules(model, spec.target_modules)
    if any(model_part(n) == "vision_tower" for n, _ in unwrap(model).named_parameters()):
        # An image-text model: adapters go on the language model only (its tower has q/k/v projections too);
        # peft reads a string as a full-match regex over module names.
        targets = r".*language_model.*\.(" + "|".join(re.escape(t) for t in targets) + ")"
    fan_in_fan_out = getattr(unwrap(model).config, "model_type", "") == "gpt2"  # GPT-2's Conv1D stores W transposed
    if spec.mode == "lora":
        return LoraConfig(
            r=spec.r,
            lora_alpha=spec.alpha,
            lora_dropout=spec.dropout,
            target_modules=targets,
            fan_in_fan_out=fan_in_fan_out,
            bias="none",
            task_type="CAUSAL_LM",
        )
    return HiraConfig(
        r=spec.r,
        hira_dropout=spec.dropout,
        target_modules=targets,
        fan_in_fan_out=fan_in_fan_out,
        task_type="CAUSAL_LM",
    )


def adapter_prefix(model) -> str:
    """The name fragment of a peft model's adapter parameters (``lora_``, ``hira_``)."""
    return getattr(model.base_model, "prefix", "lora_")


# ----------------------------------------------------------------------------------------------------------------
# The stage's trainable set
# ----------------------------------------------------------------------------------------------------------------


def prepare_stage_model(
    model,
    trainable: TrainableSpec,
    added_token_ids: Iterable[int],
    previous: TrainableSpec | None = None,
    undertrained_ids: Iterable[int] = (),
):
    """Set what trains in this stage; returns the model to train (a ``PeftModel`` in adapter modes).

    ``added_token_ids``: the rows ``new_token_rows`` trains (``load_hf(..., return_added=True)``'s ids, or
    :func:`harness.models.builtin.builtin_added_token_ids` for a builtin). ``previous``: the previous stage's trainable
    spec when this stage continues from its weights (``init: previous``), else ``None``. ``undertrained_ids``: the
    base model's flagged special tokens (:func:`harness.models.undertrained.undertrained_tokens`), which
    ``new_token_rows: auto`` trains too.

    Order: a ``PeftModel`` from the previous stage is merged (``previous.adapter == "merge"``) or kept
    (``"continue"``); the mode sets ``requires_grad`` (full: all; frozen: none; lora / hira: the adapter only);
    ``unfreeze`` regexes (``re.search`` over parameter names of the ``*ForCausalLM`` module, tied aliases such as
    ``lm_head.weight`` included) make whole parameters trainable; ``new_token_rows`` makes the embedding / head
    trainable on the added rows only (a matrix already fully trainable is left so). Row masks of a previous stage
    are removed first.
    """
    if isinstance(trainable, (str, dict)):
        trainable = TrainableSpec.model_validate(trainable)
    _remove_row_masks(model)
    model, continuing = _carry_adapter(model, trainable, previous)

    for p in model.parameters():
        p.requires_grad_(trainable.mode == "full")
    if trainable.mode in ADAPTER_MODES:
        if continuing:
            prefix = adapter_prefix(model)
            for name, p in model.named_parameters():
                if prefix in name:
                    p.requires_grad_(True)
        else:
            from peft import get_peft_model  # peft is imported only when a stage uses an adapter (import cost)

            model = get_peft_model(model, _adapter_config(model, trainable))
    _unfreeze(unwrap(model), trainable.unfreeze)
    _train_new_token_rows(
        model, trainable, sorted({int(i) for i in added_token_ids}), sorted({int(i) for i in undertrained_ids})
    )
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            f"trainable.mode {trainable.mode!r} leaves nothing to train; add new_token_rows: true or "
            "unfreeze: [regex, …]"
        )
    return model


def _carry_adapter(model, trainable: TrainableSpec, previous: TrainableSpec | None) -> tuple[Any, bool]:
    """``(model, continuing)``: a ``PeftModel`` left by the previous stage is merged into its weights
    (``adapter: merge``) or kept for this stage to train on (``adapter: continue``, same type and settings)."""
    if not is_peft_model(model):
        return model, False
    if previous is None or previous.mode not in ADAPTER_MODES:
        raise ValueError(
            "the model carries a peft adapter but no previous adapter stage was given; merge it "
            "(prepare with previous=<that stage's trainable>) or drop it first (drop_adapter)"
        )
    if previous.adapter == "merge":
        return model.merge_and_unload(), False
    if trainable.mode != previous.mode:
        raise ValueError(
            f"adapter: continue keeps training the previous stage's {previous.mode} adapter, "
            f"but this stage's trainable.mode is {trainable.mode!r}; use mode {previous.mode} "
            "or adapter: merge in the previous stage"
        )
    fields = (
        ("r", "alpha", "dropout", "target_modules") if trainable.mode == "lora" else ("r", "dropout", "target_modules")
    )  # HiRA has no alpha
    changed = [f for f in fields if getattr(trainable, f) != getattr(previous, f)]
    if changed:
        raise ValueError(
            f"adapter: continue keeps the previous stage's adapter, but this stage changes "
            f"{', '.join(changed)}; keep them equal or merge the adapter first"
        )
    return model, True


def _unfreeze(base, patterns: list[str]) -> None:
    """Make every parameter whose name matches one of the ``unfreeze`` regexes trainable (whole)."""
    if not patterns:
        return
    named = list(base.named_parameters(remove_duplicate=False))
    for pattern in patterns:
        try:
            rx = re.compile(pattern)
        except re.error as e:
            raise ValueError(f"trainable.unfreeze: {pattern!r} is not a valid regex ({e})") from None
        # An image-text model's part names (vision_tower, projector, language_model) select whole parts.
        matched = [p for n, p in named if (model_part(n) == pattern if pattern in VISION_PARTS else rx.search(n))]
        if not matched:
            sample = ", ".join(sorted({re.sub(r"\.\d+\.", ".N.", n) for n, _ in named})[:12])
            raise ValueError(f"trainable.unfreeze: {pattern!r} matches no parameter; names look like: {sample}")
        for p in matched:
            p.requires_grad_(True)


def _train_new_token_rows(model, trainable: TrainableSpec, added: list[int], undertrained: list[int]) -> None:
    """``new_token_rows``: the embedding / head rows of the ``added`` tokens train (row masks) — under ``auto``
    also the ``undertrained`` ones, in any mode that leaves those matrices frozen (under ``full`` they train
    anyway); with ``false``, warn when the added rows stay frozen at their initial values."""
    vocab = vocab_parameters(model)
    setting = trainable.new_token_rows
    if setting is True and not added:
        raise ValueError(
            "trainable.new_token_rows: no tokens were added to this model's vocabulary (its "
            "tokenizer already had a chat template and every special token), so there are no new "
            "rows to train"
        )
    rows = added if setting is True else sorted(set(added) | set(undertrained)) if setting == "auto" else []
    if rows:
        for where, w, _ in vocab:
            if max(rows) >= w.shape[0]:
                raise ValueError(f"token id {max(rows)} is outside {where} ({w.shape[0]} rows)")
            if not w.requires_grad:  # a matrix the mode / unfreeze already trains stays fully trainable
                _mask_rows(w, rows)
    elif added and trainable.mode != "full" and not any(w.requires_grad for _, w, _ in vocab):
        warnings.warn(
            f"{len(added)} token(s) were added to the vocabulary but their embedding / output rows are "
            f"frozen in this stage (trainable.mode {trainable.mode}); they keep their initial values — set "
            "trainable.new_token_rows: auto or true to train them",
            stacklevel=3,
        )


def drop_adapter(model):
    """The base model without its adapter and without merging it (for a stage whose ``init`` reloads weights)."""
    _remove_row_masks(model)
    return model.unload() if is_peft_model(model) else model


def merged_copy(model):
    """A copy of the model as a plain ``*ForCausalLM`` (adapter merged into the copy); ``model`` is untouched."""
    if not is_peft_model(model):
        return copy.deepcopy(model)
    return copy.deepcopy(model).merge_and_unload()


def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The plain model's state dict (adapter merged), detached copies — for the runner's per-stage snapshots."""
    source = merged_copy(model) if is_peft_model(model) else model
    return {k: v.detach().clone() for k, v in source.state_dict().items()}


# ----------------------------------------------------------------------------------------------------------------
# Reporting and checks
# ----------------------------------------------------------------------------------------------------------------


def trainable_report(model) -> dict[str, Any]:
    """``{total, trainable, share, adapter}``: parameter counts with tied weights counted once; a row-masked matrix
    counts only its trainable rows. ``total`` includes adapter parameters (``adapter`` of them)."""
    total = trainable = adapter = 0
    prefix = adapter_prefix(model) if is_peft_model(model) else None
    for name, p in model.named_parameters():  # remove_duplicate=True: tied weights once
        total += p.numel()
        if prefix is not None and prefix in name:
            adapter += p.numel()
        if p.requires_grad:
            rows = getattr(p, _ROWS, None)
            trainable += len(rows) * (p.numel() // p.shape[0]) if rows is not None else p.numel()
    return {"total": total, "trainable": trainable, "share": trainable / total if total else 0.0, "adapter": adapter}


def format_trainable_report(report: dict[str, Any]) -> str:
    """One line for :func:`trainable_report`: trainable of total parameters, share, adapter size."""
    return f"trainable {report['trainable']:,} of {report['total']:,} parameters ({100 * report['share']:.2f}%)" + (
        f", adapter {report['adapter']:,}" if report.get("adapter") else ""
    )
