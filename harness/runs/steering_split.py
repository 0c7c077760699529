"""The steering split of an adaptive stage whose signal is ``steering_error``, and its measurement as the stage trains.

A controller that steers by a held-out score must never see an item the run reports (or trains on), or the reported
score would be chosen on itself. For each steered task the split is *another draw* of the task's recipe — the same
recipe, sizes and world, a data seed derived from the task's own and the split's name — of the split it imitates
(``heldout_template`` by default: the facts of trained people asked in phrasings never trained on), from which every
example whose prompt is the prompt of any example in any of the task's pools (train, heldout, heldout_template) is
removed. What stays shared is what the imitated split shares with training by its definition: a heldout_template
steering item asks a fact of a trained person, as the reported heldout_template items do, in another unseen phrasing.

The measurement is the evaluation's own (:func:`harness.evaluation.run_evaluation`, sharded over data-parallel ranks
and gathered, so every rank returns the same numbers) with only the evaluator the metric needs; its outcome is each
task's error (one minus the metric) with ``n`` and the Wilson interval of the error.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Optional

from harness.config import Experiment, ResolvedStage, task_seed
from harness.data.encoding import eval_items
from harness.data.special_text import apply_special_token_policy
from harness.evaluation import run_evaluation
from harness.runs.prepare import DataError, TaskData, with_system

EVALUATOR_OF = {"greedy": "greedy", "tf_exact": "teacher_forced", "tf_first": "teacher_forced"}


def steering_seed(exp: Experiment, task: str, split: str) -> int:
    """The steering draw's data seed: derived from the task's own and the imitated split's name (never the task's)."""
    digest = hashlib.sha256(f"steering/{task_seed(exp, task)}/{split}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def _prompt_key(example) -> str:
    return json.dumps(list(example.messages[:-1]), sort_keys=True)


def steering_examples(exp: Experiment, data: TaskData, stage: ResolvedStage, index: int) -> dict[str, list]:
    """``{task: [Example]}``: ``items`` steering examples per steered task of ``stage`` (module docstring); a
    :class:`DataError` naming the YAML path when a task cannot give that many."""
    spec = stage.mixture.adaptive
    split, want = spec.steering.split, spec.steering.items
    where = f"stages[{index}].mixture.adaptive.steering"
    out = {}
    for task in spec.tasks:
        recipe, task_spec = data.recipes[task], exp.tasks[task]
        if recipe.has_images:
            raise DataError(f"{where}: task {task!r} has images; a steering split is text-only")
        # the draw collides with at most the reported items of the split it imitates: ask for that many more
        try:
            drawn = recipe.build(task, task_spec.train, want + task_spec.eval, steering_seed(exp, task, split))
        except ValueError as e:
            raise DataError(f"{where}.items: task {task!r}: the recipe cannot draw {want} more items: {e}") from None
        drawn = with_system(task, drawn, task_spec.system) if task_spec.system is not None else drawn
        taken = {_prompt_key(ex) for pool in data.splits[task].values() for ex in pool}
        fresh: dict[str, Any] = {}
        for ex in drawn[split]:
            fresh.setdefault(_prompt_key(ex), ex)
        kept = [ex for key, ex in fresh.items() if key not in taken]
        if len(kept) < want:
            raise DataError(
                f"{where}.items: task {task!r} gives only {len(kept)} {split} items unseen by every pool, "
                f"{want} asked for (lower items)"
            )
        out[task] = kept[:want]
    return out


class SteeringSplits:
    """The steering items of every stage that steers by ``steering_error`` (by stage index), and their measurement."""

    def __init__(self, exp: Experiment, data: TaskData, stages: list[ResolvedStage], tokenizer):
        self.exp, self.recipes, self.tokenizer = exp, data.recipes, tokenizer
        self.items: dict[int, list] = {}
        for index, stage in enumerate(stages):
            spec = stage.mixture.adaptive
            if spec is None or spec.signal != "steering_error":
                continue
            self.items[index] = []
            for task, examples in steering_examples(exp, data, stage, index).items():
                try:  # as every pool is (data.special_tokens_in_text)
                    examples = apply_special_token_policy(
                        examples, tokenizer, exp.data.special_tokens_in_text, task, "steering"
                    )
                except ValueError as e:
                    raise DataError(f"tasks.{task}: {e}") from None
                self.items[index] += eval_items(tokenizer, examples, "steering")

    def measure(self, index: int, stage: ResolvedStage, model, shard) -> Optional[Callable[[], dict]]:
        """Stage ``index``'s measurement, ``{task: (error, n, low, high)}`` of ``model`` now; None when it steers by
        no held-out signal. ``shard``: this process's share of data-parallel ranks (every rank calls it together)."""
        if index not in self.items:
            return None
        metric = stage.mixture.adaptive.steering.metric
        spec = self.exp.eval.model_copy(update={"evaluators": [EVALUATOR_OF[metric]], "probes": []})
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
