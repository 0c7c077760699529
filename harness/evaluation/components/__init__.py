"""Evaluators and probes: what each one needs computed, and how it turns per-item records into metrics.

A component is a small object with three things (the plugin boundary):

- ``needs``: which model passes it relies on — ``"greedy"`` (greedy decoding), ``"teacher_forced"`` (one forward
  over prompt + gold answer), ``"first_logits"`` (the logits at the first answer position, i.e. the last prompt
  position). :mod:`harness.evaluation.passes` computes the union of the needs once, sharing passes between
  components: ``mode_ok`` reuses ``greedy``'s decoding, and ``first_logits`` come from the teacher-forced forward
  when it runs, else from the prefill of greedy decoding, else from one bare forward over the prompts (last
  position only);
- ``metrics(records, recipe, ctx)``: ``{metric: value}`` for the records of one task × split;
- ``tables(records, recipe, ctx)``: optional ``{table: [(token_string, count), ...]}`` for the same group;
- ``item_values(records, recipe, ctx)``: optional ``{metric: [value per record]}`` — the per-item outcomes behind
  a metric (0/1 for a proportion), which the paired seesaw test
  (:func:`harness.core.seesaw.paired_seesaw_events`) and the Wilson intervals need;
- ``emits``: the metrics it may write, each declared with its kind and direction
  (:func:`harness.core.metrics.proportion`, ``continuous``, ``count``). Defining the class declares them in
  :data:`harness.core.metrics.METRICS`, which is what makes a metric a proportion (``n``, Wilson interval, stored
  outcomes, McNemar) or lower-is-better everywhere; ``metric_names`` is derived from it.

Records (:class:`ItemRecord`) carry every per-item fact the passes produced. A component is a plug-in
(:mod:`harness.core.plugins`): to add an evaluator, subclass :class:`Component` and register it with
``@EVALUATORS.plugin("my_metric")`` (a probe: ``@PROBES.plugin``), in the package or in a module of one's own
(``docs/extending.md``); the registry holds one instance, built from the default ``Params``.

The built-in components are defined here; a new built-in may also be a module of its own in this package's folder:
importing the package imports every public module there (:func:`harness.core.registry.import_submodules`,
:data:`BUILTIN_MODULES`), so it is one new file, with no list to keep.

This package imports no torch. It fills :data:`harness.core.registry.EVALUATORS` and ``PROBES``, which
``harness.config`` reads to validate names (the registries name this package as their provider).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterator, Set
from dataclasses import dataclass, field
from typing import Any, ClassVar

from harness.core.metrics import METRICS, Metric, continuous, proportion
from harness.core.plugins import Plugin
from harness.core.registry import EVALUATORS, PROBES, import_submodules
from harness.evaluation.forgetting import REFERENCE_METRICS

NEED_GREEDY = "greedy"
NEED_TEACHER_FORCED = "teacher_forced"
NEED_FIRST_LOGITS = "first_logits"

#: Name of the teacher-forced eval loss (mean CE per answer token, eos included) in the metric contract. Not
#: ``loss``: on the ``train`` eval split that would collide with the training loss rows (``loss/train/<task>``).
EVAL_LOSS_METRIC = "eval_loss"
#: The gold answer's summed log-probability under teacher forcing (nats, eos included; higher is better), averaged
#: over items: the gold's likelihood as a target, with each item weighing the same whatever its length.
GOLD_LOGPROB_METRIC = "gold_logprob"
#: The teacher-forced targets whose per-item values go into each sample's ``outcomes`` (as floats), beside the
#: proportions' 0/1: what the seeds × items intervals of a group and a loss pool's paired comparisons read.
LOSS_TARGETS = (EVAL_LOSS_METRIC, GOLD_LOGPROB_METRIC)
TOP1_TABLE_SIZE = 10


@dataclass
class EvalContext:
    """What components may need besides the records: the tokenizer, the hijack token ids and the eval spec."""

    tokenizer: Any
    hijack_ids: frozenset[int]
    spec: Any


@dataclass
class ItemRecord:
    """Everything measured on one :class:`harness.data.batches.EvalItem`; fields stay ``None`` when not computed."""

    item: Any
    # greedy decoding
    pred_ids: list[int] | None = None  # generated ids, eos included when it was reached, no padding
    pred: str | None = None  # decoded with skip_special_tokens
    correct: bool | None = None  # recipe.is_correct(pred, gold_text)
    mode_ok: bool | None = None  # recipe.mode_ok(pred)
    truncated: bool | None = None  # decoding hit max_new_tokens without producing a stop token
    # teacher forcing
    tf_hits: list[bool] | None = None  # per gold token: is it the argmax given the gold prefix
    tf_nll: float | None = None  # summed cross-entropy of the gold tokens (nats)
    # first answer position
    gold_first_token: str | None = None  # the gold first token, decoded
    gold_first_rank: int | None = None  # see harness.evaluation.token_ranks.first_token_facts
    first_nonfinite: bool | None = None  # the first-answer-position logits had a NaN or ±inf
    top1_id: int | None = None
    top1_token: str | None = None
    top5: list[dict[str, Any]] | None = None  # [{token, id, prob}], most likely first
    # two-answer tasks (yes/no): the two classes' first token ids, and P(first) / (P(first) + P(second)) there
    choice_ids: tuple[int, int] | None = None
    choice_p: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gold_first_id(self) -> int | None:
        return self.item.gold_ids[0] if self.item.gold_ids else None

    @property
    def tf_first(self) -> bool | None:
        return None if not self.tf_hits else self.tf_hits[0]

    @property
    def tf_exact(self) -> bool | None:
        return None if self.tf_hits is None else all(self.tf_hits)

    def sample(self) -> dict[str, Any]:
        """The ``samples.jsonl`` record (without run / stage / step, which the caller adds)."""
        item = self.item
        gold_first = self.gold_first_id
        out = {
            "task": item.task,
            "split": item.split,
            "index": item.index,
            "prompt": item.prompt_text,
            "gold": item.gold_text,
            "pred": self.pred,
            "correct": self.correct,
            "mode_ok": self.mode_ok,
            "truncated": self.truncated,
            "tf_first": self.tf_first,
            "tf_exact": self.tf_exact,
            "gold_first_id": gold_first,
            "gold_first_token": self.gold_first_token,
            "gold_first_rank": self.gold_first_rank,
            "first_nonfinite": self.first_nonfinite,
            "top5": self.top5 if self.top5 is not None else [],
        }
        if self.choice_p is not None:
            out["choice_p"] = self.choice_p
        out.update(self.extra)
        return out


class Component(Plugin):
    """Base of evaluators and probes (see the module docstring); ``params``: a validated ``Params``."""

    needs: ClassVar[frozenset[str]] = frozenset()
    #: The metrics it may write, with kind and direction; a class that sets only ``metric_names`` (bare names)
    #: declares nothing, and its metrics count as continuous and higher-is-better.
    emits: ClassVar[tuple[Metric, ...]] = ()
    metric_names: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "emits" in cls.__dict__:  # declared by this class (not inherited): declare them and derive the names
            for metric in cls.emits:
                METRICS.declare(metric)
            cls.metric_names = tuple(metric.name for metric in cls.emits)

    def __init__(self, params: Any = None):
        self.params = params if params is not None else self.Params()

    def metrics(self, records: list[ItemRecord], recipe: Any, ctx: EvalContext) -> dict[str, float]:
        raise NotImplementedError

    def tables(self, records: list[ItemRecord], recipe: Any, ctx: EvalContext) -> dict[str, list[tuple[str, int]]]:
        return {}

    def item_values(self, records: list[ItemRecord], recipe: Any, ctx: EvalContext) -> dict[str, list[float]]:
        return {}

    def intervals(
        self, records: list[ItemRecord], recipe: Any, ctx: EvalContext
    ) -> dict[str, tuple[int, float, float]]:
        """``{metric: (n, low, high)}`` for metrics that are not proportions but have an interval of their own
        (``choice_auc``: Newcombe's score interval); proportions get Wilson's from :meth:`item_values`."""
        return {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else float("nan")


def _extra_scores(records: list[ItemRecord], recipe: Any) -> dict[str, list[float]]:
    """Per-item ``recipe.extra_scores(pred, gold)`` (e.g. math's ``answer_ok``), by metric; empty for recipes
    without extra scores. Every item must report the same metrics."""
    per_item = [recipe.extra_scores(r.pred or "", r.item.gold_text) for r in records]
    names = list(per_item[0]) if per_item else []
    return {m: [float(bool(scores[m])) for scores in per_item] for m in names}


@EVALUATORS.plugin("greedy")
class Greedy(Component):
    """``greedy``: share of greedy outputs that the task's recipe judges correct (``is_correct(pred, gold)``);
    plus the recipe's extra scores of the same outputs (``answer_ok`` for math: the A part alone) and
    ``truncated``, the share of outputs cut off at ``max_new_tokens`` before any stop token."""

    needs = frozenset({NEED_GREEDY})
    emits = (proportion("greedy"), proportion("answer_ok"), proportion("truncated", higher_is_better=False))

    def metrics(self, records, recipe, ctx):
        return {m: _mean(values) for m, values in self.item_values(records, recipe, ctx).items()}

    def item_values(self, records, recipe, ctx):
        return {
            "greedy": [float(bool(r.correct)) for r in records],
            **_extra_scores(records, recipe),
            "truncated": [float(bool(r.truncated)) for r in records],
        }


@EVALUATORS.plugin("mode_ok")
class ModeOk(Component):
    """``mode_ok``: share of greedy outputs with the task's answer shape (``recipe.mode_ok(pred)``)."""

    needs = frozenset({NEED_GREEDY})
    emits = (proportion("mode_ok"),)

    def metrics(self, records, recipe, ctx):
        return {"mode_ok": _mean(self.item_values(records, recipe, ctx)["mode_ok"])}

    def item_values(self, records, recipe, ctx):
        return {"mode_ok": [float(bool(r.mode_ok)) for r in records]}


@EVALUATORS.plugin("teacher_forced")
class TeacherForced(Component):
    """``teacher_forced``: with the gold answer as input, ``tf_first`` (the gold first token is the argmax),
    ``tf_exact`` (every gold token, eos included, is the argmax), ``eval_loss`` (mean CE per gold token over the
    task × split, token-weighted) and ``gold_logprob`` (the gold answer's summed log-probability, mean over items).

    Per-item values (:meth:`item_values`): ``gold_logprob`` is each item's −Σ CE; ``eval_loss``'s are the ratio
    estimator's linearisation ``R + (nll_i − R·t_i) / t̄`` (R the pooled loss, t_i the item's gold tokens, t̄
    their mean), whose mean is exactly the token-weighted ``eval_loss`` and whose spread gives its delta-method
    variance — so an interval over items (and seeds × items) is about the metric reported, not about a per-item
    mean that weighs short answers more."""

    needs = frozenset({NEED_TEACHER_FORCED})
    emits = (
        proportion("tf_first"),
        proportion("tf_exact"),
        continuous(EVAL_LOSS_METRIC, higher_is_better=False),
        continuous(GOLD_LOGPROB_METRIC),
    )

    def metrics(self, records, recipe, ctx):
        per_item = self.item_values(records, recipe, ctx)
        return {
            "tf_first": _mean(per_item["tf_first"]),
            "tf_exact": _mean(per_item["tf_exact"]),
            EVAL_LOSS_METRIC: _pooled_loss(records),
            GOLD_LOGPROB_METRIC: _mean(per_item[GOLD_LOGPROB_METRIC]),
        }

    def item_values(self, records, recipe, ctx):
        return {
            "tf_first": [float(bool(r.tf_first)) for r in records],
            "tf_exact": [float(bool(r.tf_exact)) for r in records],
            **loss_item_values(records),
        }


def _pooled_loss(records: list[ItemRecord]) -> float:
    n_tokens = sum(len(r.tf_hits or []) for r in records)
    return sum(r.tf_nll or 0.0 for r in records) / n_tokens if n_tokens else float("nan")


def loss_item_values(records: list[ItemRecord]) -> dict[str, list[float]]:
    """``{eval_loss: [...], gold_logprob: [...]}`` per record (see :class:`TeacherForced`); ``eval_loss`` is
    left out when no record has a gold token (no loss to linearise)."""
    out = {GOLD_LOGPROB_METRIC: [-(r.tf_nll or 0.0) for r in records]}
    tokens = [len(r.tf_hits or []) for r in records]
    if records and sum(tokens):
        pooled, mean_tokens = _pooled_loss(records), sum(tokens) / len(tokens)
        nll = [r.tf_nll or 0.0 for r in records]
        out[EVAL_LOSS_METRIC] = [pooled + (x - pooled * t) / mean_tokens for x, t in zip(nll, tokens)]
    return out


@PROBES.plugin("first_token")
class FirstToken(Component):
    """``first_token``: at the first answer position, the rank of the gold first token over the whole vocabulary
    (``ft_rank_mean``, ``ft_rank_median``, ``ft_mrr``; rank 1 = top, ties counted against the token: rank =
    number of tokens with a logit ≥ the gold one's, :mod:`harness.evaluation.token_ranks`), ``ft_hijack`` (share of
    prompts whose top-1 token is in the hijack set) and ``ft_top1`` (share of the most common top-1 token; the table
    of the 10 most common goes to ``EvalResult.tables["ft_top1"]``) and, when the pass recorded it, ``ft_nonfinite``
    (share of rows whose logits had a NaN or ±inf; those rows get the worst rank)."""

    needs = frozenset({NEED_FIRST_LOGITS})
    emits = (
        continuous("ft_rank_mean", higher_is_better=False),
        continuous("ft_rank_median", higher_is_better=False),
        continuous("ft_mrr"),
        proportion("ft_hijack", higher_is_better=False),
        continuous("ft_top1", higher_is_better=None),  # a share, but of a token picked after looking: no interval
        proportion("ft_nonfinite", higher_is_better=False),
        continuous("choice_auc"),  # an interval of its own (intervals())
        continuous("choice_auc_p", higher_is_better=None),
        proportion("choice_yes", higher_is_better=None),  # the lean towards the first class
        proportion("choice_acc"),
    )

    def metrics(self, records, recipe, ctx):
        ranks = [r.gold_first_rank for r in records if r.gold_first_rank is not None]
        top1 = self._counts(records)
        per_item = self.item_values(records, recipe, ctx)
        out = {
            "ft_rank_mean": _mean([float(x) for x in ranks]),
            "ft_rank_median": float(statistics.median(ranks)) if ranks else float("nan"),
            "ft_mrr": _mean([1.0 / x for x in ranks]),
            "ft_hijack": _mean(per_item["ft_hijack"]),
            "ft_top1": top1[0][2] / len(records) if top1 else float("nan"),
        }
        if "ft_nonfinite" in per_item:
            out["ft_nonfinite"] = _mean(per_item["ft_nonfinite"])
        auc = _choice_auc(records)
        if auc is not None:
            out.update(
                choice_auc=auc.auc,
                choice_auc_p=auc.p_value,
                choice_yes=_mean(per_item["choice_yes"]),
                choice_acc=_mean(per_item["choice_acc"]),
            )
        return out

    def intervals(self, records, recipe, ctx):
        auc = _choice_auc(records)
        return {} if auc is None else {"choice_auc": (auc.n, auc.low, auc.high)}

    def item_values(self, records, recipe, ctx):
        # NaN where an item has no gold first token, so the list stays aligned with the records
        out = {
            "ft_mrr": [1.0 / r.gold_first_rank if r.gold_first_rank is not None else math.nan for r in records],
            "ft_hijack": [float(r.top1_id in ctx.hijack_ids) for r in records],
        }
        if records and all(r.first_nonfinite is not None for r in records):
            out["ft_nonfinite"] = [float(r.first_nonfinite) for r in records]
        if _choice_auc(records) is not None:
            out["choice_yes"] = [float(r.choice_p > 0.5) for r in records]
            out["choice_acc"] = [float((r.choice_p > 0.5) == _gold_is_first(r)) for r in records]
        return out

    def tables(self, records, recipe, ctx):
        return {"ft_top1": [(token, count) for _, token, count in self._counts(records)[:TOP1_TABLE_SIZE]]}

    @staticmethod
    def _counts(records: list[ItemRecord]) -> list[tuple[int, str, int]]:
        """``(token_id, token_string, count)`` by decreasing count, ties by token id (deterministic)."""
        counts = Counter(r.top1_id for r in records if r.top1_id is not None)
        names = {r.top1_id: r.top1_token for r in records}
        return [(i, names[i] or "", c) for i, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


@PROBES.plugin("forgetting")
class Forgetting(Component):
    """``forgetting``: the loss on a fixed reference text next to the base model's (``ref_loss``, ``ref_ppl``,
    ``ref_loss_base``, ``ref_loss_delta``; task ``ref:<name>``, split ``ref``). Run-level, not per task: the model
    work and the rows are :mod:`harness.evaluation.forgetting`'s, called once per evaluation by the run's
    evaluation log; here it only contributes its metric names (nothing per task × split)."""

    # the base model's loss is a reference point, neither better nor worse
    emits = tuple(continuous(m, higher_is_better=None if m == "ref_loss_base" else False) for m in REFERENCE_METRICS)

    def metrics(self, records, recipe, ctx):
        return {}


def _gold_is_first(record: ItemRecord) -> bool:
    return record.gold_first_id == record.choice_ids[0]


def _choice_auc(records: list[ItemRecord]):
    """:func:`harness.core.stats.auc_test` of the records' ``choice_p`` between gold-first-class items and the
    others; None unless every record has a ``choice_p`` and both classes are present (no ranking to measure)."""
    if not records or any(r.choice_p is None for r in records):
        return None
    from harness.core.stats import auc_test  # scipy: imported on use, not with harness.evaluation

    first = [r.choice_p for r in records if _gold_is_first(r)]
    second = [r.choice_p for r in records if not _gold_is_first(r)]
    return auc_test(first, second) if first and second else None


class _EvalMetrics(Set):
    """The metric names of every registered evaluator and probe, read at each use (a plug-in registered after this
    module's import counts too)."""

    def _names(self) -> frozenset[str]:
        return frozenset(
            m for registry in (EVALUATORS, PROBES) for n in registry.names() for m in registry.get(n).metric_names
        )

    def __contains__(self, metric: object) -> bool:
        return metric in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._names()))

    def __len__(self) -> int:
        return len(self._names())


#: Every metric an evaluation can write (the store tells evaluation rows from training rows by these names).
EVAL_METRICS: Set[str] = _EvalMetrics()

#: The public modules of this package's folder, imported (in this order) after the built-ins above are defined, so
#: that they can import :class:`Component` from here; each registers its components.
BUILTIN_MODULES = import_submodules(__name__)
