"""The steering split of an adaptive stage whose signal is ``steering_error``, and its measurement as the stage trains.

A controller that steers by a held-out score must never see an example the run reports or trains on, or the reported
score would be chosen on itself — and it must measure what the split it imitates measures. For each steered task the
split is a larger draw of the task's own recipe (its own data seed, sizes and world, ``items`` + twice ``eval`` items
per split asked for), from which are removed:

- every example whose prompt is the prompt of any example in any of the task's pools (train, heldout,
  heldout_template): no steering example is one the run reports or trains on;
- every example whose *item* (``meta["item"]``: the fact, word or operand pair asked about) is on the wrong side of
  the run's training pool: for ``heldout_template`` (trained items asked in unseen phrasings) the item must be one
  the run trains on; for ``heldout`` (unseen items) it must not be. A recipe whose train split depends on how many
  eval items are drawn (the word and math recipes) would otherwise lend its steering split items of another train
  split. Rows without an item key (a user's file) are kept by the prompt rule alone.

The first ``items`` that remain are the split; a task that cannot give that many — or whose steering items do not
fit the model or ``eval.max_new_tokens`` — is a :class:`DataError` naming the YAML path, before any training.

The measurement is the evaluation's own (:func:`harness.evaluation.run_evaluation`, sharded over data-parallel ranks
and gathered, so every rank returns the same numbers) with only the evaluator the metric needs; its outcome is each
task's error (one minus the metric) with ``n`` and the Wilson interval of the error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from harness.config import Experiment, ResolvedStage, task_seed
from harness.data.encoding import eval_items, fit_eval_items
from harness.data.special_text import apply_special_token_policy
from harness.evaluation import run_evaluation
from harness.evaluation.lengths import default_max_new_tokens, needed_new_tokens, too_short_errors
from harness.runs.planning.prepare import DataError, TaskData, with_system

EVALUATOR_OF = {"greedy": "greedy", "tf_exact": "teacher_forced", "tf_first": "teacher_forced"}


def _prompt_key(example) -> str:
    return json.dumps(list(example.messages[:-1]), sort_keys=True)


def _on_the_right_side(example, split: str, trained_items: set) -> bool:
    """heldout_template: an item the run trains on; heldout: one it does not (no item key: no rule)."""
    item = example.meta.get("item")
    if item is None:
        return True
    return (item in trained_items) == (split == "heldout_template")


def steering_examples(
    exp: Experiment, data: TaskData, stage: ResolvedStage, index: int, tokenizer: Any = None
) -> dict[str, list]:
    """``{task: [Example]}``: ``items`` steering examples per steered task of ``stage`` (module docstring), through
    ``data.special_tokens_in_text`` as every pool is when a ``tokenizer`` is given; a :class:`DataError` naming the
    YAML path when a task cannot give that many."""
    spec = stage.mixture.adaptive
    split, want = spec.steering.split, spec.steering.items
    where = f"stages[{index}].mixture.adaptive.steering"
    out = {}
    for task in spec.tasks:
        recipe, task_spec = data.recipes[task], exp.tasks[task]
        if recipe.has_images:
            raise DataError(f"{where}: task {task!r} has images; a steering split is text-only")
        try:
            drawn = recipe.build(task, task_spec.train, want + 2 * task_spec.eval, task_seed(exp, task))[split]
        except ValueError as e:
            raise DataError(f"{where}.items: task {task!r}: the recipe cannot draw {want} more items: {e}") from None
        drawn = with_system(task, {split: drawn}, task_spec.system)[split] if task_spec.system else drawn
        if tokenizer is not None:  # before comparing: the pools were encoded through the same policy
            try:
                drawn = apply_special_token_policy(drawn, tokenizer, exp.data.special_tokens_in_text, task, "steering")
            except ValueError as e:
                raise DataError(f"tasks.{task}: {e}") from None
        pools = data.splits[task]
        taken = {_prompt_key(ex) for pool in pools.values() for ex in pool}
        trained_items = {ex.meta.get("item") for ex in pools.get("train", [])}
        fresh: dict[str, Any] = {}
        for ex in drawn:
            if _prompt_key(ex) not in taken and _on_the_right_side(ex, split, trained_items):
                fresh.setdefault(_prompt_key(ex), ex)
        if len(fresh) < want:
            raise DataError(
                f"{where}.items: task {task!r} gives only {len(fresh)} {split} items that no pool holds, "
                f"{want} asked for (lower items)"
            )
        out[task] = list(fresh.values())[:want]
    return out


class SteeringSplits:
    """The steering items of every stage that steers by ``steering_error`` (by stage index), and their measurement.
    ``max_positions``: the model's position limit (None: none), as for every evaluation item."""

    def __init__(self, exp: Experiment, data: TaskData, stages: list[ResolvedStage], tokenizer, max_positions=None):
        self.eval_spec, self.recipes, self.tokenizer = exp.eval, data.recipes, tokenizer
        self.items: dict[int, list] = {}
        for index, stage in enumerate(stages):
            spec = stage.mixture.adaptive
            if spec is None or spec.signal != "steering_error":
                continue
            examples = steering_examples(exp, data, stage, index, tokenizer)
            items = [it for task in spec.tasks for it in eval_items(tokenizer, examples[task], "steering")]
            self.items[index] = self._fitted(items, stage, index, max_positions)

    def _fitted(self, items: list, stage: ResolvedStage, index: int, max_positions: int | None) -> list:
        """``items``, refused when one does not fit the model and ``max_length`` or ``eval.max_new_tokens`` cuts one."""
        where = f"stages[{index}].mixture.adaptive.steering"
        cut = too_short_errors(self.eval_spec.max_new_tokens, needed_new_tokens(items))
        if cut:
            raise DataError(f"{where}: {cut[0]}")
        limit = min(stage.train.max_length, max_positions or stage.train.max_length)
        _, dropped = fit_eval_items(items, limit, self.eval_spec.max_new_tokens or default_max_new_tokens(items))
        if dropped:
            (task, _), n = next(iter(dropped.items()))
            raise DataError(f"{where}: {n} steering items of task {task!r} are longer than the {limit} positions")
        return items

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
