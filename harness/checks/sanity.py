"""``harness sanity``: two checks the seeds wish they had run first.

- *overfit*: train on ``n`` training examples alone until teacher-forced exact match on those same examples
  reaches a threshold, or a step budget runs out. A pipeline that cannot memorise 128 clean examples is broken
  (masking, labels, learning rate) — find out before blaming the data.
- *inputs matter*: on a trained model, shuffle the prompts across examples and check that most predictions
  change. A model that answers the same whatever it is asked never saw its inputs (the LLaVA port in the seeds
  trained for days without its images).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from data_recipes.base import Example
from harness.checks.image_sanity import encode_with_processor, images_matter_check, teacher_forced_exact
from harness.checks.result import CheckResult
from harness.config import EvalSpec, Experiment
from harness.data.batches import collate
from harness.data.encoding import IGNORE_INDEX, encode_examples, eval_items
from harness.data.images import collate_mixed
from harness.evaluation import run_evaluation
from harness.runs.planning.prepare import build_task_data, load_base
from harness.training.loop import StageLoop, train_stage


def _pick_examples(exp: Experiment, splits: dict[str, dict[str, list]], n: int, seed: int) -> list:
    """``n`` training examples spread evenly over the experiment's tasks."""
    rng = np.random.default_rng(seed)
    tasks = [t for t in exp.tasks if splits[t]["train"]]
    order = {t: list(rng.permutation(len(splits[t]["train"]))) for t in tasks}
    picked = []
    while len(picked) < n and any(order.values()):
        for t in tasks:
            if order[t] and len(picked) < n:
                picked.append(splits[t]["train"][order[t].pop()])
    return picked


def _epoch_batches(encoded, batch_size: int, max_steps: int, rng, pad_id: int, images: bool, drop_images) -> list:
    """``max_steps`` batches of ``batch_size``, epoch after epoch, each epoch in a fresh order of ``rng``."""
    batches: list = []
    while len(batches) < max_steps:
        order = rng.permutation(len(encoded))
        for i in range(0, len(order) - batch_size + 1, batch_size):
            chosen = [encoded[j] for j in order[i : i + batch_size]]
            batches.append(collate_mixed(chosen, pad_id, drop_images) if images else collate(chosen, pad_id))
    return batches[:max_steps]


def _pooled_tf_exact(result, items) -> float:
    """The share of items whose every answer token is the argmax, pooled over tasks (each weighed by its items)."""
    values = [v for _, _, m, v in result.metrics if m == "tf_exact"]
    counts = [sum(1 for it in items if it.task == t) for t, _, m, _ in result.metrics if m == "tf_exact"]
    return float(np.average(values, weights=counts))


def overfit_check(
    exp: Experiment,
    n: int = 128,
    threshold: float = 0.95,
    max_steps: int = 500,
    eval_every: int = 25,
    corrupt_labels: bool = False,
    console=None,
):
    """Train the base model on ``n`` examples alone; returns (CheckResult, trained model, tokenizer, examples).

    ``corrupt_labels`` breaks the pipeline on purpose (labels not shifted: every position is trained to predict
    itself), so the check can be seen to fail.
    """
    data = build_task_data(exp)
    model, tokenizer, _, _ = load_base(exp, data, console)
    examples = _pick_examples(exp, data.splits, n, exp.seed)
    image_encoded = encode_with_processor(tokenizer, examples)  # an image-text model: through its processor
    encoded = image_encoded if image_encoded is not None else encode_examples(tokenizer, examples)
    drop_images = exp.debug.drop_images
    if corrupt_labels:
        for e in encoded:
            keep = e.labels != IGNORE_INDEX
            e.labels[keep] = e.input_ids[keep]
    items = eval_items(tokenizer, examples, "train")
    spec = EvalSpec(evaluators=["teacher_forced"], probes=[])
    recipes = data.recipes
    train = exp.resolved_stages()[0].train
    batch_size = min(train.batch_size, len(encoded))
    rng = np.random.default_rng(exp.seed)
    score = {"tf_exact": 0.0, "steps": 0}

    class Reached(Exception):
        pass

    def evaluate(step: int) -> None:
        if image_encoded is not None:  # scored with the images, as trained
            score["tf_exact"] = teacher_forced_exact(model, encoded, tokenizer.pad_token_id, drop_images)
        else:
            score["tf_exact"] = _pooled_tf_exact(run_evaluation(model, tokenizer, items, recipes, spec), items)
        score["steps"] = step
        if console is not None:
            console.info(f"  overfit step {step}: tf_exact {score['tf_exact']:.3f}")
        if score["tf_exact"] >= threshold:
            raise Reached

    images = image_encoded is not None
    batches = _epoch_batches(encoded, batch_size, max_steps, rng, tokenizer.pad_token_id, images, drop_images)
    torch.manual_seed(exp.seed)
    try:
        train_stage(
            model,
            batches,
            StageLoop(
                stage="overfit",
                start_step=0,
                optim=train.optim.model_copy(update={"warmup": min(10, max_steps)}),
                tasks=list(exp.tasks),
                log=lambda rows, step: None,
                evaluate=evaluate,
                eval_every=eval_every,
                diagnostics=False,
            ),
        )
    except Reached:
        pass
    result = CheckResult(
        "overfit",
        score["tf_exact"] >= threshold,
        score["tf_exact"],
        threshold,
        {"examples": len(examples), "steps": score["steps"], "budget": max_steps},
    )
    return result, model, tokenizer, examples, recipes


