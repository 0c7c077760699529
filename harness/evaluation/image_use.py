"""The ``image_use`` probe: does the model's answer depend on the image it is shown?

For every image task × split, each item is run three times — with its real image, with a *blank* image (one
uniform colour: the image's most common one, i.e. its background) and with a *swapped* image (another item's,
by a seeded derangement, so no item keeps its own) — measuring greedy predictions and the summed log-likelihood
of the gold answer (end-of-turn token included). Metrics per group:

- ``img_acc`` / ``img_acc_blank`` / ``img_acc_swapped``: greedy accuracy (the recipe's ``is_correct``) against
  the item's own gold answer;
- ``img_dependence``: share of items whose greedy prediction (its generated tokens) changes when the image is
  swapped. A model that ignores its images scores exactly 0;
- ``img_ll_gap``: mean over items of gold log-lik (real) minus gold log-lik (swapped), nats. > 0 when the real
  image makes the right answer more likely; 0 for a model blind to images.

Every proportion comes with its ``n`` and a 95 % Wilson interval; the gap with a paired t interval and the
paired t-test's p-value (``scipy.stats``). Greedy decoding uses ``model.generate`` (which passes the images
on the prefill only); the harness's own decoder (``evaluation/passes.py``, ``greedy_decode``) takes no images.

:class:`ImageEval` runs it on every image task and eval split at each evaluation of a run: ``greedy`` (accuracy with
the real image, so image tasks sit next to text tasks in reports and seesaw detection) and the ``img_*`` rows, and
one sample per item with its ``image_id`` and its 0/1 ``greedy`` outcome (the paired seesaw test's data).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.core.stats import wilson_interval
from harness.data.encoding import IGNORE_INDEX
from harness.data.images import ImageEncoded, collate_mixed, encode_image_examples, left_padded_prompts

CONDITIONS: tuple[str, ...] = ("real", "blank", "swapped")


@dataclass
class Proportion:
    k: int
    n: int
    lo: float
    hi: float

    @property
    def value(self) -> float:
        return self.k / self.n if self.n else float("nan")


def proportion(k: int, n: int) -> Proportion:
    """``k / n`` with a 95 % Wilson interval (:func:`harness.core.stats.wilson_interval`)."""
    if n == 0:
        return Proportion(0, 0, float("nan"), float("nan"))
    ci = wilson_interval(k, n)
    return Proportion(k, n, ci.low, ci.high)


@dataclass
class ImageUseStats:
    """The probe's outcome for one task × split; ``items`` holds per-item facts for the samples table."""

    task: str
    split: str
    acc: Proportion
    acc_blank: Proportion
    acc_swapped: Proportion
    dependence: Proportion
    ll_gap: float
    ll_gap_ci: tuple[float, float]
    ll_gap_p: float  # two-sided paired t-test, real vs swapped gold log-lik
    items: list[dict[str, Any]] = field(default_factory=list)

    def rows(self) -> list[tuple]:
        """Rows in the shape of ``EvalResult.metrics``, ``(task, split, metric, value)``; a proportion's row is
        ``(task, split, metric, value, n, wilson_low, wilson_high)`` (the store's n / interval columns, as text
        tasks' rows carry them) and is also given as ``<metric>_n`` / ``_lo`` / ``_hi`` rows. ``greedy`` is
        ``img_acc``."""
        out: list[tuple] = []
        for name, p in (
            ("greedy", self.acc),
            ("img_acc", self.acc),
            ("img_acc_blank", self.acc_blank),
            ("img_acc_swapped", self.acc_swapped),
            ("img_dependence", self.dependence),
        ):
            out.append((name, p.value, p.n, p.lo, p.hi))
            if name != "greedy":
                out += [(f"{name}_n", float(p.n)), (f"{name}_lo", p.lo), (f"{name}_hi", p.hi)]
        out += [
            ("img_ll_gap", self.ll_gap),
            ("img_ll_gap_lo", self.ll_gap_ci[0]),
            ("img_ll_gap_hi", self.ll_gap_ci[1]),
            ("img_ll_gap_p", self.ll_gap_p),
        ]
        return [(self.task, self.split, metric, float(value), *rest) for metric, value, *rest in out]


def derangement(n: int, rng: random.Random) -> list[int]:
    """A uniformly random cyclic permutation (Sattolo's algorithm): ``perm[i] != i`` for every i when n ≥ 2.
    Hand-written: neither numpy nor the standard library offers a derangement."""
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = rng.randrange(i)  # j < i, never i itself: this is what makes the cycle a single one
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def blank_like(image):
    """A uniform image the size of ``image``, in its most common colour (the background of a drawn scene)."""
    from PIL import Image

    colours = image.convert("RGB").getcolors(maxcolors=image.width * image.height)
    return Image.new("RGB", image.size, max(colours)[1])


