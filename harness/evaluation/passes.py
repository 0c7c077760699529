"""Running the evaluators and probes an :class:`~harness.config.EvalSpec` asks for, sharing model passes.

Passes (each at most once per evaluation, batched by ``spec.batch_size`` over items sorted by length):

- **greedy** — :func:`greedy_decode`, batched with a KV cache, left-padded; token-for-token the same as
  ``model.generate(do_sample=False)`` on the same left-padded batch;
- **teacher forced** — one forward per batch over prompt + gold answer (left-padded), keeping only the logits of
  the last ``max_gold_len + 1`` positions (``logits_to_keep``) — the positions that predict answer tokens;
- **first-token logits** — the logits at the last prompt position. They are taken from the teacher-forced forward
  when it runs; otherwise from the prefill of greedy decoding; otherwise one bare forward over the prompts with
  ``logits_to_keep=1``. So the ``first_token`` probe never costs more than one forward pass over the prompts.

The model is put in eval mode under ``torch.no_grad()`` and every module's previous mode is restored afterwards.
(``no_grad`` rather than ``inference_mode``: evaluation runs in the middle of training, and an inference tensor that
ends up in a module buffer would break the next backward pass.)
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from harness.core.metrics import PROPORTION_METRICS
from harness.data.answer_lengths import default_max_new_tokens
from harness.data.encoding import IGNORE_INDEX
from harness.evaluation.components import (
    EVALUATORS,
    LOSS_TARGETS,
    NEED_FIRST_LOGITS,
    NEED_GREEDY,
    NEED_TEACHER_FORCED,
    PROBES,
    Component,
    EvalContext,
    ItemRecord,
)
from harness.evaluation.hijack import hijack_token_ids
from harness.evaluation.lengths import stop_token_ids
from harness.evaluation.result import EvalResult
from harness.evaluation.sharding import Shard, computed_fields, merge_computed
from harness.evaluation.token_ranks import first_token_facts

# ----------------------------------------------------------------------------------------------------------------
# Model calls
# ----------------------------------------------------------------------------------------------------------------


class ModelIO:
    """How to call a causal LM's forward across transformers versions.

    transformers 5 renamed the ``past_key_values`` argument and output to ``cache`` (the old name is accepted with a
    deprecation warning until 5.40); older versions only know ``past_key_values``. ``logits_to_keep`` (compute the
    LM head only on the last positions) is used when the forward accepts it.
    """

    def __init__(self, model: Any):
        target = model.get_base_model() if hasattr(model, "get_base_model") else model
        try:
            params = inspect.signature(target.forward).parameters
        except (TypeError, ValueError):  # pragma: no cover - exotic wrappers
            params = {}
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.keep_logits = "logits_to_keep" in params
        self.device = next(model.parameters()).device
        self.config = getattr(model, "config", None)

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        if self.config is not None:
            try:
                return DynamicCache(config=self.config)
            except TypeError:  # pragma: no cover - transformers < 4.56
                pass
        return DynamicCache()

    def __call__(
        self,
        model,
        input_ids,
        attention_mask,
        position_ids,
        *,
        keep: int = 0,
        cache: Any = None,
        use_cache: bool = False,
    ) -> tuple[torch.Tensor, Any]:
        """``(logits, cache)``; ``logits`` are for the last ``keep`` positions (all when ``keep == 0``)."""
        kwargs: dict[str, Any] = dict(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=use_cache
        )
        if use_cache:
            kwargs[self.cache_arg] = cache
        if keep and self.keep_logits:
            kwargs["logits_to_keep"] = keep
        out = model(**kwargs)
        logits = out.logits
        if keep and logits.shape[1] != keep:
            logits = logits[:, -keep:]
        new_cache = None
        if use_cache:
            for name in ("cache", "past_key_values"):
                value = out.get(name) if hasattr(out, "get") else getattr(out, name, None)
                if value is not None:
                    new_cache = value
                    break
        return logits, new_cache


def left_pad(
    seqs: Sequence[Sequence[int]], pad_id: int, device: Any = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, position_ids)`` for left-padded ``seqs``; position ids count real tokens
    only (0 on padding), exactly as ``generate`` derives them from the attention mask."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        if len(seq):
            ids[row, width - len(seq) :] = torch.as_tensor(list(seq), dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    position_ids = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    return ids.to(device), mask.to(device), position_ids.to(device)


def greedy_decode(
    model,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    eos_token_id: int | Sequence[int] | None,
    pad_token_id: int,
    io: ModelIO | None = None,
    return_first_logits: bool = False,
) -> tuple[list[list[int]], torch.Tensor | None]:
    """Greedy continuation of one left-padded batch of prompts with a KV cache.

    ``eos_token_id`` may be a list (every end-of-turn token, as ``generate`` accepts). Returns the generated ids per
    prompt (ending with the first stop token when one was produced; no padding) and,
    if asked, the float32 logits at the last prompt position ``[batch, vocab]`` (the prefill's). Sequences stop at
    eos or after ``max_new_tokens``; the loop stops when all have. Finished rows keep being fed the pad token (as
    in ``generate``) so that the batch's computation — and therefore every row's argmax — is identical to
    ``model.generate(input_ids, attention_mask, do_sample=False, ...)`` on the same batch.
    """
    io = io or ModelIO(model)
    ids, mask, position_ids = left_pad(prompts, pad_token_id, io.device)
    batch = ids.shape[0]
    logits, cache = io(model, ids, mask, position_ids, keep=1, cache=io.new_cache(), use_cache=True)
    first = logits[:, -1].float() if return_first_logits else None
    unfinished = torch.ones(batch, dtype=torch.bool, device=ids.device)
    pad = torch.tensor(pad_token_id, dtype=torch.long, device=ids.device)
    stops = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    stop_ids = torch.tensor(stops, dtype=torch.long, device=ids.device)
    steps: list[torch.Tensor] = []
    for step in range(max_new_tokens):
        next_tokens = logits[:, -1].float().argmax(dim=-1)
        next_tokens = torch.where(unfinished, next_tokens, pad)
        steps.append(next_tokens)
        if stops:
            unfinished &= ~torch.isin(next_tokens, stop_ids)
        if step == max_new_tokens - 1 or not bool(unfinished.any()):
            break
        mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=-1)
        position_ids = position_ids[:, -1:] + 1
        logits, cache = io(model, next_tokens[:, None], mask, position_ids, keep=1, cache=cache, use_cache=True)
    generated = torch.stack(steps, dim=1).tolist() if steps else [[] for _ in range(batch)]
    out = []
    for row in generated:
        ended = [i for i, token in enumerate(row) if token in stops]
        out.append(row[: ended[0] + 1] if ended else row)
    return out, first


# ----------------------------------------------------------------------------------------------------------------
# Passes
# ----------------------------------------------------------------------------------------------------------------


def _batches(order: list[int], size: int, part: tuple[int, int] = (0, 1)) -> Iterable[list[int]]:
    """The batches of ``order`` in chunks of ``size``; with ``part = (rank, world)`` only every world-th batch from
    the rank-th. Whole batches are shared out, never items: a batch's padded width and rows shape every row's
    floats (and so a near-tied argmax), so a rank computes each of its batches exactly as one process would."""
    rank, world = part
    for k, start in enumerate(range(0, len(order), size)):
        if k % world == rank:
            yield order[start : start + size]


class _TokenNames:
    """``tokenizer.decode([id])`` with a cache (top-k lists repeat the same few tokens); :meth:`learn` decodes
    many new ids in one ``batch_decode`` call."""

    def __init__(self, tokenizer):
        self.tokenizer, self.cache = tokenizer, {}

    def learn(self, ids: Iterable[int]) -> None:
        new = sorted({i for i in ids if i not in self.cache})
        if new:
            self.cache.update(zip(new, self.tokenizer.batch_decode([[i] for i in new])))

    def __call__(self, token_id: int) -> str:
        if token_id not in self.cache:
            self.cache[token_id] = self.tokenizer.decode([token_id])
        return self.cache[token_id]


def _fill_first(records: list[ItemRecord], logits: torch.Tensor, names: _TokenNames) -> None:
    golds = [r.gold_first_id for r in records]
    facts = first_token_facts(logits, golds)
    for row, rec in enumerate(records):
        if rec.choice_ids is not None:  # P(first) / (P(first) + P(second)) = sigmoid of the two logits' difference
            first, second = rec.choice_ids
            rec.choice_p = float(torch.sigmoid(logits[row, first].float() - logits[row, second].float()))
    names.learn([*facts["top1"], *(i for ids, _ in facts["top5"] for i in ids), *(g for g in golds if g is not None)])
    for rec, rank, nonfinite, top1, (ids, probs) in zip(
        records, facts["rank"], facts["nonfinite"], facts["top1"], facts["top5"]
    ):
        rec.gold_first_rank = rank
        rec.first_nonfinite = nonfinite
        rec.gold_first_token = names(rec.gold_first_id) if rec.gold_first_id is not None else None
        rec.top1_id = top1
        rec.top1_token = names(top1)
        rec.top5 = [{"token": names(i), "id": i, "prob": p} for i, p in zip(ids, probs)]


def _greedy_pass(
    model, io, records, tokenizer, spec, want_first: bool, names: _TokenNames, part: tuple[int, int]
) -> None:
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    stops = stop_token_ids(tokenizer, getattr(model, "generation_config", None))
    # null: what the longest gold answer needs plus a margin (harness.data.task_encoding rejects an explicit value
    # below it).
    max_new = spec.max_new_tokens or default_max_new_tokens(r.item for r in records)
    order = sorted(range(len(records)), key=lambda i: len(records[i].item.prompt_ids))
    for chunk in _batches(order, spec.batch_size, part):
        batch = [records[i] for i in chunk]
        generated, first = greedy_decode(
            model,
            [r.item.prompt_ids for r in batch],
            max_new_tokens=max_new,
            eos_token_id=stops,
            pad_token_id=pad,
            io=io,
            return_first_logits=want_first,
        )
        for rec, ids in zip(batch, generated):
            rec.pred_ids = ids
            rec.truncated = len(ids) >= max_new and (not ids or ids[-1] not in stops)
        if want_first:
            _fill_first(batch, first, names)


def _teacher_forced_pass(
    model, io, records, tokenizer, spec, want_first: bool, names: _TokenNames, part: tuple[int, int]
) -> None:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    order = sorted(range(len(records)), key=lambda i: len(records[i].item.prompt_ids) + len(records[i].item.gold_ids))
    for chunk in _batches(order, spec.batch_size, part):
        batch = [records[i] for i in chunk]
        golds = [list(r.item.gold_ids) for r in batch]
        ids, mask, position_ids = left_pad([list(r.item.prompt_ids) + g for r, g in zip(batch, golds)], pad, io.device)
        width, longest = ids.shape[1], max(len(g) for g in golds)
        # Left padding aligns every answer to the right edge: the last longest+1 positions hold, for each row, the
        # last prompt position (predicting the first gold token) through the position before the last gold token.
        logits, _ = io(model, ids, mask, position_ids, keep=longest + 1)
        lengths = torch.tensor([len(g) for g in golds], device=ids.device)
        if longest:
            predicting = logits[:, :longest].float()  # kept position k predicts token width - longest + k
            labels = ids[:, width - longest :].clone()
            offsets = torch.arange(longest, device=ids.device)[None, :]
            labels[offsets < (longest - lengths)[:, None]] = IGNORE_INDEX  # positions before this row's answer
            nll = F.cross_entropy(predicting.transpose(1, 2), labels, ignore_index=IGNORE_INDEX, reduction="none")
            hits = predicting.argmax(dim=-1) == labels
            nll_rows, hit_rows = nll.sum(dim=1).tolist(), hits.tolist()
            for row, (rec, gold) in enumerate(zip(batch, golds)):
                rec.tf_hits = hit_rows[row][longest - len(gold) :]
                rec.tf_nll = nll_rows[row]
        else:
            for rec in batch:
                rec.tf_hits, rec.tf_nll = [], 0.0
        if want_first:
            rows = torch.arange(len(batch), device=ids.device)
            _fill_first(batch, logits[rows, longest - lengths], names)


def _prompt_pass(model, io, records, tokenizer, spec, names: _TokenNames, part: tuple[int, int]) -> None:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    order = sorted(range(len(records)), key=lambda i: len(records[i].item.prompt_ids))
    for chunk in _batches(order, spec.batch_size, part):
        batch = [records[i] for i in chunk]
        ids, mask, position_ids = left_pad([r.item.prompt_ids for r in batch], pad, io.device)
        logits, _ = io(model, ids, mask, position_ids, keep=1)
        _fill_first(batch, logits[:, -1], names)


# ----------------------------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------------------------


def choice_token_ids(items: list, recipes: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """``{task: (first class's first token id, second's)}`` for two-answer tasks (``recipe.answer_classes()`` of
    length 2, e.g. yes/no), read off the eval items' gold tokens (the first answer token as the chat template
    encodes it); a task whose pools lack one class, or whose two classes share a first token, has no entry."""
    first_ids: dict[tuple[str, str], int] = {}
    for item in items:
        if item.gold_ids:
            first_ids.setdefault((item.task, item.gold_text), item.gold_ids[0])
    out = {}
    for task in dict.fromkeys(item.task for item in items):
        classes = tuple(recipes[task].answer_classes()) if task in recipes else ()
        ids = [first_ids.get((task, c)) for c in classes]
        if len(ids) == 2 and None not in ids and ids[0] != ids[1]:
            out[task] = (ids[0], ids[1])
    return out


def _components(spec) -> list[Component]:
    out: list[Component] = []
    for registry, names in ((EVALUATORS, spec.evaluators), (PROBES, spec.probes)):
        for name in names:
            component = registry.get(name)
            if component not in out:
                out.append(component)
    return out


def run_evaluation(
    model,
    tokenizer,
    items: list,
    recipes: dict[str, Any],
    spec,
    hijack_ids: set[int] | None = None,
    shard: Shard | None = None,
) -> EvalResult:
    """Evaluate ``model`` on ``items`` (:class:`harness.data.batches.EvalItem`) with the evaluators and probes of
    ``spec``.

    ``recipes`` maps each task to its recipe (normaliser, ``is_correct``, ``mode_ok``). ``hijack_ids`` defaults to
    :func:`hijack_token_ids` of ``spec.hijack_words``. Only the passes the components need are run (see the module
    docstring); metrics come one per task × split × metric, in order of first appearance of task × split.

    ``shard`` (one of several ranks holding the same model; every rank calls this together): each rank runs its
    share of every pass's batches, the per-item results are gathered, and every rank returns the result one
    process would (:mod:`harness.evaluation.sharding`).
    """
    components = _components(spec)
    needs = set().union(*(c.needs for c in components)) if components else set()
    if hijack_ids is None:
        hijack_ids = hijack_token_ids(tokenizer, spec.hijack_words) if NEED_FIRST_LOGITS in needs else set()
    records = _item_records(items, recipes)
    ctx = EvalContext(tokenizer, frozenset(hijack_ids), spec)
    part = (shard.rank, shard.world) if shard is not None else (0, 1)
    if records and needs:
        _run_needed_passes(model, tokenizer, records, spec, needs, part)
    if shard is not None and shard.world > 1:
        merge_computed(records, shard.all_gather(computed_fields(records)))
    _score_predictions(records, tokenizer, recipes)
    result = _component_results(records, recipes, components, ctx)
    result.samples = [rec.sample() for rec in records]
    return result


def _item_records(items: list, recipes: dict[str, Any]) -> list[ItemRecord]:
    """One :class:`ItemRecord` per item, carrying its task's choice token ids; a task without a recipe is an error."""
    missing = sorted({it.task for it in items} - set(recipes))
    if missing:
        raise KeyError(f"no recipe for task(s) {', '.join(missing)} (recipes given: {', '.join(sorted(recipes))})")
    records = [ItemRecord(item) for item in items]
    choices = choice_token_ids(items, recipes)
    for rec in records:
        rec.choice_ids = choices.get(rec.item.task)
    return records


