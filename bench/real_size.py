"""Qwen2.5-0.5B's shape through ``harness run``: peak memory against its analytic bound, tokens/s, evaluation share.

Runs ``experiments/real_size.yaml`` (builtin ``qwen2.5-0.5b``, random weights, its 151,936-row vocabulary; packing
and its check, greedy evaluation, the first-token probe, the shipped ``world_mc`` benchmark, checkpoints) once per
layer count and precision (``fp32`` and ``bf16-autocast``), each in a fresh ``python -m harness run`` subprocess,
interleaved, and prints one table. Per run:

- **peak RSS**: the child's ``ru_maxrss`` from ``os.wait4`` (that child alone, not the bench's other children);
- **bound**: the analytic bound below, and peak RSS / bound;
- **tokens/s**: the median of the run's logged ``tokens_per_s`` (real tokens; its logging windows exclude evaluation);
- **s/step**: the training time (``summary.json``'s total − evaluation − base-model seconds) over the steps;
- **eval share**: ``summary.json``'s ``timing.eval_share`` (evaluation seconds over the run's wall time).

The analytic bound, in bytes, for P parameters (tied embedding counted once), L layers, hidden H, intermediate I, a
step of at most T tokens of which at most N are supervised, vocabulary V::

    fp32:           16·P                              weights, gradients, AdamW's two moments (4 bytes each)
                  + 4·T·(L·(8·H + 4·I) + 3·H)         activations kept for backward: per layer the two norms' inputs
                                                      and outputs, q, the GQA-repeated k and v, the attention output
                                                      (8·H), the MLP's gate, up, SiLU(gate) and their product (4·I);
                                                      the embedding output and the final norm (3·H)
                  + 4·3·N·V                           logits at supervised positions, their log-softmax, its gradient
    bf16-autocast: the same + 2·P                     autocast's bf16 copies of the weights (fp32 master weights)

T is the sum of the ``batch_size`` longest training examples (chat-rendered, tokenised as the run tokenises), N the
sum of their answer tokens: bounds on any packed step. The bound leaves out the interpreter and its libraries
(torch, transformers, lm-eval: about a gigabyte of resident memory before a model exists), which is why the slow test
allows a factor over it.

Run from the repository root (needs the benchmarks extra)::

    python bench/real_size.py                          # 2 and 4 layers, fp32 and bf16-autocast
    python bench/real_size.py --layers 24              # the full depth (a step took > 30 s on 2 shared CPU cores)
    python bench/real_size.py --layers 2 --steps 2     # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENT = ROOT / "experiments" / "real_size.yaml"
PRECISIONS = ("fp32", "bf16-autocast")


def shape(layers: int) -> dict:
    """The qwen2.5-0.5b builtin's config fields at ``layers`` layers (the registry's own defaults)."""
    import harness.models.builtin  # noqa: F401  (registers the builtins)
    from harness.core.registry import BUILTIN_MODELS

    return dict(BUILTIN_MODELS.get("qwen2.5-0.5b").defaults, num_hidden_layers=layers)


def parameters(cfg: dict) -> int:
    """Qwen2's parameter count: tied embedding, q/k/v with biases, o without, SwiGLU MLP, two RMSNorms a layer."""
    h, i, v, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h
    return v * h + layers * layer + h


def step_tokens(exp_path: Path, overrides: list[str]) -> tuple[int, int]:
    """``(T, N)``: the tokens and the answer tokens of the ``batch_size`` longest training examples."""
    from harness.config import load_experiment
    from harness.runs.planning.prepare import build_task_data, builtin_tokenizer

    exp = load_experiment(exp_path, overrides)
    data = build_task_data(exp)
    tokenizer = builtin_tokenizer(exp, data)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    sizes = []
    for splits in data.splits.values():
        for ex in splits["train"]:
            full = count(tokenizer.apply_chat_template(ex.messages, tokenize=False))
            prompt = count(tokenizer.apply_chat_template(ex.messages[:-1], tokenize=False, add_generation_prompt=True))
            sizes.append((full, full - prompt))
    longest = sorted(sizes, reverse=True)[: exp.train.batch_size]
    return sum(t for t, _ in longest), sum(n for _, n in longest)