def image_use(
    model,
    processor,
    examples: Sequence[Any],
    recipes: dict[str, Any],
    split: str,
    *,
    seed: int = 0,
    batch_size: int = 16,
    max_new_tokens: int = 24,
    drop_images: bool = False,
) -> list[ImageUseStats]:
    """Run the probe on ``examples`` (one split; examples without an image are skipped), grouped by task.

    ``drop_images`` (``debug.drop_images``) feeds all-zero pixels in every condition, as the run's training did: the
    seed's bug, which the probe must report as dependence 0.

    ``recipes`` maps each task to its recipe instance (for ``is_correct`` / ``normalise``). The model's train/eval
    mode is restored afterwards; gradients are off.
    """
    import torch

    by_task: dict[str, list[Any]] = {}
    for ex in examples:
        if ex.image is not None:
            by_task.setdefault(ex.task, []).append(ex)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return [
                _probe_task(
                    model, processor, task, items, recipes[task], split, seed, batch_size, max_new_tokens, drop_images
                )
                for task, items in by_task.items()
            ]
    finally:
        model.train(was_training)


def _probe_task(
    model, processor, task, examples, recipe, split, seed, batch_size, max_new_tokens, drop_images=False
) -> ImageUseStats:
    from scipy.stats import ttest_rel

    n = len(examples)
    partner = derangement(n, random.Random(f"image_use:{seed}:{task}:{split}"))
    images = {
        "real": [ex.image for ex in examples],
        "blank": [blank_like(ex.image) for ex in examples],
        "swapped": [examples[partner[i]].image for i in range(n)],
    }
    preds, pred_ids, lls = {}, {}, {}
    for condition in CONDITIONS:
        encoded = encode_image_examples(processor, examples, images[condition])
        preds[condition], pred_ids[condition] = greedy_with_images(
            model, processor, encoded, batch_size, max_new_tokens, drop_images
        )
        lls[condition] = gold_loglik(model, processor, encoded, batch_size, drop_images)

    def accuracy(condition: str) -> Proportion:
        return proportion(sum(recipe.is_correct(p, ex.answer) for p, ex in zip(preds[condition], examples)), n)

    # Compared as generated tokens, not text: distinct byte tokens can decode to the same "\ufffd".
    changed = [a != b for a, b in zip(pred_ids["real"], pred_ids["swapped"])]
    gaps = np.asarray(lls["real"]) - np.asarray(lls["swapped"])
    if n >= 2 and np.ptp(gaps) > 0:
        test = ttest_rel(lls["real"], lls["swapped"])
        ci, p_value = test.confidence_interval(0.95), float(test.pvalue)
        gap_ci = (float(ci.low), float(ci.high))
    else:  # identical differences (e.g. a model blind to images: all exactly 0): no spread to test
        mean = float(gaps.mean()) if n else float("nan")
        gap_ci, p_value = (mean, mean), float("nan")
    items = [
        {
            "image_id": ex.meta.get("image_id"),
            "swapped_with": examples[partner[i]].meta.get("image_id"),
            "gold": ex.answer,
            **{f"pred_{c}": preds[c][i] for c in CONDITIONS},
            **{f"ll_{c}": lls[c][i] for c in CONDITIONS},
        }
        for i, ex in enumerate(examples)
    ]
    return ImageUseStats(
        task,
        split,
        accuracy("real"),
        accuracy("blank"),
        accuracy("swapped"),
        proportion(sum(changed), n),
        float(gaps.mean()) if n else float("nan"),
        gap_ci,
        p_value,
        items,
    )


def greedy_with_images(
    model, processor, encoded: Sequence[ImageEncoded], batch_size: int, max_new_tokens: int, drop_images: bool = False
) -> tuple[list[str], list[tuple[int, ...]]]:
    """Greedy continuations of each item's prompt with its image: ``(texts, token ids)``, up to EOS, pad dropped."""

    tokenizer = processor.tokenizer
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    texts, token_ids = [], []
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start : start + batch_size]
        ids, mask, images = left_padded_prompts(chunk, tokenizer.pad_token_id, drop_images)
        kwargs: dict[str, Any] = {k: v.to(device, dtype) for k, v in images.items()}
        generated = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **kwargs,
        )
        for row in generated[:, ids.shape[1] :].tolist():
            if tokenizer.eos_token_id in row:
                row = row[: row.index(tokenizer.eos_token_id)]
            row = [t for t in row if t != tokenizer.pad_token_id]
            token_ids.append(tuple(row))
            # Other special tokens stay: an untrained model that writes "<image><image>" has not said nothing.
            texts.append(tokenizer.decode(row).strip())
    return texts, token_ids


