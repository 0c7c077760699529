"""Plain loop against the harness on reversed 3-digit addition, from scratch, on the very same data.

What it measures: held-out greedy exact match (the recipe's own ``is_correct``: the number after "A") at the
steps ``--eval-at``, for

- ``plain``: a ~100-line plain-torch loop — char-level tokens, ``prompt + " " + answer + EOS`` with the loss on the
  answer and EOS only, a ``Qwen2ForCausalLM`` built from a config (untied embeddings, as many KV heads as heads),
  random batches (a fresh shuffle of the pool per pass), right-padded, AdamW on every parameter, linear warmup
  then cosine to 0, gradient clipping at 1.0, token-mean cross-entropy;
- ``harness``: ``harness.runs.execution.runner.run_experiment`` on a dict experiment (``builtin: qwen2-tiny`` with
  the same shape, no pretraining, recipe ``math_reversed`` digits 3, the same optimiser and schedule numbers), at the
  harness's defaults for everything else.

Both read the items of ``harness.runs.planning.prepare.build_task_data`` for one experiment: the same training pool and
the same held-out operand pairs (neither order trained). One factor at a time is flipped with ``ARM+flip[+flip…]``:

  harness+nogroup   train.length_grouping: 1 (random batches: the default since this diagnosis)
  harness+grouped   train.length_grouping: 50 (windows of 50 batches sorted by length: the default before it)
  harness+plaininit model.config: untied embeddings, num_key_value_heads = heads (the plain loop's model)
  harness+floor0    optim.min_lr_ratio: 0 (the plain loop's cosine ends at 0; the default floor is 0.1)
  harness+noclip    optim.grad_clip: null
  harness+wdall     weight decay on every parameter, norms and biases too (as the plain loop)
  harness+bare      the chat template replaced by ``prompt + " " + answer + <|im_end|>`` (no ChatML wrapper)
  harness+perex     per-example loss normalisation (`loss: {reduction: example}`: each example's token mean, then
                    the batch's)
  plain+grouped     the plain loop's batches length-grouped as the harness groups them (window 50)
  plain+chat        the plain loop on the harness's encoding (its BPE tokenizer and ChatML template)
  plain+tied        the plain loop's model with the harness's shape (tied embeddings, 2 KV heads)
  plain+floor       the plain loop's cosine ending at 0.1 × lr, as the harness's default

Run from the repository root::

    python bench/plain_vs_harness.py                                   # plain vs harness, 900 steps (~15 min idle)
    python bench/plain_vs_harness.py --arms harness+nogroup --steps 600 --eval-at 300,600
    python bench/plain_vs_harness.py --micro                           # seconds: the test suite runs this

Each arm prints one line per evaluation step: accuracy, correct / n and the 95 % Wilson interval; ``--json``
writes them all. Arms run one after another in this process; start several processes to use more cores.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.core.stats import wilson_interval  # noqa: E402  (after the repository root is on the path)

TASK = "math"
HARNESS_FLIPS = {"nogroup", "grouped", "plaininit", "floor0", "noclip", "wdall", "bare", "perex"}
PLAIN_FLIPS = {"grouped", "chat", "tied", "floor"}
BARE_TEMPLATE = (  # prefix-consistent, as harness.data.batches's label masking requires
    "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ m['content'] + '<|im_end|>' }}"
    "{% else %}{{ m['content'] + ' ' }}{% endif %}{% endfor %}"
)


@dataclass
class Setup:
    """Everything both arms share: sizes, shape, optimiser numbers, data."""

    steps: int = 900
    eval_at: list[int] = field(default_factory=lambda: [540, 900])
    train_examples: int = 10_000
    heldout: int = 500
    digits: int = 3
    batch_size: int = 128
    seed: int = 0
    shape: dict[str, int] = field(
        default_factory=lambda: dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512)
    )
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.1
    warmup: int = 100
    people: int = 200  # the world only shapes the harness's BPE tokenizer here
    vocab_size: int = 2048


MICRO = dict(
    steps=30,
    eval_at=[15, 30],
    train_examples=600,
    heldout=40,
    digits=2,
    batch_size=32,
    warmup=5,
    shape=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64),
    people=20,
    vocab_size=400,
)


# ----------------------------------------------------------------------------------------------------------------
# Shared pieces
# ----------------------------------------------------------------------------------------------------------------


def wilson(k: int, n: int) -> tuple[float, float]:
    """The 95 % Wilson score interval of k successes in n (:func:`harness.core.stats.wilson_interval`)."""
    if n == 0:
        return 0.0, 1.0
    ci = wilson_interval(k, n)
    return ci.low, ci.high


def experiment_dict(s: Setup, flips: set[str]) -> dict[str, Any]:
    """The harness experiment for ``s`` with the harness-side ``flips`` applied."""
    config = dict(s.shape)
    if "plaininit" in flips:
        config.update(tie_word_embeddings=False, num_key_value_heads=s.shape["num_attention_heads"])
    optim = {
        "lr": s.lr,
        "betas": list(s.betas),
        "weight_decay": s.weight_decay,
        "warmup": s.warmup,
        "schedule": "cosine",
    }
    if "floor0" in flips:
        optim["min_lr_ratio"] = 0.0
    if "noclip" in flips:
        optim["grad_clip"] = None
    every = math.gcd(*s.eval_at)
    return {
        "name": "plain_vs_harness",
        "seed": s.seed,
        "world": {"people": s.people, "seed": 0},
        "model": {"builtin": "qwen2-tiny", "config": config, "tokenizer": {"vocab_size": s.vocab_size}},
        "tasks": {
            TASK: {
                "recipe": "math_reversed",
                "train": s.train_examples,
                "eval": s.heldout,
                "params": {"digits": s.digits},
            }
        },
        "train": {
            "batch_size": s.batch_size,
            "optim": optim,
            "checkpoint": False,
            "log_every": 50,
            **({"length_grouping": 1} if "nogroup" in flips else {}),
            **({"length_grouping": 50} if "grouped" in flips else {}),
            **({"loss": {"reduction": "example"}} if "perex" in flips else {}),
        },
        "eval": {
            "every": every,
            "splits": ["heldout"],
            "evaluators": ["greedy"],
            "probes": [],
            "max_new_tokens": 32,
            "batch_size": 250,
        },
        "stages": [{"name": "sft", "steps": s.steps, "mixture": {TASK: 1.0}}],
        "tracking": {"wandb": {"mode": "disabled"}, "console": False},
    }


def report(arm: str, step: int, correct: int, n: int, seconds: float) -> dict[str, Any]:
    lo, hi = wilson(correct, n)
    print(
        f"{arm:<22} step {step:>5}  heldout greedy {correct / n:.3f}  ({correct}/{n}, 95% [{lo:.3f}, {hi:.3f}])"
        f"  {seconds:6.0f}s",
        flush=True,
    )
    return {
        "arm": arm,
        "step": step,
        "acc": correct / n,
        "correct": correct,
        "n": n,
        "lo": lo,
        "hi": hi,
        "seconds": seconds,
    }


# ----------------------------------------------------------------------------------------------------------------
# The harness arm
# ----------------------------------------------------------------------------------------------------------------


class _Patches:
    """Monkeypatches for the flips that no config field reaches (undone on exit)."""

    def __init__(self, flips: set[str]):
        self.flips, self.undo = flips, []

    def _set(self, module, name: str, value) -> None:
        self.undo.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    def __enter__(self):
        import harness.models.tokenizer as tokenizer
        import harness.training.loop as train
        import harness.training.losses as losses

        if "bare" in self.flips:
            self._set(tokenizer, "CHAT_TEMPLATE", BARE_TEMPLATE)
        if "wdall" in self.flips:
            self._set(train, "make_optimizer", _decay_everything(train.make_optimizer))
        del losses
        return self

    def __exit__(self, *exc):
        for module, name, value in reversed(self.undo):
            setattr(module, name, value)


def _decay_everything(make_optimizer: Callable) -> Callable:
    def make(model, spec, total_steps):
        optimizer, scheduler = make_optimizer(model, spec, total_steps)
        for group in optimizer.param_groups:
            group["weight_decay"] = spec.weight_decay
        return optimizer, scheduler

    return make


def run_harness(s: Setup, flips: set[str], arm: str) -> list[dict[str, Any]]:
    from harness.config import validate_data
    from harness.runs.execution.runner import run_experiment

    exp = validate_data(experiment_dict(s, flips), arm)
    results, started = [], time.perf_counter()

    def on_evaluation(stage: str, step: int, rows) -> None:
        for r in rows:
            if step in s.eval_at and r.task == TASK and r.split == "heldout" and r.metric == "greedy":
                results.append(report(arm, step, round(r.value * s.heldout), s.heldout, time.perf_counter() - started))

    with _Patches(flips), tempfile.TemporaryDirectory(prefix="pvh-") as tmp:
        run_experiment(exp, Path(tmp) / "run", on_evaluation=on_evaluation)
    return results


# ----------------------------------------------------------------------------------------------------------------
# The plain arm
# ----------------------------------------------------------------------------------------------------------------


class CharVocab:
    """Char-level tokens: one id per character seen, plus pad and end-of-sequence."""

    def __init__(self, texts: list[str]):
        self.chars = ["<pad>", "<eos>"] + sorted({c for t in texts for c in t})
        self.index = {c: i for i, c in enumerate(self.chars)}
        self.pad_token_id, self.eos_token_id = 0, 1

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        return [self.index[c] for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids if i > 1)


def plain_encoding(data, flips: set[str], s: Setup):
    """``(train [Encoded], heldout prompts [ids], heldout golds [str], vocab)``: char-level, or with ``chat`` the
    harness's own tokenizer and chat encoding."""
    import numpy as np

    from harness.data.encoding import IGNORE_INDEX, Encoded, encode_examples, eval_items

    train, heldout = data.splits[TASK]["train"], data.splits[TASK]["heldout"]
    if "chat" in flips:
        from harness.models.tokenizer import train_tokenizer
        from harness.runs.planning.pretrain import tokenizer_texts

        tok = train_tokenizer(tokenizer_texts(data.corpus, train), s.vocab_size)
        items = eval_items(tok, heldout, "heldout")
        return encode_examples(tok, train), [it.prompt_ids for it in items], [it.gold_text for it in items], tok
    vocab = CharVocab([ex.prompt + " " + ex.answer for ex in train + heldout])
    encoded = []
    for ex in train:
        prompt, answer = vocab.encode(ex.prompt + " "), vocab.encode(ex.answer) + [vocab.eos_token_id]
        ids = np.asarray(prompt + answer, dtype=np.int64)
        labels = np.asarray([IGNORE_INDEX] * (len(prompt) - 1) + answer + [IGNORE_INDEX], dtype=np.int64)
        encoded.append(Encoded(TASK, ids, labels))  # labels shifted: position t predicts token t+1
    prompts = [vocab.encode(ex.prompt + " ") for ex in heldout]
    return encoded, prompts, [ex.answer for ex in heldout], vocab


