"""The ``forgetting`` probe: the loss of the current model on a fixed reference text, next to the base model's.

The forgetting measure PEFT and others log: how much worse the fine-tuned model predicts ordinary text of the kind it
was pretrained on. The reference text is fixed for the run:

- **default** (builtin base): a held-out sample of the world corpus — 64 documents
  (:data:`data_recipes.reference_text.DEFAULT_DOCUMENTS`) drawn by :func:`data_recipes.world.heldout_corpus` from the
  run's world with a seed of their own (fresh phrasings and fact orders of the same people, and fresh filler prose),
  every document that also occurs in the pretraining corpus left out: the base read these facts, never these
  documents. Drawing them touches no random state the run uses;
- **a user's file** (``eval.reference_text``): one document per non-blank line (UTF-8), in file order.

The run's task building reads the documents (:mod:`data_recipes.reference_text`); this module measures them.

Per document: the mean token cross-entropy (nats) of its tokens and a closing end-of-text token, each predicted from
the document's own prefix after a leading end-of-text token (how the pretraining stream joins documents). Rows, task
``ref:<name>`` (``ref:world`` or ``ref:<file stem>``), split ``ref``, at every evaluation:

- ``ref_loss``: mean over documents of the per-document loss (each document weighs the same, so the interval and the
  seesaw test are about the same quantity), ``n`` documents, 95 % Student-t interval over documents;
- ``ref_ppl``: ``exp(ref_loss)``, interval the exponentiated bounds;
- ``ref_loss_base``: the same for the base model, computed once when the run starts;
- ``ref_loss_delta``: mean per-document difference current − base, with a paired 95 % Student-t interval (the
  documents are the same, so the pairing removes their spread in difficulty). Student t rather than a bootstrap:
  each difference is already a mean over tens of tokens, so at 64 documents the mean's t approximation is good, the
  interval is cheap and exact at step 0 (every difference 0, width 0), and a percentile bootstrap is too narrow at
  small n.

Each document's sample (``samples.jsonl``) carries ``outcomes: {ref_loglik: -loss}``, higher is better: the paired
seesaw test reads it (:func:`reference_family`), so a rise of the reference loss is a task falling. No torch at import.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from harness.core.seesaw_families import REF_FAMILY  # the event family (metric and split) of reference_family

REF_TASK_PREFIX = "ref:"
REF_SPLIT = "ref"
#: The per-document outcome the seesaw reads: minus the document's mean token cross-entropy (nats), higher is better.
REF_OUTCOME = "ref_loglik"
REFERENCE_METRICS = ("ref_loss", "ref_ppl", "ref_loss_base", "ref_loss_delta")


def is_reference_task(task: str | None) -> bool:
    return task is not None and task.startswith(REF_TASK_PREFIX)


def encode_documents(tokenizer: Any, docs: list[str], max_length: int | None) -> list[list[int]]:
    """Each document as ``[eot, *tokens, eot]`` (eot: the tokenizer's end-of-text/eos token), cut to
    ``max_length`` tokens (the model's positions)."""
    eot = tokenizer.eos_token_id
    encoded = tokenizer(docs, add_special_tokens=False)["input_ids"]
    out = []
    for ids in encoded:
        seq = ([eot] if eot is not None else []) + list(ids) + ([eot] if eot is not None else [])
        out.append(seq[:max_length] if max_length else seq)
    return out


def document_losses(model: Any, sequences: list[list[int]], pad_id: int, batch_size: int = 16) -> np.ndarray:
    """Per sequence, the mean cross-entropy (nats) of tokens 1..end given their prefix; fixed batches in sequence
    order, right-padded, so the same model and sequences give the same floats. Eval mode under ``no_grad`` (no
    dropout, no random draw); every module's mode is restored."""
    import torch
    import torch.nn.functional as F

    device = next(model.parameters()).device
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    out: list[float] = []
    try:
        with torch.no_grad():
            for start in range(0, len(sequences), batch_size):
                batch = sequences[start : start + batch_size]
                width = max(len(s) for s in batch)
                ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
                mask = torch.zeros((len(batch), width), dtype=torch.long)
                for row, seq in enumerate(batch):
                    ids[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
                    mask[row, : len(seq)] = 1
                ids, mask = ids.to(device), mask.to(device)
                logits = model(input_ids=ids, attention_mask=mask).logits
                labels = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
                counts = (labels != -100).sum(dim=1).clamp(min=1)
                # One document at a time: the cross-entropy's log-softmax (and a bf16 model's float copy) is then
                # [seq, vocab], not a second [batch, seq, vocab] beside the logits (at a 151,936-token vocabulary,
                # 16 documents of 128 tokens: 1.2 GiB fp32 each). The same floats per document.
                for row in range(len(batch)):
                    one = logits[row : row + 1, :-1].float().transpose(1, 2)  # [1, vocab, seq]: the batched layout
                    nll = F.cross_entropy(one, labels[row : row + 1], ignore_index=-100, reduction="none")
                    out.extend((nll.sum(dim=1) / counts[row : row + 1]).tolist())
                del logits
    finally:
        for module, training in modes:
            module.training = training
    return np.asarray(out, dtype=float)


def t_interval(values: np.ndarray) -> tuple[float, float]:
    """95 % Student-t interval of the mean (a zero-width one when every value is equal, NaN for one value)."""
    from harness.core.stats import t_interval as core_t

    ci = core_t(values.tolist())
    return ci.low, ci.high


class ReferenceText:
    """The run's reference text: its documents, the base model's per-document losses, and the rows and samples of
    one evaluation (:meth:`evaluate`)."""

    def __init__(self, name: str, docs: list[str], tokenizer: Any, base_model: Any, batch_size: int = 16):
        self.task = REF_TASK_PREFIX + name
        self.docs = docs
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        config = getattr(base_model, "config", None)
        self.sequences = encode_documents(tokenizer, docs, getattr(config, "max_position_embeddings", None))
        self.batch_size = batch_size
        self.base = self.losses(base_model)

    def losses(self, model: Any) -> np.ndarray:
        return document_losses(model, self.sequences, self.pad_id, self.batch_size)

    def evaluate(self, model: Any) -> tuple[list[tuple], list[dict[str, Any]]]:
        """``(rows, samples)``: rows ``(task, split, metric, value, n, low, high)`` (see the module docstring) and one
        sample per document with its ``ref_loglik`` outcome."""
        current = self.losses(model)
        return reference_rows(self.task, current, self.base), [
            {
                "task": self.task,
                "split": REF_SPLIT,
                "index": i,
                "prompt": doc,
                "gold": None,
                "pred": None,
                "ref_loss": float(loss),
                "ref_loss_base": float(base),
                "outcomes": {REF_OUTCOME: -float(loss)},
            }
            for i, (doc, loss, base) in enumerate(zip(self.docs, current, self.base))
        ]


def reference_rows(task: str, current: np.ndarray, base: np.ndarray) -> list[tuple]:
    """The four rows of one evaluation from per-document losses of the current and the base model."""
    n = int(current.size)
    loss, base_loss, delta = float(current.mean()), float(base.mean()), float((current - base).mean())
    low, high = t_interval(current)
    return [
        (task, REF_SPLIT, "ref_loss", loss, n, low, high),
        (task, REF_SPLIT, "ref_ppl", math.exp(loss), n, math.exp(low), math.exp(high)),
        (task, REF_SPLIT, "ref_loss_base", base_loss, n, *t_interval(base)),
        (task, REF_SPLIT, "ref_loss_delta", delta, n, *t_interval(current - base)),
    ]


def reference_family(outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Outcome rows that let the paired seesaw pair the reference text with a task: at every evaluation where the
    reference was measured, its per-document ``ref_loglik`` (task ``ref:world``) and each task's ``greedy`` per
    split (``yesno/heldout``), all under metric and split :data:`REF_FAMILY` — so the reference's change between two
    evaluations is tested against every task's change over the same span (as benchmarks are:
    :func:`harness.evaluation.evidence.benchmark_family`)."""
    points = {(o["step"], o["stage"]) for o in outcomes if is_reference_task(o["task"])}
    out = []
    for o in outcomes:
        if (o["step"], o["stage"]) not in points:
            continue
        if is_reference_task(o["task"]) and o["metric"] == REF_OUTCOME:
            task = o["task"]
        elif o["metric"] == "greedy" and not is_reference_task(o["task"]):
            task = f"{o['task']}/{o['split']}"
        else:
            continue
        out.append({**o, "task": task, "metric": REF_FAMILY, "split": REF_FAMILY})
    return out


def paired_t_pvalues(tests: list[dict[str, Any]], family: list[dict[str, Any]]) -> None:
    """Replace the resampled p-value of every reference-text test in ``tests`` (from
    :func:`harness.core.seesaw.change_tests` over ``family``) by the two-sided paired t-test's on the same
    documents: per-document losses are continuous, and a resampled p-value cannot fall below ~1/resamples, a
    floor that Benjamini–Hochberg over a run's hundreds of tests would not let through."""
    from scipy import stats

    def as_mapping(raw: Any) -> dict[Any, float]:  # item key -> value, from a mapping or a sequence in item order
        return dict(raw) if isinstance(raw, dict) else dict(enumerate(raw))

    values = {(o["step"], o["stage"], o["task"]): as_mapping(o["outcomes"]) for o in family}
    for test in tests:
        if not is_reference_task(test["task"]):
            continue
        before = values[(test["step_from"], test["stage_from"], test["task"])]
        after = values[(test["step_to"], test["stage_to"], test["task"])]
        keys = [k for k in before if k in after]
        diff = np.array([after[k] - before[k] for k in keys], dtype=float)
        if diff.size < 2 or not np.any(diff):
            p = 1.0  # no change at all (a repeated evaluation): nothing to find
        elif np.all(diff == diff[0]):
            p = 0.0  # every document moved by the same amount: the t statistic is infinite
        else:
            p = float(stats.ttest_1samp(diff, 0.0).pvalue)
        test.update(test="paired_t", p_raw=p)
