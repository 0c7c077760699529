"""The packing check as a detector (docs/packing.md, issue 30): its false-alarm rate on models where packing is
exact (the null) and its hit rate on one where it is not (the planted effect), at the builtin models' default sizes.

Each trial draws a model initialisation and three batches of 16 examples (5–60 words; task a repeats them, task b
always answers "yes"), and checks them in both packed layouts (example-by-example attention and masked rows 4× wide)
in two regimes: ``fresh`` (the random initialisation) and ``fitted`` (after 200 AdamW steps on those very batches,
so that task b's losses are near 0 — the regime of the one false alarm seen in the steering study). Each check is
made twice: with the check's loss comparison (each difference against max(|loss|, the batch's mean |loss|)) and with
the element-wise one it replaced. The null: qwen2-tiny, llama-tiny, gpt2-tiny at their default sizes (exact
layouts). The planted effect: qwen3_5-tiny, whose Gated DeltaNet state crosses example boundaries. Alarm rates come
with their trial count and a Wilson 95 % interval, and the largest difference as a fraction of the tolerance shows
the margin::

    python bench/packing_check_null.py                  # ~25 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from harness.config import LossSpec, ModelSpec  # noqa: E402
from harness.core.stats import wilson_interval  # noqa: E402
from harness.data.batches import collate  # noqa: E402
from harness.data.encoding import encode_examples  # noqa: E402
from harness.data.packing import pack_encoded  # noqa: E402
from harness.models.builtin import build_builtin  # noqa: E402
from harness.models.tokenizer import train_tokenizer  # noqa: E402
from harness.training.loop import batch_loss  # noqa: E402
from harness.training.packing import check_packing, relative_loss_diff  # noqa: E402

TASKS = ["a", "b"]
WORDS = "apple river stone cloud amber violet copper lantern meadow harbor quartz ember willow falcon".split()
FIT_STEPS = 200
LAYOUTS = {"varlen": (None, True), "masked 4x": (4, False)}


def examples(rng: np.random.Generator, n: int) -> list[SimpleNamespace]:
    out = []
    for i in range(n):
        words = " ".join(rng.choice(WORDS, int(rng.integers(5, 61))))
        answer = words if i % 2 == 0 else "yes"  # task b: one constant answer, soon fitted (loss near 0)
        out.append(
            SimpleNamespace(
                task=TASKS[i % 2],
                messages=[
                    {"role": "user", "content": f"{'Repeat' if i % 2 == 0 else 'Agree'}: {words}"},
                    {"role": "assistant", "content": answer},
                ],
            )
        )
    return out


def fit(model, batches, steps: int) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = {t: i for i, t in enumerate(TASKS)}
    model.train()
    for step in range(steps):
        batch = batches[step % len(batches)]
        loss, _, _ = batch_loss(model, batch, LossSpec(), torch.tensor([ids[t] for t in batch.tasks]), TASKS, "fp32")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _elementwise(a: torch.Tensor, b: torch.Tensor) -> float:
    """The check's loss comparison before 2026-12-03: each example's difference against its own loss alone."""
    return float(((a - b).abs() / b.abs().clamp_min(1e-30)).max()) if a.numel() else 0.0


COMPARISONS = {"this check": relative_loss_diff, "element-wise (before)": _elementwise}


def trial(name: str, tok, seed: int, fitted: bool) -> dict[tuple[str, str], float]:
    """Each (layout, comparison)'s largest difference as a fraction of its tolerance (> 1: an alarm)."""
    rng = np.random.default_rng(seed)
    groups = [encode_examples(tok, examples(rng, 16)) for _ in range(3)]
    model = build_builtin(ModelSpec(builtin=name), tok, seed=seed)
    padded = [collate(g, tok.pad_token_id) for g in groups]
    if fitted:
        fit(model, padded, FIT_STEPS)
    ratios = {}
    for layout, (factor, varlen) in LAYOUTS.items():
        packed = [pack_encoded(g, tok.pad_token_id, factor, varlen) for g in groups]
        for comparison, rel in COMPARISONS.items():
            check = check_packing(model, padded, packed, LossSpec(), TASKS, compare=rel)
            ratios[layout, comparison] = check.max_rel_diff / check.tolerance
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10, help="trials per null model and regime")
    parser.add_argument("--planted-trials", type=int, default=4, help="trials per regime on the leaking model")
    parser.add_argument("--models", default="qwen2-tiny,llama-tiny,gpt2-tiny")
    parser.add_argument("--planted", default="qwen3_5-tiny")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    texts = [f"{m['role']}\n{m['content']}" for e in examples(rng, 200) for m in e.messages]
    tok = train_tokenizer(texts, 400, 1)
    print(
        f"{'model':<14}{'regime':<8}{'layout':<11}{'comparison':<23}{'alarms':>8}  95 % interval    "
        f"largest diff / tolerance"
    )
    runs = [(name, args.trials) for name in args.models.split(",")] + [(args.planted, args.planted_trials)]
    for name, trials in runs:
        for fitted in (False, True):
            results = [trial(name, tok, seed, fitted) for seed in range(trials)]
            for key in results[0]:
                ratios = [r[key] for r in results]
                k = sum(x > 1 for x in ratios)
                _, lo, hi, _ = wilson_interval(k, trials)
                print(
                    f"{name:<14}{'fitted' if fitted else 'fresh':<8}{key[0]:<11}{key[1]:<23}{k:>4}/{trials:<3}"
                    f"  [{lo:.3f}, {hi:.3f}]  {max(ratios):.3g} (median {np.median(ratios):.3g})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
