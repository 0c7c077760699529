"""The packed layouts' forward + backward side by side on one step's examples (docs/packing.md, issue 30): padded,
transformers' block-diagonal mask over rows of k × the longest example, and example-by-example attention
(:mod:`harness.models.packed_attention`) with blocks cut at several per-block overheads — the measurement behind
``harness.data.segments.BLOCK_OVERHEAD_PAIRS`` (the blocks are planned when a batch is packed, outside the timed
steps).

One step of ``--batch`` examples of 15-81 tokens (uniform, the span of ``bench/train_speed.py``'s data), the
builtin qwen2-tiny shape (hidden 128, 4 layers, 4 heads, 2 key-value heads), fp32, the training forward of the harness
(:func:`harness.training.forward.supervised_logits`: the head at the supervised positions only, half of each
example supervised), CE summed and back-propagated. Layouts are timed interleaved, ``--reps`` rounds of
``--steps`` steps each, and the table gives the median ms/step and the ratio to the padded layout::

    python bench/packed_attention.py                  # ~2 minutes on 2 cores
    python bench/packed_attention.py --threads 1 --batch 64
    python bench/packed_attention.py --batch 16 --lengths 64,512   # longer examples: attention's share grows
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from harness.data import segments  # noqa: E402
from harness.data.batches import collate  # noqa: E402
from harness.data.encoding import IGNORE_INDEX, Encoded  # noqa: E402
from harness.data.packed_batches import pack_encoded  # noqa: E402
from harness.training.forward import supervised_logits  # noqa: E402

VOCAB = 2048


def examples(batch: int, seed: int, lengths: tuple[int, int] = (15, 81)) -> list[Encoded]:
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(batch):
        n = int(rng.integers(lengths[0], lengths[1] + 1))
        ids = rng.integers(0, VOCAB, n)
        labels = np.concatenate([np.full(n // 2, IGNORE_INDEX), ids[n // 2 + 1 :], [IGNORE_INDEX]])
        out.append(Encoded("t", ids, labels))
    return out


def model():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "qwen2",
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def step(net, batch) -> None:
    logits = supervised_logits(
        net,
        batch.input_ids,
        batch.attention_mask,
        batch.supervised,
        False,
        batch.position_ids,
        batch.segments,
    )
    torch.nn.functional.cross_entropy(logits, batch.labels.flatten()[batch.supervised]).backward()
    net.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="steps (different examples) per round")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--lengths", default="15,81", help="shortest,longest example (uniform between)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    net = model()
    lengths = tuple(int(x) for x in args.lengths.split(","))
    steps = [examples(args.batch, seed, lengths) for seed in range(args.steps)]
    layouts = {
        "padded": [collate(s, 0) for s in steps],
        "masked rows 1x": [pack_encoded(s, 0, 1) for s in steps],
        "masked rows 2x": [pack_encoded(s, 0, 2) for s in steps],
        "masked rows 4x": [pack_encoded(s, 0, 4) for s in steps],
        "masked one row": [pack_encoded(s, 0, None) for s in steps],
    }
    default = segments.BLOCK_OVERHEAD_PAIRS
    for overhead in (0, 1024, 4096, 16384, 65536, 10**12):
        label = "one block" if overhead == 10**12 else f"overhead {overhead}"
        segments.BLOCK_OVERHEAD_PAIRS = overhead  # read when a batch is packed: its blocks are planned then
        layouts[f"varlen, {label}"] = [pack_encoded(s, 0, None, True) for s in steps]
    segments.BLOCK_OVERHEAD_PAIRS = default
    times: dict[str, list[float]] = {name: [] for name in layouts}
    for batches in layouts.values():  # warm up
        step(net, batches[0])
    for _ in range(args.reps):
        for name, batches in layouts.items():
            started = time.perf_counter()
            for batch in batches:
                step(net, batch)
            times[name].append((time.perf_counter() - started) / len(batches) * 1000)
    base = statistics.median(times["padded"])
    print(
        f"batch {args.batch}, lengths {lengths[0]}-{lengths[1]}, {args.steps} steps x {args.reps} rounds, "
        f"threads {torch.get_num_threads()}"
    )
    print(f"{'layout':<28}{'ms/step':>9}{'min':>8}{'max':>8}{'vs padded':>11}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<28}{median:>9.1f}{min(values):>8.1f}{max(values):>8.1f}{base / median:>10.2f}x")


if __name__ == "__main__":
    main()
