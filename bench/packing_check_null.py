"""The packing check as a detector (docs/packing.md, issues 30 and 38): its false-alarm rate on models where packing
is exact (the null) and its hit rate on models where it is not (planted effects), in fp32 and under bf16 autocast.

Each trial draws a model initialisation and three batches of 16 examples (5–60 words; task a repeats them, task b
always answers "yes"), and checks them packed (example-by-example attention, the default layout; ``--layouts
varlen,masked 4x`` adds masked rows 4× wide) in each precision, in two regimes: ``fresh`` (the random
initialisation) and ``fitted`` (after 200 fp32 AdamW steps on those very batches, so that task b's losses are near
0: the state of a model at a later stage). The null:
qwen2-tiny, llama-tiny, gpt2-tiny, one per trial in turn (exact layouts). The planted effects: qwen3_5-tiny, whose
Gated DeltaNet state and short convolution cross example boundaries (``hybrid``), and gpt2-tiny with its learned
positions looked up by the position in the row instead of the example (``positions``). Alarm rates come with their
trial count and a Wilson 95 % interval; the margin is the largest difference as a fraction of the tolerance (its
largest over the null trials, its smallest over the planted ones). ``--size small`` (the default) runs the test
suite's one- and two-layer configurations (hidden 32), since bf16 autocast is emulated on CPUs without bf16
instructions and a default-size bf16 check takes minutes; ``--size default`` runs the builtins' own sizes::

    python bench/packing_check_null.py                          # small, 20 null / 10 planted trials per regime
    python bench/packing_check_null.py --size default --precisions fp32
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
from harness.data.packed_batches import pack_encoded  # noqa: E402
from harness.models.builtin import build_builtin  # noqa: E402
from harness.models.tokenizer import train_tokenizer  # noqa: E402
from harness.training.loop import batch_loss  # noqa: E402
from harness.training.packing_check import check_packing  # noqa: E402

TASKS = ["a", "b"]
WORDS = "apple river stone cloud amber violet copper lantern meadow harbor quartz ember willow falcon".split()
FIT_STEPS = 200
LAYOUTS = {"varlen": (None, True), "masked 4x": (4, False)}
NULL = ["qwen2-tiny", "llama-tiny", "gpt2-tiny"]
PLANTED = {"hybrid": "qwen3_5-tiny", "positions": "gpt2-tiny"}
_ATTENTION = {"num_attention_heads": 2, "num_key_value_heads": 1}
SMALL = {  # the test suite's configurations (tests/models/test_architectures.py)
    "qwen2-tiny": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, **_ATTENTION},
    "llama-tiny": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, **_ATTENTION},
    "gpt2-tiny": {"hidden_size": 32, "n_inner": 64, "n_layer": 1, "n_head": 2},
    "qwen3_5-tiny": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        **_ATTENTION,
        "head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
    },
}


class RowPositions(torch.nn.Module):
    """The planted position leak: learned positions looked up by the position in the row (the mask, derived from
    the restarting positions the model is given, stays right)."""

    def __init__(self, wpe):
        super().__init__()
        self.wpe = wpe

    def forward(self, position_ids):
        row = torch.arange(position_ids.shape[-1], device=position_ids.device) % self.wpe.num_embeddings
        return self.wpe(row.expand_as(position_ids))


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


def trial(name: str, tok, seed: int, fitted: bool, size: str, precisions, layouts, planted: str = "") -> dict:
    """Each (layout, precision)'s largest difference as a fraction of its tolerance (> 1: an alarm)."""
    rng = np.random.default_rng(seed)
    groups = [encode_examples(tok, examples(rng, 16)) for _ in range(3)]
    model = build_builtin(ModelSpec(builtin=name, config=SMALL[name] if size == "small" else {}), tok, seed=seed)
    padded = [collate(g, tok.pad_token_id) for g in groups]
    if fitted:
        fit(model, padded, FIT_STEPS)
    if planted == "positions":
        model.transformer.wpe = RowPositions(model.transformer.wpe)
    ratios = {}
    for layout in layouts:
        factor, varlen = LAYOUTS[layout]
        packed = [pack_encoded(g, tok.pad_token_id, factor, varlen) for g in groups]
        for precision in precisions:
            check = check_packing(model, padded, packed, LossSpec(), TASKS, precision)
            ratios[layout, precision] = check.max_rel_diff / check.tolerance
    return ratios


def report(label: str, regime: str, results: list[dict], planted: bool) -> None:
    for key in results[0]:
        ratios = [r[key] for r in results]
        k, n = sum(x > 1 for x in ratios), len(ratios)
        _, lo, hi, _ = wilson_interval(k, n)
        margin = min(ratios) if planted else max(ratios)
        print(
            f"{label:<20}{regime:<8}{key[0]:<11}{key[1]:<15}{k:>4}/{n:<3} [{lo:.3f}, {hi:.3f}]  "
            f"{'smallest' if planted else 'largest'} {margin:.3g} (median {np.median(ratios):.3g})",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="null trials per regime (the models in turn)")
    parser.add_argument("--planted-trials", type=int, default=10, help="trials per regime and planted leak")
    parser.add_argument("--size", choices=["small", "default"], default="small")
    parser.add_argument("--precisions", default="fp32,bf16-autocast")
    parser.add_argument("--regimes", default="fresh,fitted")
    parser.add_argument("--layouts", default="varlen", help=f"of {','.join(LAYOUTS)}: varlen is the default layout")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one summation order for every trial; the machine's other core stays free
    rng = np.random.default_rng(0)
    texts = [f"{m['role']}\n{m['content']}" for e in examples(rng, 200) for m in e.messages]
    tok = train_tokenizer(texts, 400, 1)
    precisions, layouts = args.precisions.split(","), args.layouts.split(",")
    print(f"{'model':<20}{'regime':<8}{'layout':<11}{'precision':<15}{'alarms':>8} 95 % interval   diff / tolerance")
    for regime in args.regimes.split(","):
        fitted = regime == "fitted"
        null = [trial(NULL[s % len(NULL)], tok, s, fitted, args.size, precisions, layouts) for s in range(args.trials)]
        report("null (" + ", ".join(m.split("-")[0] for m in NULL) + ")", regime, null, False)
        for leak, name in PLANTED.items():
            hits = [
                trial(name, tok, s, fitted, args.size, precisions, layouts, leak)
                for s in range(1000, 1000 + args.planted_trials)
            ]
            report(f"planted: {leak}", regime, hits, True)


if __name__ == "__main__":
    main()