def _run_needed_passes(model, tokenizer, records: list[ItemRecord], spec, needs: set, part: tuple[int, int]) -> None:
    """Run the passes ``needs`` asks for (greedy, teacher-forced, else prompt-only for first-token logits) in eval
    mode without gradients, filling ``records``; every module's own training mode is restored afterwards."""
    names = _TokenNames(tokenizer)
    io = ModelIO(model)
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            want_first = NEED_FIRST_LOGITS in needs
            if NEED_GREEDY in needs:
                _greedy_pass(
                    model,
                    io,
                    records,
                    tokenizer,
                    spec,
                    want_first and NEED_TEACHER_FORCED not in needs,
                    names,
                    part,
                )
            if NEED_TEACHER_FORCED in needs:
                _teacher_forced_pass(model, io, records, tokenizer, spec, want_first, names, part)
            elif want_first and NEED_GREEDY not in needs:
                _prompt_pass(model, io, records, tokenizer, spec, names, part)
    finally:
        for module, training in modes:  # restore each module's own mode (some may be frozen in eval)
            module.training = training


def _score_predictions(records: list[ItemRecord], tokenizer, recipes: dict[str, Any]) -> None:
    """Decode each generated prediction and judge it with its task's recipe (``correct``, ``mode_ok``)."""
    for rec in records:
        if rec.pred_ids is not None:
            recipe = recipes[rec.item.task]
            rec.pred = tokenizer.decode(rec.pred_ids, skip_special_tokens=True)
            rec.correct = bool(recipe.is_correct(rec.pred, rec.item.gold_text))
            rec.mode_ok = bool(recipe.mode_ok(rec.pred))


