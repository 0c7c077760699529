"""A run's task data built from the recipes: every task's splits (over the shared world when its recipe needs one),
each passing the split check (:mod:`data_recipes.split_check`), its loss pool (:mod:`data_recipes.loss_pool`), its
system turn; the world corpus; the forgetting probe's reference text (:mod:`data_recipes.reference_text`).

What it reads of the experiment comes as a :class:`TaskBuild` (the planner's
:func:`harness.runs.planning.prepare.build_task_data` takes it); every refusal is a
:class:`~harness.data.task_data.DataError` naming the task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from data_recipes import build_world, corpus, get_recipe
from data_recipes.base import with_system_turn
from data_recipes.loss_pool import loss_pool_splits
from data_recipes.reference_text import reference_documents
from data_recipes.split_check import check_recipe_splits
from harness.config import TaskSpec, WorldSpec
from harness.data.task_data import SYSTEM_TURN_TWICE, DataError, TaskData


@dataclass(frozen=True)
class TaskBuild:
    """What building a run's task data reads of the experiment."""

    tasks: dict[str, TaskSpec]  # the tasks section, in the file's order
    seeds: dict[str, int]  # task -> its data seed (harness.config.task_seed)
    world: WorldSpec
    loss_items: int | None  # eval.loss_items (None: no loss pool)
    eval_splits: tuple[str, ...]  # eval.splits
    reference: str | None  # eval.reference_text (None: the world's held-out sample)
    forgetting: bool  # eval.probes names forgetting: the reference text is read


def build_tasks(build: TaskBuild) -> TaskData:
    """Every task's splits, loss pool and recipe, the world corpus and the reference text (module docstring)."""
    world = build_world(build.world.people, build.world.seed)
    recipes, splits, loss = {}, {}, {}
    for name, spec in build.tasks.items():
        cls = get_recipe(spec.recipe)

        def recipe_of(cls=cls, spec=spec) -> Any:
            return cls(cls.Params.model_validate(spec.params), world if cls.needs_world else None)

        def built(recipe: Any, name=name, spec=spec) -> dict[str, list]:
            return recipe.build(name, spec.train, spec.eval, build.seeds[name])

        recipes[name] = recipe = recipe_of()
        try:
            splits[name] = built(recipe)
            check_recipe_splits(recipe, splits[name], build.seeds[name], rebuild=lambda: built(recipe_of()))
        except (ValueError, OSError) as e:
            raise DataError(f"tasks.{name} (recipe {spec.recipe}): {e}") from None
        if build.loss_items and not recipe.has_images:  # the loss pool: a bigger held-out draw
            sizes, train = (spec.train, build.loss_items), splits[name]["train"]
            try:
                loss[name] = loss_pool_splits(recipe_of, name, sizes, build.seeds[name], build.eval_splits, train)
            except ValueError as e:
                raise DataError(f"tasks.{name} (recipe {spec.recipe}): eval.loss_items: {e}") from None
        if spec.system is not None:
            try:
                splits[name] = with_system_turn(splits[name], spec.system)
                if name in loss:
                    loss[name] = (with_system_turn(loss[name][0], spec.system), loss[name][1])
            except ValueError:
                raise DataError(SYSTEM_TURN_TWICE.format(task=name)) from None
    pretraining = corpus(
        world, build.world.seed, docs_per_person=build.world.docs_per_person, permute=build.world.permute
    )
    reference = reference_documents(build.reference, world, pretraining, build.world) if build.forgetting else None
    data = TaskData(recipes, splits, pretraining, world, reference)
    data.loss_splits = {name: pool for name, (pool, _) in loss.items()}
    data.loss_dropped = {name: n for name, (_, n) in loss.items() if n}
    return data
