"""The steering split of an adaptive stage whose signal is ``steering_error``: its examples and eval items.

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
fit the model or ``eval.max_new_tokens`` — is a :class:`~harness.data.task_data.DataError` naming the YAML path,
before any training. What a stage's draw reads of the experiment comes as a :class:`SteeringDraw`
(:class:`harness.runs.planning.steering_split.SteeringSplits` makes them and measures the items as the stage trains).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from data_recipes.base import with_system_turn
from harness.data.answer_lengths import default_max_new_tokens, needed_new_tokens, too_short_errors
from harness.data.encoding import eval_items, fit_eval_items
from harness.data.special_text import apply_special_token_policy
from harness.data.task_data import SYSTEM_TURN_TWICE, DataError, TaskData


@dataclass(frozen=True)
class SteeringDraw:
    """One steered stage's draw: what it asks for and what it reads of the experiment."""

    where: str  # the YAML path errors name: stages[<i>].mixture.adaptive.steering
    tasks: tuple[str, ...]  # the steered tasks
    split: str  # the held-out split imitated: heldout or heldout_template
    items: int  # steering items per task
    task_specs: dict[str, Any]  # task -> its TaskSpec (train and eval sizes, system turn)
    seeds: dict[str, int]  # task -> its data seed (harness.config.task_seed)
    special_tokens_in_text: str  # data.special_tokens_in_text
    max_new_tokens: int | None  # eval.max_new_tokens (None: what the longest answer needs)
    max_length: int  # the stage's train.max_length


def steering_items(tokenizer: Any, data: TaskData, draw: SteeringDraw, max_positions: int | None = None) -> list:
    """The stage's steering eval items over every steered task, refused when one does not fit the stage's
    ``max_length`` and the model's ``max_positions`` (None: unbounded), or an explicit ``max_new_tokens`` cuts one."""
    examples = steering_examples(data, draw, tokenizer)
    items = [it for task in draw.tasks for it in eval_items(tokenizer, examples[task], "steering")]
    cut = too_short_errors(draw.max_new_tokens, needed_new_tokens(items))
    if cut:
        raise DataError(f"{draw.where}: {cut[0]}")
    limit = min(draw.max_length, max_positions or draw.max_length)
    _, dropped = fit_eval_items(items, limit, draw.max_new_tokens or default_max_new_tokens(items))
    if dropped:
        (task, _), n = next(iter(dropped.items()))
        raise DataError(f"{draw.where}: {n} steering items of task {task!r} are longer than the {limit} positions")
    return items


def steering_examples(data: TaskData, draw: SteeringDraw, tokenizer: Any = None) -> dict[str, list]:
    """``{task: [Example]}``: ``draw.items`` steering examples per steered task (module docstring), through
    ``data.special_tokens_in_text`` as every pool is when a ``tokenizer`` is given."""
    out = {}
    for task in draw.tasks:
        recipe, spec = data.recipes[task], draw.task_specs[task]
        if recipe.has_images:
            raise DataError(f"{draw.where}: task {task!r} has images; a steering split is text-only")
        try:
            drawn = recipe.build(task, spec.train, draw.items + 2 * spec.eval, draw.seeds[task])[draw.split]
        except ValueError as e:
            cannot = f"the recipe cannot draw {draw.items} more items"
            raise DataError(f"{draw.where}.items: task {task!r}: {cannot}: {e}") from None
        if spec.system:
            try:
                drawn = with_system_turn({draw.split: drawn}, spec.system)[draw.split]
            except ValueError:
                raise DataError(SYSTEM_TURN_TWICE.format(task=task)) from None
        if tokenizer is not None:  # before comparing: the pools were encoded through the same policy
            try:
                drawn = apply_special_token_policy(drawn, tokenizer, draw.special_tokens_in_text, task, "steering")
            except ValueError as e:
                raise DataError(f"tasks.{task}: {e}") from None
        pools = data.splits[task]
        taken = {_prompt_key(ex) for pool in pools.values() for ex in pool}
        trained_items = {ex.meta.get("item") for ex in pools.get("train", [])}
        fresh: dict[str, Any] = {}
        for ex in drawn:
            if _prompt_key(ex) not in taken and _on_the_right_side(ex, draw.split, trained_items):
                fresh.setdefault(_prompt_key(ex), ex)
        if len(fresh) < draw.items:
            raise DataError(
                f"{draw.where}.items: task {task!r} gives only {len(fresh)} {draw.split} items that no pool holds, "
                f"{draw.items} asked for (lower items)"
            )
        out[task] = list(fresh.values())[: draw.items]
    return out


def _prompt_key(example) -> str:
    return json.dumps(list(example.messages[:-1]), sort_keys=True)


def _on_the_right_side(example, split: str, trained_items: set) -> bool:
    """heldout_template: an item the run trains on; heldout: one it does not (no item key: no rule)."""
    item = example.meta.get("item")
    if item is None:
        return True
    return (item in trained_items) == (split == "heldout_template")
