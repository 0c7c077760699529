"""The steering splits of a run's adaptive stages whose signal is ``steering_error``, and their measurement as the
stage trains.

What the split holds and what it must never hold is :mod:`harness.data.steering_items`'s; this module takes each
steered stage's draw from the experiment (:class:`~harness.data.steering_items.SteeringDraw`) and measures the items.
The measurement is the evaluation's own (:func:`harness.evaluation.run_evaluation`, sharded over data-parallel ranks
and gathered, so every rank returns the same numbers) with only the evaluator the metric needs; its outcome is each
task's error (one minus the metric) with ``n`` and the Wilson interval of the error.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.config import EvalSpec, Experiment, ResolvedStage, task_seed
from harness.data.steering_items import SteeringDraw
from harness.evaluation import run_evaluation

EVALUATOR_OF = {"greedy": "greedy", "tf_exact": "teacher_forced", "tf_first": "teacher_forced"}


def steering_draws(exp: Experiment, stages: list[ResolvedStage]) -> dict[int, SteeringDraw]:
    """``{stage index: its draw}`` for every stage that steers by ``steering_error``: what its steering split draws
    and reads of ``exp``."""
    return {
        index: steering_draw(exp, stage, index)
        for index, stage in enumerate(stages)
        if stage.mixture.adaptive is not None and stage.mixture.adaptive.signal == "steering_error"
    }


def steering_draw(exp: Experiment, stage: ResolvedStage, index: int) -> SteeringDraw:
    """What stage ``index``'s steering split draws and reads of ``exp`` (a stage that steers by ``steering_error``)."""
    spec = stage.mixture.adaptive
    return SteeringDraw(
        where=f"stages[{index}].mixture.adaptive.steering",
        tasks=tuple(spec.tasks),
        split=spec.steering.split,
        items=spec.steering.items,
        task_specs={task: exp.tasks[task] for task in spec.tasks},
        seeds={task: task_seed(exp, task) for task in spec.tasks},
        special_tokens_in_text=exp.data.special_tokens_in_text,
        max_new_tokens=exp.eval.max_new_tokens,
        max_length=stage.train.max_length,
    )


@dataclass(frozen=True)
class SteeringSplits:
    """The steering items of every stage that steers by ``steering_error`` (by stage index:
    :func:`harness.data.steering_items.steering_items` of each :func:`steering_draws` draw), and their measurement
    with the run's evaluation settings, recipes and tokenizer."""

    eval_spec: EvalSpec
    recipes: dict[str, Any]
    tokenizer: Any
    items: dict[int, list]

    def measure(self, index: int, stage: ResolvedStage, model, shard) -> Callable[[], dict] | None:
        """Stage ``index``'s measurement, ``{task: (error, n, low, high)}`` of ``model`` now; None when it steers by
        no held-out signal. ``shard``: this process's share of data-parallel ranks (every rank calls it together)."""
        if index not in self.items:
            return None
        metric = stage.mixture.adaptive.steering.metric
        spec = self.eval_spec.model_copy(update={"evaluators": [EVALUATOR_OF[metric]], "probes": []})
        items, recipes, tokenizer = self.items[index], self.recipes, self.tokenizer

        def measured() -> dict[str, tuple[float, int, float, float]]:
            result = run_evaluation(model, tokenizer, items, recipes, spec, set(), shard=shard)
            out = {}
            for task, _, name, value in result.metrics:
                if name == metric:
                    ci = result.interval(task, "steering", metric)
                    out[task] = (1.0 - value, ci.n, 1.0 - ci.high, 1.0 - ci.low)
            return out

        return measured