def _component_results(records: list[ItemRecord], recipes: dict[str, Any], components, ctx: EvalContext) -> EvalResult:
    """Each component's metrics, intervals, tables and per-item values for every task × split, in order of first
    appearance; a proportion metric's 0/1 outcomes are also put on each item's sample (the paired seesaw's data)."""
    groups: dict[tuple[str, str], list[ItemRecord]] = {}
    for rec in records:
        groups.setdefault((rec.item.task, rec.item.split), []).append(rec)
    result = EvalResult()
    for (task, split), group in groups.items():
        recipe = recipes[task]
        for component in components:
            for metric, value in component.metrics(group, recipe, ctx).items():
                result.metrics.append((task, split, metric, float(value)))
            for metric, interval in component.intervals(group, recipe, ctx).items():
                result.intervals[(task, split, metric)] = interval
            for table, rows in component.tables(group, recipe, ctx).items():
                result.tables.setdefault(table, {})[(task, split)] = rows
            for metric, values in component.item_values(group, recipe, ctx).items():
                result.item_values[(task, split, metric)] = values
                if metric in PROPORTION_METRICS:  # each sample carries its 0/1 outcomes: the paired seesaw's data
                    for rec, value in zip(group, values):
                        rec.extra.setdefault("outcomes", {})[metric] = int(value)
                elif metric in LOSS_TARGETS:  # and its loss targets: seeds × items intervals read them
                    for rec, value in zip(group, values):
                        rec.extra.setdefault("outcomes", {})[metric] = float(value)
    return result
