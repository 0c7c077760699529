"""What one evaluation returns (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.core.metrics import PROPORTION_METRICS

if TYPE_CHECKING:  # pragma: no cover
    from harness.core.stats import Interval


@dataclass
class EvalResult:
    """The outcome of :func:`harness.evaluation.run_evaluation`.

    - ``metrics``: ``(task, split, metric, value)``, one per task × split × metric asked for, in the order
      tasks/splits first appear in the items, then components in the order the spec lists them;
    - ``tables``: ``{table_name: {(task, split): [(token_string, count), ...]}}`` (the ``first_token`` probe's
      ``ft_top1``: the most common top-1 first tokens, most common first, at most 10);
    - ``samples``: one dict per item, in item order (see :meth:`ItemRecord.sample`);
    - ``item_values``: ``{(task, split, metric): [value per item, in item order]}`` — what each component's
      ``item_values`` returned (0/1 for proportions): the data behind intervals and the paired seesaw test.
    """

    metrics: list[tuple[str, str, str, float]] = field(default_factory=list)
    tables: dict[str, dict[tuple[str, str], list[tuple[str, int]]]] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    item_values: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    #: ``{(task, split, metric): (n, low, high)}``: intervals of non-proportions that have one (``choice_auc``)
    intervals: dict[tuple[str, str, str], tuple[int, float, float]] = field(default_factory=dict)

    @property
    def top1(self) -> dict[tuple[str, str], list[tuple[str, int]]]:
        """``{(task, split): [(token_string, count), ...]}`` — most common top-1 first tokens (``ft_top1``)."""
        return self.tables.get("ft_top1", {})

    def value(self, task: str, split: str, metric: str) -> float:
        """One metric value; ``KeyError`` if it was not computed."""
        for t, s, m, v in self.metrics:
            if (t, s, m) == (task, split, metric):
                return v
        raise KeyError((task, split, metric))

    def as_nested(self) -> dict[str, dict[str, dict[str, float]]]:
        """``{split: {task: {metric: value}}}``."""
        out: dict[str, dict[str, dict[str, float]]] = {}
        for task, split, metric, value in self.metrics:
            out.setdefault(split, {}).setdefault(task, {})[metric] = value
        return out

    def interval(self, task: str, split: str, metric: str) -> Interval | None:
        """The 95 % Wilson interval (with ``n``) of a proportion metric from its per-item outcomes, or the interval
        a component gave (``choice_auc``); None for other metrics or when no per-item values were kept."""
        from harness.core.stats import Interval, wilson_interval  # scipy: imported on use, not with evaluation

        given = self.intervals.get((task, split, metric))
        if given is not None:
            return Interval(self.value(task, split, metric), given[1], given[2], given[0])
        values = self.item_values.get((task, split, metric))
        if metric not in PROPORTION_METRICS or values is None:
            return None
        return wilson_interval(int(sum(bool(v) for v in values)), len(values))

    def outcome_rows(self, step: int, stage: str) -> list[dict[str, Any]]:
        """Rows for :func:`harness.core.seesaw.change_tests` / ``paired_seesaw_events``: ``{step, stage,
        task, split, metric, value, outcomes}`` per task × split × metric with per-item values."""
        return [
            {
                "step": step,
                "stage": stage,
                "task": task,
                "split": split,
                "metric": metric,
                "value": sum(values) / len(values) if values else float("nan"),
                "outcomes": list(values),
            }
            for (task, split, metric), values in self.item_values.items()
        ]