def analytic_bound(cfg: dict, tokens: int, supervised: int, precision: str) -> int:
    """The module docstring's bound, in bytes."""
    p, h, i, v, layers = (
        parameters(cfg),
        cfg["hidden_size"],
        cfg["intermediate_size"],
        cfg["vocab_size"],
        cfg["num_hidden_layers"],
    )
    states = 16 * p
    activations = 4 * tokens * (layers * (8 * h + 4 * i) + 3 * h)
    logits = 4 * 3 * supervised * v
    casts = 2 * p if precision == "bf16-autocast" else 0
    return states + activations + logits + casts


def run_once(layers: int, precision: str, steps: int, out: Path) -> dict:
    """One ``harness run`` in a fresh process: its peak RSS (bytes), exit code, wall time and summary."""
    overrides = [
        f"model.config.num_hidden_layers={layers}",
        f"train.precision={precision}",
        f"stages.0.steps={steps}",
        f"stages.1.steps={steps}",
    ]
    argv = [sys.executable, "-m", "harness", "run", str(EXPERIMENT), "--out", str(out)]
    for o in overrides:
        argv += ["--set", o]
    started = time.perf_counter()
    with open(out.parent / f"{out.name}.log", "w") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    rc = os.waitstatus_to_exitcode(status)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return {"rss": usage.ru_maxrss * 1024, "rc": rc, "wall": wall, "summary": summary, "overrides": overrides}


def tokens_per_s(run_dir: Path) -> float:
    import polars as pl

    frame = pl.read_parquet(run_dir / "metrics.parquet")
    return float(frame.filter((pl.col("metric") == "tokens_per_s") & (pl.col("split") == "train"))["value"].median())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    ap.add_argument("--steps", type=int, default=4, help="steps per stage (2 stages)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    args = ap.parse_args(argv)
    os.environ.setdefault("HARNESS_CACHE", tempfile.mkdtemp(prefix="real-size-cache-"))
    work = args.keep or Path(tempfile.mkdtemp(prefix="real-size-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for layers in args.layers:
        cfg = shape(layers)
        t, n = step_tokens(EXPERIMENT, [f"model.config.num_hidden_layers={layers}"])
        for precision in args.precisions:  # interleaved: both precisions of one depth back to back
            out = work / f"L{layers}-{precision}"
            r = run_once(layers, precision, args.steps, out)
            timing = r["summary"].get("timing", {})
            bound = analytic_bound(cfg, t, n, precision)
            train_s = timing.get("total_s", float("nan")) - timing.get("eval_s", 0.0) - timing.get("base_s", 0.0)
            tps = tokens_per_s(out) if r["rc"] == 0 else float("nan")
            rows.append(
                (layers, precision, r["rc"], parameters(cfg), t, n, r["rss"], bound, tps, train_s / (2 * args.steps),
                 timing.get("eval_share", float("nan")), r["wall"])
            )  # fmt: skip
            print(
                f"done L={layers} {precision}: rc={r['rc']} peak RSS {r['rss'] / 2**30:.2f} GiB "
                f"(bound {bound / 2**30:.2f}) wall {r['wall']:.0f}s",
                file=sys.stderr,
                flush=True,
            )  # each run as it ends, so a bench stopped early keeps what it measured
    print(f"runs in {work}; {args.steps} steps per stage, 2 stages")
    print(
        "| layers | precision | rc | params (M) | step tokens T / supervised N | peak RSS (GiB) | bound (GiB) "
        "| RSS / bound | tokens/s | s/step (train) | eval share | wall (s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    gib = 2**30
    for layers, precision, rc, p, t, n, rss, bound, tps, sps, share, wall in rows:
        print(
            f"| {layers} | {precision} | {rc} | {p / 1e6:.1f} | {t} / {n} | {rss / gib:.2f} | {bound / gib:.2f} "
            f"| {rss / bound:.2f} | {tps:.1f} | {sps:.1f} | {share:.2f} | {wall:.0f} |"
        )
    return 0 if all(r[2] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
