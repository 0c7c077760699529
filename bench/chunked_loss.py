"""The chunked loss (``train.loss_chunking``) beside the unchunked path and TRL's ``SFTTrainer``, on Qwen2.5-0.5B's
shape (151,936-row vocabulary, hidden 896, random weights built from a local ``Qwen2Config``: nothing downloaded),
``--layers`` layers, sequences of ``--seq`` tokens whose last ~75 % is the answer, ``--tokens`` tokens per step
(``tokens // seq`` sequences of one length: no padding). Each configuration runs in a fresh subprocess, one after
another, so that its peak RSS (``ru_maxrss`` of that child, from ``os.wait4``) is its own. Per configuration:

- **peak RSS** of the child (the interpreter and its libraries included);
- **bound**: ``bench/real_size.py``'s analytic bound (weights, gradients, AdamW's moments, activations, logits) with
  the logits term ``4·3·N·V`` as today (all N supervised rows) and as one chunk (``N`` → the chunk's rows);
- **tokens/s**: real tokens over the median of ``--steps`` steps' times (the first, which allocates, is the
  outlier a median of 3 leaves out).

harness paths: the training loop itself (:func:`harness.training.loop.train_stage`, fp32, eager, AdamW) with
``train.loss_chunking`` true and false. TRL: ``SFTTrainer`` on the same token ids as a tokenised prompt-completion
dataset (``completion_only_loss``), with its fused LM head (TRL ≥ 1.15 computes the per-token log-probabilities in
tiles, always on) and ``padding_free`` (its most memory-saving settings that run on a CPU), eager, AdamW.

Run from the repository root (TRL installed)::

    OMP_NUM_THREADS=2 python bench/chunked_loss.py                     # 512 and 2,048-token sequences
    OMP_NUM_THREADS=2 python bench/chunked_loss.py --seq 512 2048 4096
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.real_size import analytic_bound, shape  # noqa: E402

PATHS = ("harness-chunked", "harness-unchunked", "trl")
ANSWER_SHARE = 0.75


def _model(layers: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = shape(layers)
    torch.manual_seed(0)
    config = Qwen2Config(**cfg, pad_token_id=0)  # tied, as Qwen2.5-0.5B
    return Qwen2ForCausalLM(config), cfg


def _sequences(seq: int, rows: int, steps: int, vocab: int):
    """``(input_ids, labels)`` per example (labels pre-shifted, supervised on the last ~75 %)."""
    import numpy as np

    rng = np.random.default_rng(0)
    answer = int(seq * ANSWER_SHARE)
    out = []
    for _ in range(rows * steps):
        ids = rng.integers(1, vocab, size=seq).astype(np.int64)
        labels = np.full(seq, -100, dtype=np.int64)
        labels[seq - answer - 1 : seq - 1] = ids[seq - answer :]
        out.append((ids, labels))
    return out


def _harness(args, chunking: bool) -> list[float]:
    from harness.data.batches import collate
    from harness.data.encoding import Encoded
    from harness.training.loop import StageLoop, train_stage

    model, cfg = _model(args.layers)
    rows = args.tokens // args.seq
    examples = [Encoded("t", ids, labels) for ids, labels in _sequences(args.seq, rows, args.steps, cfg["vocab_size"])]
    batches = [collate(examples[i : i + rows], pad_id=0) for i in range(0, len(examples), rows)]
    seconds: list[float] = []

    def log(rows_, step):
        seconds.extend(args.tokens / r.value for r in rows_ if r.metric == "tokens_per_s")
        print(f"step {step}: {seconds[-1]:.1f} s", flush=True)

    loop = StageLoop("s", 0, ["t"], log, lambda step: None, log_every=1, diagnostics=False, loss_chunking=chunking)
    train_stage(model, batches, loop)
    return seconds


def _trl(args) -> list[float]:
    import torch
    from datasets import Dataset
    from transformers import PreTrainedTokenizerFast, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    model, cfg = _model(args.layers)
    rows = args.tokens // args.seq
    answer = int(args.seq * ANSWER_SHARE)
    data = [
        {"input_ids": ids.tolist(), "completion_mask": [0] * (args.seq - answer) + [1] * answer}
        for ids, _ in _sequences(args.seq, rows, args.steps, cfg["vocab_size"])
    ]
    from tokenizers import Tokenizer, models

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<pad>": 0}, unk_token="<pad>")))
    tokenizer.pad_token, tokenizer.eos_token = "<pad>", "<pad>"
    seconds: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.started = time.perf_counter()

        def on_step_end(self, *a, **k):
            seconds.append(time.perf_counter() - self.started)
            print(f"step {len(seconds)}: {seconds[-1]:.1f} s", flush=True)

    config = SFTConfig(
        output_dir=str(args.out / "trl"),
        per_device_train_batch_size=rows,
        max_steps=args.steps,
        max_length=None,  # padding_free without packing does not truncate; the sequences are seq long already
        padding_free=True,
        completion_only_loss=True,
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        gradient_accumulation_steps=1,
        bf16=False,
    )
    torch.manual_seed(0)
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=Dataset.from_list(data), processing_class=tokenizer, callbacks=[Timer()]
    )
    trainer.train()
    return seconds


def _child(args) -> int:
    seconds = _trl(args) if args.path == "trl" else _harness(args, args.path == "harness-chunked")
    print("RESULT " + json.dumps({"seconds": seconds}), flush=True)
    return 0


def _run(args, path: str, seq: int) -> dict:
    argv = [sys.executable, __file__, "--child", path, "--seq", str(seq), "--tokens", str(args.tokens)]
    argv += ["--layers", str(args.layers), "--steps", str(args.steps), "--out", str(args.out)]
    started = time.perf_counter()
    log_path = args.out / f"{path}-{seq}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    rc = os.waitstatus_to_exitcode(status)
    seconds = []
    for line in log_path.read_text().splitlines():
        if line.startswith("RESULT "):
            seconds = json.loads(line[len("RESULT ") :])["seconds"]
    # The median of every step's time: the first step's one-off allocation is the outlier the median leaves out.
    tps = args.tokens / statistics.median(seconds) if seconds else float("nan")
    return {"path": path, "seq": seq, "rc": rc, "rss": usage.ru_maxrss * 1024, "tps": tps, "seconds": seconds,
            "wall": time.perf_counter() - started}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from harness.training.chunked_loss import Chunking

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, nargs="+", default=[512, 2048])
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per step (every configuration)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="steps per configuration (tokens/s: their median)")
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    ap.add_argument("--out", type=Path, default=Path("/tmp/chunked-loss-bench"))
    ap.add_argument("--child", choices=PATHS, dest="path")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.path:
        args.seq = args.seq[0]
        return _child(args)
    cfg = shape(args.layers)
    gib = 2**30
    results = []
    for seq in args.seq:
        for path in args.paths:
            r = _run(args, path, seq)
            results.append(r)
            print(f"done {path} seq={seq}: rc={r['rc']} rss {r['rss'] / gib:.2f} GiB tokens/s {r['tps']:.0f} "
                  f"wall {r['wall']:.0f}s", file=sys.stderr, flush=True)  # fmt: skip
    n = int(args.tokens // max(args.seq) * max(args.seq) * ANSWER_SHARE)
    print(f"{args.layers} layers, {args.tokens} tokens per step, median of {args.steps} steps; "
          f"torch threads {os.environ.get('OMP_NUM_THREADS', 'default')}")  # fmt: skip
    print("| seq | path | rc | peak RSS (GiB) | bound, logits as today (GiB) | bound, one chunk (GiB) | RSS / bound "
          "(one chunk) | tokens/s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        rows = args.tokens // r["seq"]
        n = rows * int(r["seq"] * ANSWER_SHARE)
        chunk = Chunking(True).rows(cfg["vocab_size"])
        today = analytic_bound(cfg, args.tokens, n, "fp32")
        one_chunk = analytic_bound(cfg, args.tokens, min(chunk, n), "fp32")
        print(f"| {r['seq']} | {r['path']} | {r['rc']} | {r['rss'] / gib:.2f} | {today / gib:.2f} | "
              f"{one_chunk / gib:.2f} | {r['rss'] / one_chunk:.2f} | {r['tps']:.0f} |")  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