def plain_batches(encoded: list, s: Setup, flips: set[str], pad_id: int) -> list:
    """``s.steps`` batches: the pool reshuffled at each pass, cut in order (or length-grouped with ``grouped``)."""
    import numpy as np

    from harness.data.batches import collate, length_grouped_batches

    rng = np.random.default_rng(s.seed)
    stream: list = []
    while len(stream) < s.steps * s.batch_size:
        stream.extend(encoded[i] for i in rng.permutation(len(encoded)))
    stream = stream[: s.steps * s.batch_size]
    if "grouped" in flips:
        groups = length_grouped_batches(stream, s.batch_size, 50, rng)
    else:
        groups = [stream[i : i + s.batch_size] for i in range(0, len(stream), s.batch_size)]
    return [collate(g, pad_id) for g in groups]


def plain_model(s: Setup, vocab, flips: set[str]):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    heads = s.shape["num_attention_heads"]
    config = Qwen2Config(
        **s.shape,
        vocab_size=len(vocab),
        num_key_value_heads=2 if "tied" in flips else heads,
        tie_word_embeddings="tied" in flips,
        max_position_embeddings=512,
        rope_theta=10000.0,
        pad_token_id=vocab.pad_token_id,
        eos_token_id=vocab.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(s.seed)
    return Qwen2ForCausalLM(config)


def plain_accuracy(model, vocab, prompts: list, golds: list, recipe) -> int:
    """Correct greedy answers on the held-out prompts (batched, KV cache: harness.evaluation's decoder)."""
    import torch

    from harness.evaluation.passes import greedy_decode

    decode = vocab.decode if isinstance(vocab, CharVocab) else (lambda ids: vocab.decode(ids, skip_special_tokens=True))
    model.eval()
    correct = 0
    with torch.no_grad():
        for start in range(0, len(prompts), 250):
            outs, _ = greedy_decode(
                model,
                prompts[start : start + 250],
                max_new_tokens=32,
                eos_token_id=vocab.eos_token_id,
                pad_token_id=vocab.pad_token_id,
            )
            for out, gold in zip(outs, golds[start : start + 250]):
                correct += bool(recipe.is_correct(decode(out).strip(), gold))
    model.train()
    return correct


def lr_factor(s: Setup, floor: float) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < s.warmup:
            return (step + 1) / s.warmup
        progress = (step - s.warmup) / max(1, s.steps - s.warmup)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def run_plain(s: Setup, flips: set[str], arm: str) -> list[dict[str, Any]]:
    """The plain loop: forward, token-mean CE on the supervised positions, backward, clip, AdamW, schedule."""
    import torch
    import torch.nn.functional as F

    from harness.config import validate_data
    from harness.runs.planning.prepare import build_task_data

    started = time.perf_counter()
    data = build_task_data(validate_data(experiment_dict(s, set()), arm))
    encoded, prompts, golds, vocab = plain_encoding(data, flips, s)
    batches = plain_batches(encoded, s, flips, vocab.pad_token_id)
    model = plain_model(s, vocab, flips)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, betas=s.betas, weight_decay=s.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(s, 0.1 if "floor" in flips else 0.0))
    results = []
    model.train()
    for step, batch in enumerate(batches, start=1):
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        if step in s.eval_at:
            correct = plain_accuracy(model, vocab, prompts, golds, data.recipes[TASK])
            results.append(report(arm, step, correct, len(prompts), time.perf_counter() - started))
    return results


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------


