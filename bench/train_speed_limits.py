"""How close ``bench/train_speed.py``'s runs come to the machine's limit: the model's training FLOPs per pass
(:func:`harness_flops`), this machine's ``torch.matmul`` rate on the model's own shapes
(:func:`matmul_throughput`), and ``--profile``'s grouping of operators into kinds (:func:`profile_kinds`). Not a
script: ``bench/train_speed.py`` imports it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench.train_speed_inputs import load_inputs

PROFILE_KINDS = [  # (kind, operator names) — the first match wins
    ("matmul (mm, addmm, bmm)", ("aten::mm", "aten::addmm", "aten::bmm")),
    ("attention (sdpa, forward+backward)", ("scaled_dot_product",)),
    ("optimizer (fused AdamW)", ("adamw", "aten::_foreach", "aten::lerp", "aten::addcdiv", "aten::addcmul")),
    ("loss (log_softmax, nll)", ("log_softmax", "nll_loss")),
    ("grad norm / clip", ("linalg_vector_norm", "aten::norm", "aten::clamp")),
    ("gather / index", ("index", "gather", "scatter", "embedding", "nonzero", "masked")),
    (
        "elementwise (norms, RoPE, SiLU, residuals)",
        (
            "aten::mul",
            "aten::add",
            "aten::sum",
            "aten::pow",
            "aten::neg",
            "aten::cat",
            "aten::silu",
            "aten::div",
            "aten::sub",
            "aten::rsqrt",
            "aten::mean",
            "aten::where",
            "aten::sqrt",
        ),
    ),
    (
        "memory (copy_, fill_, zeros, empty)",
        ("aten::copy_", "aten::fill_", "aten::zero", "aten::empty", "aten::clone", "aten::to"),
    ),
]


def profile_kinds(events, steps: int) -> dict[str, float]:
    """Self CPU time per kind of operator, in ms per step."""
    totals = {kind: 0.0 for kind, _ in PROFILE_KINDS} | {"other": 0.0}
    for event in events:
        name = event.key.lower()
        kind = next((k for k, needles in PROFILE_KINDS if any(n.lower() in name for n in needles)), "other")
        totals[kind] += event.self_cpu_time_total / 1000 / steps
    return totals


def model_shape(workdir: Path) -> dict:
    """The sizes of the saved model's config that its matmuls depend on."""
    config = json.loads((workdir / "model" / "config.json").read_text())
    d, heads = config["hidden_size"], config["num_attention_heads"]
    return {
        "d": d,
        "layers": config["num_hidden_layers"],
        "heads": heads,
        "kv": config.get("num_key_value_heads", heads),
        "head_dim": config.get("head_dim") or d // heads,
        "ffn": config["intermediate_size"],
        "vocab": config["vocab_size"],
    }


def model_flops(workdir: Path, real_tokens: int, supervised_tokens: int, seq_sq: float) -> dict:
    """Training FLOPs of the harness's work: ``6 × N × T`` for the body's matmuls at every real token, the head's
    at supervised tokens only, and attention (``12 × layers × d_attn × L²`` per sequence, halved for causality)."""
    shape = model_shape(workdir)
    d, layers, heads, kv, head_dim, ffn, vocab = (
        shape[k] for k in ("d", "layers", "heads", "kv", "head_dim", "ffn", "vocab")
    )
    body = layers * (d * heads * head_dim * 2 + d * kv * head_dim * 2 + 3 * d * ffn)
    head = d * vocab
    attention = 12 * layers * heads * head_dim * seq_sq / 2
    return {
        "body_params": body,
        "head_params": head,
        "flops": 6 * body * real_tokens + 6 * head * supervised_tokens + attention,
        "flops_6nt": 6 * (body + head) * real_tokens + attention,
    }


def matmul_throughput(workdir: Path, args) -> dict:
    """fp32 (bf16 on CUDA) ``torch.matmul`` FLOP/s on the model's own shapes — every projection at the batch's
    token count, forward and the two backward products — and on one large square matmul."""
    import torch

    shape = model_shape(workdir)
    d, heads, kv, head_dim, ffn, vocab = (shape[k] for k in ("d", "heads", "kv", "head_dim", "ffn", "vocab"))
    m, sup = args.tokens_per_batch, args.supervised_per_batch
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    shapes = [
        (m, d, heads * head_dim),
        (m, d, kv * head_dim),
        (m, d, kv * head_dim),
        (m, heads * head_dim, d),
        (m, d, ffn),
        (m, d, ffn),
        (m, ffn, d),
        (sup, d, vocab),
    ]

    def products(a, k, n):  # forward x@W, backward dX = dY@Wᵀ and dW = Xᵀ@dY
        return [(a, k, n), (a, n, k), (k, a, n)]

    def rate(all_shapes, seconds_min=1.0):
        mats = [
            (torch.randn(a, k, dtype=dtype, device=args.device), torch.randn(k, n, dtype=dtype, device=args.device))
            for a, k, n in all_shapes
        ]
        flops = sum(2 * a * k * n for a, k, n in all_shapes)
        for x, y in mats:  # warm-up
            torch.matmul(x, y)
        best, reps = 0.0, 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds_min or reps < 3:
            t0 = time.perf_counter()
            for x, y in mats:
                torch.matmul(x, y)
            if args.device == "cuda":
                torch.cuda.synchronize()
            best = max(best, flops / (time.perf_counter() - t0))
            reps += 1
        return best

    model_shapes = [p for s in shapes for p in products(*s)]
    big = 8192 if args.device == "cuda" else 2048
    return {
        "model_shapes": rate(model_shapes),
        "square": rate([(big, big, big)]),
        "dtype": str(dtype).replace("torch.", ""),
    }


def harness_flops(workdir: Path, args) -> dict:
    """FLOPs of one pass of the harness's plan (per real token, so any window scales)."""
    from transformers import AutoTokenizer

    from harness.data.stage_batches import plan_stage
    from harness.runs.planning.prepare import stage_batching

    exp, pools = load_inputs(workdir)
    tokenizer = AutoTokenizer.from_pretrained(workdir / "tokenizer")
    plan = plan_stage(stage_batching(exp), exp.resolved_stages()[0], 0, pools, tokenizer.pad_token_id)
    real = sum(b.n_real_tokens for b in plan.batches)
    supervised = sum(b.supervised.numel() for b in plan.batches)
    seq_sq = sum(float((b.attention_mask.sum(1).double() ** 2).sum()) for b in plan.batches)
    return {**model_flops(workdir, real, supervised, seq_sq), "real_tokens": real}
