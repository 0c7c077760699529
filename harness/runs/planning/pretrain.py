"""The base model of a builtin architecture: tokenizer training, optional pretraining on the world corpus, and a
cache keyed by a hash of everything that determines the result (tokenizer, model config, pretraining settings,
corpus, the CPU kernel path), so a second run with the same base skips pretraining.

Pretraining uses the same loop as SFT (:func:`harness.training.loop.train_stage`) on packed corpus sequences in which
every position is supervised.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.config import ModelSpec, OptimSpec, PretrainSpec
from harness.core.digests import content_hash
from harness.models.tokenizer import ENDOFTEXT, train_tokenizer
from harness.training.checkpoint import save_hf_checkpoint

CACHE_VERSION = "1"


def cache_root() -> Path:
    """``$HARNESS_CACHE`` or ``~/.cache/harness``."""
    return Path(os.environ.get("HARNESS_CACHE") or Path.home() / ".cache" / "harness")


@dataclass
class BaseModelInfo:
    cache_dir: Path | None
    cache_hit: bool
    final_loss: float | None


def tokenizer_texts(corpus: list[str], train_examples: list) -> list[str]:
    """Texts the builtin tokenizer learns from: the corpus and every message of the training pools (with the
    role names, so ``user``/``assistant`` become single tokens)."""
    texts = list(corpus)
    for ex in train_examples:
        texts.extend(f"{m['role']}\n{m['content']}" for m in ex.messages)
    return texts


def _packed_batches(tokenizer, corpus: list[str], spec: PretrainSpec, seed: int):
    """``spec.steps`` batches of random ``seq_len`` windows over the shuffled, EOS-joined corpus."""
    import torch

    from harness.data.batches import Batch

    rng = np.random.default_rng(seed)
    order = rng.permutation(len(corpus))
    eot = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    encoded = tokenizer([corpus[i] for i in order], add_special_tokens=False)["input_ids"]
    stream = np.fromiter((t for ids in encoded for t in (*ids, eot)), dtype=np.int64)
    length = spec.seq_len
    if len(stream) <= length + 1:
        raise ValueError(f"the pretraining corpus has {len(stream)} tokens, fewer than seq_len={length}")
    batches = []
    for _ in range(spec.steps):
        starts = rng.integers(0, len(stream) - length - 1, size=spec.batch_size)
        window = np.stack([stream[s : s + length + 1] for s in starts])
        ids = torch.from_numpy(window[:, :-1].copy())
        labels = torch.from_numpy(window[:, 1:].copy())
        batches.append(
            Batch(ids, torch.ones_like(ids), labels, ["pretrain"] * spec.batch_size, ids.numel(), ids.numel())
        )
    return batches


def builtin_base(
    spec: ModelSpec,
    corpus: list[str],
    train_examples: list,
    seed: int,
    progress: Callable[[str, int], Callable[[int], None]] | None = None,
):
    """(model, tokenizer, info) for a builtin architecture, pretrained and cached when ``spec.pretrain`` is set."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness.models.builtin import build_builtin, builtin_config
    from harness.runs.planning.kernel_path import kernel_path
    from harness.training.loop import StageLoop, train_stage

    tokenizer = train_tokenizer(
        tokenizer_texts(corpus, train_examples), spec.tokenizer.vocab_size, spec.tokenizer.min_frequency
    )
    if spec.pretrain is None:
        return build_builtin(spec, tokenizer, seed), tokenizer, BaseModelInfo(None, False, None)

    key = content_hash(
        {
            "version": CACHE_VERSION,
            "tokenizer": tokenizer.backend_tokenizer.to_str(),
            "config": builtin_config(spec, tokenizer).to_dict(),
            "pretrain": spec.pretrain.model_dump(),
            "corpus": hashlib.sha256("\x00".join(corpus).encode()).hexdigest(),
            "seed": seed,
            # AVX2 and AVX-512 kernels round differently: a base pretrained on one path is another model on the other
            "kernel_path": kernel_path(),
        }
    )
    cache_dir = cache_root() / "base" / key[:20]
    if (cache_dir / "meta.json").exists():
        meta = json.loads((cache_dir / "meta.json").read_text())
        model = AutoModelForCausalLM.from_pretrained(cache_dir, attn_implementation="sdpa")
        return model, AutoTokenizer.from_pretrained(cache_dir), BaseModelInfo(cache_dir, True, meta["final_loss"])

    model = build_builtin(spec, tokenizer, seed)
    if torch.cuda.is_available():
        model = model.to("cuda")
    pre = spec.pretrain
    batches = _packed_batches(tokenizer, corpus, pre, seed)
    losses: list[float] = []

    def log(rows, step):
        losses.extend(r.value for r in rows if r.task is None and r.metric == "loss")

    train_stage(
        model,
        batches,
        StageLoop(
            stage="pretrain",
            start_step=0,
            optim=OptimSpec(lr=pre.lr, warmup=pre.warmup, weight_decay=pre.weight_decay),
            tasks=["pretrain"],
            log=log,
            evaluate=lambda step: None,
            log_every=max(1, pre.steps // 10),
            diagnostics=False,
            progress=progress("pretrain", pre.steps) if progress else None,
        ),
    )
    model.eval()
    save_hf_checkpoint(cache_dir, model, tokenizer, {"final_loss": losses[-1] if losses else None, "key": key})
    return model, tokenizer, BaseModelInfo(cache_dir, False, losses[-1] if losses else None)
