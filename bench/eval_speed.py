"""Evaluation speed, side by side on the same prompts and model.

1. Greedy decoding: the harness's ``greedy`` evaluator (``run_evaluation``) against ``model.generate`` on the same
   left-padded batches, and against ``model.generate`` one prompt at a time. Outputs must be identical.
   Goals: ≥ 1× batched generate, ≥ 8× one at a time.
2. The ``first_token`` probe (``run_evaluation`` with only the probe) against one bare forward over the same
   prompt batches. Goal: ratio ≤ 1.2.

Repetitions are interleaved (A B C A B C …) and medians reported. Run from the repository root:
``python bench/eval_speed.py [--prompts 256] [--batch-size 64] [--max-new-tokens 16] [--reps 3]``.
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

from harness.config import EvalSpec, ModelSpec  # noqa: E402
from harness.evaluation import run_evaluation  # noqa: E402
from harness.evaluation.passes import greedy_decode, left_pad  # noqa: E402
from harness.models.builtin import build_builtin  # noqa: E402
from harness.models.tokenizer import train_tokenizer  # noqa: E402

TASKS = ["repeat", "identity", "yesno", "assistant_qa", "short_qa", "math_reversed", "spell", "count"]


def real_examples(n: int, seed: int = 0):
    """``(examples by split, recipes, tokenizer texts)`` from the real recipes (all tasks, both eval splits), or
    None if data_recipes is not importable."""
    try:
        import data_recipes
    except Exception as e:  # noqa: BLE001 - the bench falls back to synthetic prompts
        print(f"data_recipes not importable ({e}); using synthetic prompts")
        return None
    world = data_recipes.build_world(200, seed)
    per_task = -(-n // len(TASKS))
    by_split: dict[str, list] = {"heldout": [], "heldout_template": []}
    recipes = {}
    for name in TASKS:
        cls = data_recipes.get_recipe(name)
        recipe = cls(world=world) if cls.needs_world else cls()
        recipes[name] = recipe
        splits = recipe.build(name, per_task, per_task, seed)
        for split in by_split:
            by_split[split] += splits[split]
    texts = data_recipes.corpus(world, seed) + [
        m["content"] for exs in by_split.values() for ex in exs for m in ex.messages
    ]
    return by_split, recipes, texts


def synthetic_examples(n: int, seed: int = 0):
    import random

    from data_recipes.base import Example, Recipe

    class Exact(Recipe):
        name = "synthetic"

        def build(self, task, n_train, n_eval, seed):  # pragma: no cover
            raise NotImplementedError

    rng = random.Random(seed)
    words = "the cat sat on a red mat while sun and moon were cold or hot yes no maybe".split()
    examples = [
        Example.single(
            "synthetic", " ".join(rng.choice(words) for _ in range(rng.randint(2, 40))), rng.choice(["yes", "no"])
        )
        for _ in range(n)
    ]
    return {"heldout": examples}, {"synthetic": Exact()}, [ex.prompt for ex in examples] * 4


def interleave(lists: list[list]) -> list:
    """Round-robin over the lists (so any prefix mixes tasks and splits)."""
    out = []
    for i in range(max(len(x) for x in lists)):
        out += [x[i] for x in lists if i < len(x)]
    return out


def timed(fn):
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    return parser.parse_args()


def prompts_and_model(args):
    """``(items, recipes, tokenizer, model)``: ``--prompts`` eval items mixing tasks and splits, a tokenizer trained
    on their texts, and a fresh qwen2-tiny; prints what they are."""
    from harness.data.encoding import eval_items

    by_split, recipes, texts = real_examples(args.prompts) or synthetic_examples(args.prompts)
    tokenizer = train_tokenizer(texts, vocab_size=args.vocab_size)
    groups = []
    for split, examples in by_split.items():
        items_split = eval_items(tokenizer, examples, split)
        for task in dict.fromkeys(it.task for it in items_split):
            groups.append([it for it in items_split if it.task == task])
    items = interleave(groups)[: args.prompts]
    model = build_builtin(ModelSpec(builtin="qwen2-tiny"), tokenizer, seed=0).to(args.device).eval()
    lengths = sorted(len(it.prompt_ids) for it in items)
    print(
        f"{len(items)} prompts from {len({it.task for it in items})} task(s) × "
        f"{len({it.split for it in items})} split(s), prompt tokens "
        f"min {lengths[0]} / median {lengths[len(lengths) // 2]} / max {lengths[-1]}; qwen2-tiny "
        f"({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, vocab {len(tokenizer)}), "
        f"batch {args.batch_size}, max_new_tokens {args.max_new_tokens}, device {args.device}, "
        f"torch threads {torch.get_num_threads()}"
    )
    return items, recipes, tokenizer, model


def timed_methods(args, items, recipes, tokenizer, model, batches) -> dict:
    """The six methods timed, by name: the harness's greedy evaluator, ``generate`` batched and one prompt at a
    time, the first-token probe, and a bare forward over the prompt batches (all logits, or the last only)."""
    eos, pad, bs, new = tokenizer.eos_token_id, tokenizer.pad_token_id, args.batch_size, args.max_new_tokens
    greedy_spec = EvalSpec(evaluators=["greedy"], probes=[], batch_size=bs, max_new_tokens=new)
    probe_spec = EvalSpec(evaluators=[], probes=["first_token"], batch_size=bs)

    def harness_greedy():
        result = run_evaluation(model, tokenizer, items, recipes, greedy_spec)
        return [s["pred"] for s in result.samples]

    def generate_batched():
        out = [None] * len(items)
        with torch.no_grad():
            for chunk in batches:
                ids, mask, _ = left_pad([items[i].prompt_ids for i in chunk], pad, args.device)
                gen = model.generate(
                    ids, attention_mask=mask, do_sample=False, max_new_tokens=new, eos_token_id=eos, pad_token_id=pad
                )[:, ids.shape[1] :].tolist()
                for i, row in zip(chunk, gen):
                    out[i] = row
        return out

    def generate_single():
        out = []
        with torch.no_grad():
            for it in items:
                ids = torch.tensor([it.prompt_ids], device=args.device)
                gen = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=False,
                    max_new_tokens=new,
                    eos_token_id=eos,
                    pad_token_id=pad,
                )
                out.append(gen[0, ids.shape[1] :].tolist())
        return out

    def probe():
        run_evaluation(model, tokenizer, items, recipes, probe_spec)

    def bare_forward(keep_last: bool):
        def run():
            with torch.no_grad():
                for chunk in batches:
                    ids, mask, pos = left_pad([items[i].prompt_ids for i in chunk], pad, args.device)
                    extra = {"logits_to_keep": 1} if keep_last else {}
                    _ = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, **extra).logits
            if args.device == "cuda":
                torch.cuda.synchronize()

        return run

    return {
        "harness greedy": harness_greedy,
        "generate batched": generate_batched,
        "generate one at a time": generate_single,
        "first_token probe": probe,
        "bare forward (full logits)": bare_forward(False),
        "bare forward (last logits)": bare_forward(True),
    }


def harness_decode_ids(model, items, batches, tokenizer, new: int) -> list:
    """Token ids of the harness's decoder on the evaluator's batches, by item (to compare with ``generate``'s)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    ours_ids = [None] * len(items)
    with torch.no_grad():
        for chunk in batches:
            rows, _ = greedy_decode(
                model, [items[i].prompt_ids for i in chunk], max_new_tokens=new, eos_token_id=eos, pad_token_id=pad
            )
            for i, row in zip(chunk, rows):
                ours_ids[i] = row
    return ours_ids


def run_interleaved(methods: dict, reps: int) -> tuple[dict[str, list[float]], dict]:
    """One untimed call of every method (which also collects its outputs), then ``reps`` timed rounds A B C …."""
    times: dict[str, list[float]] = {name: [] for name in methods}
    outputs = {}
    for name, fn in methods.items():  # warm-up (also collects outputs)
        outputs[name] = fn()
    for _ in range(reps):
        for name, fn in methods.items():
            seconds, _ = timed(fn)
            times[name].append(seconds)
    return times, outputs


def check_identical(ours_ids: list, outputs: dict, tokenizer, n_items: int) -> None:
    """Stops the bench unless the harness's outputs equal batched and one-at-a-time ``generate``'s."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    def strip(row):  # generate's row → ids up to and including eos, no padding
        return row[: row.index(eos) + 1] if eos in row else [t for t in row if t != pad]

    batched_ids = [strip(row) for row in outputs["generate batched"]]
    single_ids = [strip(row) for row in outputs["generate one at a time"]]
    assert ours_ids == batched_ids, "harness greedy ids differ from batched generate"
    decode = lambda rows: [tokenizer.decode(r, skip_special_tokens=True) for r in rows]  # noqa: E731
    assert outputs["harness greedy"] == decode(batched_ids), "evaluator predictions differ from batched generate"
    same_single = sum(a == b for a, b in zip(ours_ids, single_ids))
    assert same_single == n_items, f"only {same_single}/{n_items} equal to one-at-a-time generate"
    print(
        f"identical outputs: harness == batched generate ({n_items}/{n_items} token ids), "
        f"== one-at-a-time generate ({same_single}/{n_items})"
    )


def print_medians(times: dict[str, list[float]], reps: int) -> None:
    med = {name: statistics.median(ts) for name, ts in times.items()}
    print(f"\nmedian of {reps} interleaved repetitions")
    print(f"{'method':<28}{'seconds':>10}{'ratio':>34}")
    rows = [
        ("harness greedy", ""),
        ("generate batched", f"harness {med['generate batched'] / med['harness greedy']:.2f}× faster (goal ≥1)"),
        (
            "generate one at a time",
            f"harness {med['generate one at a time'] / med['harness greedy']:.2f}× faster (goal ≥8)",
        ),
        ("first_token probe", ""),
        (
            "bare forward (full logits)",
            f"probe / forward = {med['first_token probe'] / med['bare forward (full logits)']:.2f} (goal ≤1.2)",
        ),
        (
            "bare forward (last logits)",
            f"probe / forward = {med['first_token probe'] / med['bare forward (last logits)']:.2f}",
        ),
    ]
    for name, ratio in rows:
        print(f"{name:<28}{med[name]:>10.3f}   {ratio}")


def main() -> None:
    args = arguments()
    if args.threads:
        torch.set_num_threads(args.threads)
    items, recipes, tokenizer, model = prompts_and_model(args)
    # The harness batches prompts sorted by length; batched generate gets exactly the same batches.
    order = sorted(range(len(items)), key=lambda i: len(items[i].prompt_ids))
    batches = [order[s : s + args.batch_size] for s in range(0, len(order), args.batch_size)]
    methods = timed_methods(args, items, recipes, tokenizer, model, batches)
    # Identical outputs: token ids of the harness's decoder (same batches as the evaluator) vs batched generate and
    # vs one-at-a-time generate, and the evaluator's decoded predictions vs batched generate's.
    ours_ids = harness_decode_ids(model, items, batches, tokenizer, args.max_new_tokens)
    times, outputs = run_interleaved(methods, args.reps)
    check_identical(ours_ids, outputs, tokenizer, len(items))
    print_medians(times, args.reps)


if __name__ == "__main__":
    main()