def gold_loglik(
    model, processor, encoded: Sequence[ImageEncoded], batch_size: int, drop_images: bool = False
) -> list[float]:
    """Summed log-probability of each item's last assistant turn (its supervised tokens after the prompt)."""
    import torch

    device = next(model.parameters()).device
    out: list[float] = []
    for start in range(0, len(encoded), batch_size):
        chunk = list(encoded[start : start + batch_size])
        batch = collate_mixed(chunk, processor.tokenizer.pad_token_id, drop_images).to(device)
        images = {k: v.to(next(model.parameters()).dtype) for k, v in batch.extra_inputs().items()}
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **images).logits
        logp = torch.log_softmax(logits.float(), dim=-1)
        labels = batch.labels
        positions = torch.arange(labels.shape[1], device=device)[None, :]
        last_turn = positions >= torch.tensor([e.prompt_length - 1 for e in chunk], device=device)[:, None]
        keep = (labels != IGNORE_INDEX) & last_turn
        picked = logp.gather(-1, labels.clamp(min=0)[..., None])[..., 0]
        out += (picked * keep).sum(dim=1).tolist()
    return out


IMAGE_MAX_NEW_TOKENS = 12  # image tasks' decoding budget when eval.max_new_tokens is null (auto)


def image_tasks(data) -> list[str]:
    return [name for name, recipe in data.recipes.items() if getattr(recipe, "has_images", False)]


@dataclass(frozen=True)
class ImageEvalPlan:
    """The run's slice the image tasks' evaluation needs (made by the runs layer from the experiment): the decoding
    settings and, per image task, its data seed and how many of its training items the ``train`` split scores."""

    splits: tuple[str, ...]
    seed: int
    batch_size: int
    max_new_tokens: int | None
    drop_images: bool
    task_seeds: dict[str, int]
    train_items: dict[str, int]


class ImageEval:
    """The image tasks' evaluation: :func:`~harness.evaluation.image_use.image_use` per task and eval split."""

    def __init__(self, plan: ImageEvalPlan, data, processor):
        self.processor, self.recipes, self.drop_images = processor, data.recipes, plan.drop_images
        # null max_new_tokens (auto): image answers are a word or two; 12 lets an overlong one be seen ending
        self.seed, self.batch_size = plan.seed, plan.batch_size
        self.max_new_tokens = plan.max_new_tokens or IMAGE_MAX_NEW_TOKENS
        self.examples: dict[tuple[str, str], list] = {}
        for name in image_tasks(data):
            splits = data.splits[name]
            for split in plan.splits:
                if split == "train":  # the same fixed subsample as the text tasks' train split
                    pool = splits["train"]
                    rng = np.random.default_rng(plan.task_seeds[name])
                    chosen = sorted(rng.choice(len(pool), size=min(plan.train_items[name], len(pool)), replace=False))
                    self.examples[(name, split)] = [pool[i] for i in chosen]
                elif splits[split]:
                    self.examples[(name, split)] = splits[split]

    def __call__(self, model) -> tuple[list[tuple], list[dict[str, Any]]]:
        """``(metric rows, samples)``: rows as :meth:`~harness.evaluation.image_use.ImageUseStats.rows` gives
        them (a proportion's with its n and Wilson interval)."""
        rows, samples = [], []
        for (task, split), examples in self.examples.items():
            (stats,) = image_use(
                model,
                self.processor,
                examples,
                self.recipes,
                split,
                seed=self.seed,
                batch_size=self.batch_size,
                max_new_tokens=self.max_new_tokens,
                drop_images=self.drop_images,
            )
            rows += stats.rows()
            recipe = self.recipes[task]
            for index, (ex, item) in enumerate(zip(examples, stats.items)):
                correct = bool(recipe.is_correct(item["pred_real"], ex.answer))
                # outcomes: the item's 0/1 greedy result, as text tasks' samples carry theirs — what puts image
                # tasks into the paired seesaw test (harness.evaluation.evidence.outcome_rows)
                samples.append(
                    {
                        "task": task,
                        "split": split,
                        "index": index,
                        "prompt": ex.prompt,
                        "gold": ex.answer,
                        "pred": item["pred_real"],
                        "correct": correct,
                        "outcomes": {"greedy": int(correct)},
                        **item,
                    }
                )
        return rows, samples


def image_eval(plan: ImageEvalPlan, data, io) -> ImageEval | None:
    """The run's :class:`ImageEval` through ``io``'s processor (:func:`harness.models.modality.model_io`; a text
    model's run has refused image tasks when it encoded them), or ``None`` when no task has images."""
    if not image_tasks(data):
        return None
    if io.processor is None:  # a run refuses it earlier (tasks.<name>: ... text-only); other callers learn it here
        raise ValueError("image tasks need an image-text model (model.builtin: llava-tiny or an image-text model.hf)")
    return ImageEval(plan, data, io.processor)