def inputs_matter_check(
    model,
    tokenizer,
    examples: list,
    recipes: dict[str, Any],
    threshold: float = 0.5,
    max_new_tokens: int = 16,
    seed: int = 0,
) -> CheckResult:
    """Greedy predictions with each example's own prompt vs with another example's prompt (a derangement);
    passes when the share of changed predictions, among pairs with different gold answers, reaches
    ``threshold``."""
    rng = np.random.default_rng(seed)
    n = len(examples)
    shift = int(rng.integers(1, n)) if n > 1 else 0
    partner = [(i + shift) % n for i in range(n)]  # a cyclic shift: nobody keeps their own prompt
    spec = EvalSpec(evaluators=["greedy"], probes=[], max_new_tokens=max_new_tokens)
    original = eval_items(tokenizer, examples, "train")
    swapped_examples = [
        Example(ex.task, (*examples[partner[i]].messages[:-1], ex.messages[-1]), ex.meta, image=ex.image)
        for i, ex in enumerate(examples)
    ]
    swapped = eval_items(tokenizer, swapped_examples, "swapped")
    preds = {}
    for items in (original, swapped):
        result = run_evaluation(model, tokenizer, items, recipes, spec)
        for s in result.samples:
            preds[(s["split"], s["prompt"])] = s["pred"]
    pairs = [
        (preds[("train", original[i].prompt_text)], preds[("swapped", swapped[i].prompt_text)])
        for i in range(n)
        if examples[i].answer != examples[partner[i]].answer
    ]
    changed = float(np.mean([a != b for a, b in pairs])) if pairs else 0.0
    return CheckResult(
        "inputs_matter",
        changed >= threshold,
        changed,
        threshold,
        {"pairs": len(pairs), "unchanged": sum(a == b for a, b in pairs)},
    )


def load_checkpoint(path) -> tuple[Any, Any]:
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def run_sanity(
    exp: Experiment,
    n: int,
    threshold: float,
    max_steps: int,
    checkpoint: str | None,
    console=None,
    image_threshold: float = 0.2,
) -> list[CheckResult]:
    """The checks; *inputs matter* runs on ``checkpoint`` if given, else on the overfit-trained model. With an
    image-text model and image tasks, *images matter* (:mod:`harness.checks.image_sanity`) runs on the overfit-trained
    model and fails when the share of predictions that change with the image stays below ``image_threshold``."""
    overfit, model, tokenizer, examples, recipes = overfit_check(exp, n, threshold, max_steps, console=console)
    images = images_matter_check(model, tokenizer, examples, recipes, image_threshold, exp.debug.drop_images, exp.seed)
    if checkpoint is not None:
        model, tokenizer = load_checkpoint(checkpoint)
    text_examples = [ex for ex in examples if getattr(ex, "image", None) is None]
    checks = [overfit]
    if text_examples or images is None:  # inputs_matter reads prompts; the image examples are images_matter's
        checks.append(inputs_matter_check(model, tokenizer, text_examples or examples, recipes, seed=exp.seed))
    return checks + ([images] if images is not None else [])
