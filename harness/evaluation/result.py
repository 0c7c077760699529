"""What one evaluation returns (no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EvalResult:
    """The outcome of :func:`harness.evaluation.run_evaluation`.

    - ``metrics``: ``(task, split, metric, value)``, one per task × split × metric asked for, in the order
      tasks/splits first appear in the items, then components in the order the spec lists them;
    - ``tables``: ``{table_name: {(task, split): [(token_string, count), ...]}}`` (the ``first_token`` probe's
      ``ft_top1``: the most common top-1 first tokens, most common first, at most 10);
    - ``samples``: one dict per item, in item order (see :meth:`ItemRecord.sample`).
    """

    metrics: list[tuple[str, str, str, float]] = field(default_factory=list)
    tables: dict[str, dict[tuple[str, str], list[tuple[str, int]]]] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)

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
