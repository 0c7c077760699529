"""The metric contract's names that every layer and ``analysis`` share: what each metric *is* — its kind and its
direction, declared by the component that emits it (:class:`Metric`, :data:`METRICS`) — how baseline and seesaw rows
are named, and the file that marks a seed group.

A metric's kind decides how it is reported: a ``proportion`` (the mean of a 0/1 outcome per item) is stored with
``n`` and a Wilson interval, its per-item outcomes go into ``samples.jsonl`` and the paired seesaw test compares them
with exact McNemar; a ``continuous`` or ``count`` metric gets none of that. Its direction (higher or lower is better,
or neither) gives sweeps their default objective direction and the analysis its plot and ranking directions. As
lm-evaluation-harness's ``register_metric(higher_is_better=…, aggregation=…)``, the declaration travels with the
metric: evaluators and probes list theirs in ``emits`` (:class:`harness.evaluation.Component`), which declares them
here when the class is defined (recipes name their extra scores, proportions, in ``extra_metrics``), so a plug-in's
metric counts like a built-in one; anything else declares with :func:`declare_metric`. The derived sets
:data:`PROPORTION_METRICS` and :data:`harness.core.store.LOWER_IS_BETTER` are live views of :data:`METRICS`, read at
each use. An undeclared metric is continuous and higher-is-better.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Set
from dataclasses import dataclass

from harness.core.registry import Registry

PROPORTION = "proportion"  # the mean of a 0/1 outcome per item: n, Wilson interval, stored outcomes, McNemar
CONTINUOUS = "continuous"  # any other real value (a loss, a mean rank, an AUC, a p-value)
COUNT = "count"  # a number of things (tokens, steps)
METRIC_KINDS = (PROPORTION, CONTINUOUS, COUNT)


@dataclass(frozen=True)
class Metric:
    """One metric's declaration: ``kind`` (one of :data:`METRIC_KINDS`) and ``higher_is_better`` (``True``,
    ``False``, or ``None`` where neither is better: a lean, a p-value, a reference value)."""

    name: str
    kind: str = CONTINUOUS
    higher_is_better: bool | None = True

    def __post_init__(self) -> None:
        if self.kind not in METRIC_KINDS:
            raise ValueError(f"metric {self.name!r}: kind {self.kind!r} is not one of {', '.join(METRIC_KINDS)}")


def proportion(name: str, higher_is_better: bool | None = True) -> Metric:
    return Metric(name, PROPORTION, higher_is_better)


def continuous(name: str, higher_is_better: bool | None = True) -> Metric:
    return Metric(name, CONTINUOUS, higher_is_better)


def count(name: str, higher_is_better: bool | None = True) -> Metric:
    return Metric(name, COUNT, higher_is_better)


class MetricRegistry(Registry[Metric]):
    """Metric name → :class:`Metric`. Its provider is the module of the built-in evaluators and probes (imported on
    the first lookup, as the plug-in registries' are); a metric declared twice must be declared alike."""

    def declare(self, metric: Metric) -> Metric:
        known = self._items.get(metric.name)
        if known is not None and known != metric:
            raise ValueError(f"metric {metric.name!r} declared twice, differently: {known} and {metric}")
        self._items[metric.name] = metric
        return metric

    def spec(self, name: str) -> Metric:
        """The declaration of ``name``; an undeclared metric is continuous and higher-is-better."""
        return self._filled().get(name) or Metric(name)


#: Every declared metric (see the module docstring).
METRICS = MetricRegistry("metric", provider="harness.evaluation.components")


def declare_metric(name: str, kind: str = CONTINUOUS, higher_is_better: bool | None = True) -> Metric:
    """Declare a metric that no component's ``emits`` lists (a training-loop row, a plug-in's own)."""
    return METRICS.declare(Metric(name, kind, higher_is_better))


class MetricView(Set):
    """The names of the declared metrics that ``keep`` accepts, read from :data:`METRICS` at each use (a plug-in's
    metric declared after this view was made counts too)."""

    def __init__(self, keep: Callable[[Metric], bool]):
        self._keep = keep

    def _names(self) -> list[str]:
        return [m.name for m in METRICS._filled().values() if self._keep(m)]

    def __contains__(self, metric: object) -> bool:
        spec = METRICS._filled().get(metric) if isinstance(metric, str) else None
        return spec is not None and self._keep(spec)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._names()))

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _from_iterable(cls, names):  # set operations (view | {...}) give a plain frozenset
        return frozenset(names)

    def __repr__(self) -> str:
        return f"MetricView({sorted(self._names())})"


#: Metrics that are a share of items (``kind == "proportion"``): stored with ``n`` and a Wilson interval, their
#: per-item outcomes kept, tested with exact McNemar in the seesaw. Not ``ft_top1``: its "success" (the most common
#: top-1 token) is picked after looking at the data, so a binomial interval around it would be too narrow.
PROPORTION_METRICS: Set[str] = MetricView(lambda m: m.kind == PROPORTION)

# The training loop's rows are no component's: declared here (the per-task and overall training loss).
declare_metric("loss", CONTINUOUS, higher_is_better=False)

#: The binary-choice metrics of two-answer tasks (yes/no), from the first-answer-position logits of the two answers'
#: first tokens (the ``first_token`` probe): ``choice_auc`` (ROC AUC of P(first class) / (P(first) + P(second))
#: between items whose gold is the first class and the others; ``n``, 95 % score interval), ``choice_auc_p`` (its
#: one-sided Mann–Whitney p-value, H1: AUC > 0.5), ``choice_yes`` (share of items where the first class — "Yes" —
#: is the likelier of the two) and ``choice_acc`` (share where the likelier one is the gold one).
CHOICE_METRICS = ("choice_auc", "choice_auc_p", "choice_yes", "choice_acc")

#: lm-evaluation-harness benchmarks (``eval.benchmarks``) are rows like any task's: task ``bench:<lm-eval task>``,
#: split ``bench``, metric the lm-eval metric's name (``acc``, ``exact_match``, ...).
BENCH_TASK_PREFIX = "bench:"
BENCH_SPLIT = "bench"


def is_benchmark_task(task: str | None) -> bool:
    return task is not None and task.startswith(BENCH_TASK_PREFIX)


#: A baseline row's metric is this prefix and the metric it is a baseline of (``baseline_greedy``).
BASELINE_PREFIX = "baseline_"
#: Run-level row: how many paired tests the run's seesaw made (text: the rule).
SEESAW_TESTS_METRIC = "seesaw_tests"

#: The loss pool (``eval.loss_items``): a larger pool per task and held-out split, evaluated teacher-forced only at
#: the end of each stage; its rows are split ``loss_<split>`` (``eval_loss/loss_heldout/yesno``), so they never mix
#: with the greedy pool's, and only its loss targets are kept.
LOSS_POOL_PREFIX = "loss_"
LOSS_POOL_METRICS = ("eval_loss", "gold_logprob")


def loss_pool_split(split: str) -> str:
    """The loss pool's split name for the eval split ``split`` (``heldout`` → ``loss_heldout``)."""
    return LOSS_POOL_PREFIX + split


#: The file at the top of a seed group's directory (``harness run --seeds``).
GROUP_FILE = "group.json"
