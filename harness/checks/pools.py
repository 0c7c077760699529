"""What ``harness validate`` checks and prints about the eval pools, before any training.

- the task data is built and tokenised (the builtin tokenizer trains in well under a second; an ``hf`` tokenizer
  is loaded without its model), so the checks of :func:`harness.data.task_encoding.encode_tasks` — answers that
  tokenise to nothing, an ``eval.max_new_tokens`` that cuts a gold answer — fail here as they would at run start;
- per task × split, the pool size ``n`` and the smallest change in a proportion metric between two evaluations
  that the pool detects with 80 % power (:func:`harness.core.stats.min_detectable_difference`: exact McNemar at α = 0.05
  on the paired items, half of them changing — the conservative case; not corrected for the many tests of a run).

An ``hf`` model whose tokenizer has no chat template gets one (and new tokens) only when the model loads, so its
length check waits for the run. An image-text model's tasks are encoded by its processor, built (llava-tiny) or
loaded (``hf``) here as the run does; image tasks are listed with their pool sizes and decoding budget.
"""

from __future__ import annotations

from collections import Counter

from harness.config import Experiment
from harness.core.stats import min_detectable_difference
from harness.data.answer_lengths import default_max_new_tokens, needed_new_tokens
from harness.evaluation.image_use import IMAGE_MAX_NEW_TOKENS
from harness.models.image_text import with_processor
from harness.models.modality import base_kind
from harness.runs.planning.prepare import build_task_data, builtin_tokenizer, encode_task_data

POWER = 0.8


def _pool_sizes(exp: Experiment, data, tasks: list[str]) -> Counter:
    """Eval pool sizes of ``tasks`` from the built splits (the train split is evaluated on ``eval`` items)."""
    return Counter(
        {
            (t, s): len(data.splits[t][s]) if s != "train" else min(exp.tasks[t].eval, len(data.splits[t][s]))
            for t in tasks
            for s in exp.eval.splits
        }
    )


def _tokenizer(exp: Experiment, data):
    """The run's tokenizer when it can be had cheaply, else None; an image-text model's with its processor."""
    kind = base_kind(exp.model)
    if kind == "image-text":
        return with_processor(exp.model, None if exp.model.hf else builtin_tokenizer(exp, data))
    if kind == "hf":
        from transformers import AutoTokenizer  # heavy: only for hf models

        tokenizer = AutoTokenizer.from_pretrained(
            exp.model.hf, revision=exp.model.revision, trust_remote_code=exp.model.trust_remote_code
        )
        if tokenizer.chat_template is None:
            return None
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer
    return builtin_tokenizer(exp, data)


def pool_report(exp: Experiment) -> list[str]:
    """Lines for ``harness validate``; raises :class:`harness.data.task_data.DataError` on bad task data
    or lengths."""
    data = build_task_data(exp)
    tokenizer = _tokenizer(exp, data)
    lines = []
    if tokenizer is not None:
        items = encode_task_data(exp, data, tokenizer).eval_items
        needed = needed_new_tokens(items)
        budget = exp.eval.max_new_tokens or default_max_new_tokens(items)
        image_tasks = [t for t, r in data.recipes.items() if r.has_images]  # evaluated apart: not in items
        if len(image_tasks) < len(data.recipes):
            lines.append(
                f"max_new_tokens {budget}{' (auto)' if exp.eval.max_new_tokens is None else ''}; longest "
                "gold answer: " + ", ".join(f"{t} {n}" for t, n in needed.items())
            )
        if image_tasks:
            lines.append(f"image tasks decode up to {exp.eval.max_new_tokens or IMAGE_MAX_NEW_TOKENS} tokens")
        sizes = Counter((item.task, item.split) for item in items)
        sizes.update(_pool_sizes(exp, data, image_tasks))
    else:
        lines.append("max_new_tokens: checked when the run loads the model (its tokenizer has no chat template)")
        sizes = _pool_sizes(exp, data, list(data.splits))
    lines.append(
        f"smallest change each eval pool detects ({POWER:.0%} power, paired McNemar at alpha 0.05, half "
        "the items changing; uncorrected):"
    )
    for (task, split), n in sorted(sizes.items()):
        mdd = min_detectable_difference(n, power=POWER) if n else float("inf")
        lines.append(f"  {task:<16} {split:<17} n={n:<5} {'none' if mdd == float('inf') else f'±{mdd:.2f}'}")
    return lines