def parse_arm(arm: str) -> tuple[str, set[str]]:
    engine, *flips = arm.split("+")
    allowed = {"plain": PLAIN_FLIPS, "harness": HARNESS_FLIPS}.get(engine)
    if allowed is None:
        raise SystemExit(f"unknown arm {arm!r}: start with plain or harness")
    unknown = set(flips) - allowed
    if unknown:
        raise SystemExit(
            f"{arm}: unknown flip(s) {', '.join(sorted(unknown))}; {engine} knows " + ", ".join(sorted(allowed))
        )
    return engine, set(flips)


def setup_from(args: argparse.Namespace) -> Setup:
    s = Setup(**MICRO) if args.micro else Setup()
    for name in ("steps", "train_examples", "heldout", "seed"):
        if getattr(args, name) is not None:
            setattr(s, name, getattr(args, name))
    if args.eval_at:
        s.eval_at = sorted(int(x) for x in args.eval_at.split(","))
    elif args.steps is not None:
        s.eval_at = [s.steps]
    if max(s.eval_at) > s.steps:
        raise SystemExit(f"--eval-at {max(s.eval_at)} is past --steps {s.steps}")
    return s


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", default="plain,harness", help="comma-separated ARM[+flip…] (see the docstring)")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--eval-at", help="comma-separated steps (default 540,900; --micro 15,30)")
    parser.add_argument("--train-examples", type=int)
    parser.add_argument("--heldout", type=int, help="held-out items (operand pairs never trained)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--micro", action="store_true", help="tiny model, 2 digits, 30 steps: seconds")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    s = setup_from(args)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    results = []
    for arm in args.arms.split(","):
        engine, flips = parse_arm(arm)
        results += (run_plain if engine == "plain" else run_harness)(s, flips, arm)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
