"""The loss pool (``eval.loss_items``): a larger pool of held-out items per task, scored teacher-forced only.

A greedy rate on a few hundred items is a noisy target for a mixing law; the answer loss and the gold answer's
log-probability are continuous and cost one forward per item, so they can be measured on many more items. The
pool is drawn by the task's own recipe, with the task's own seed (:func:`harness.config.task_seed`, as the
evaluation pools are), asked for ``loss_items`` evaluation items instead of ``tasks.<name>.eval``: the same
held-out generation, a bigger draw. It is a separate build, so the run's training pool and greedy eval pools are
the ones they would be without it.

A recipe's training pool may depend on how many evaluation items it is asked for (a shared random stream), so an
item of the bigger draw's held-out split could be one the run trains on: every loss-pool item whose prompt is a
prompt of the run's actual training split is dropped (the split check's rule, :mod:`data_recipes.split_check`),
and the count dropped is said. Image tasks have no loss pool.

Its rows are split ``loss_<split>`` (:func:`harness.core.metrics.loss_pool_split`), metrics ``eval_loss`` and
``gold_logprob`` only, recorded at the end of every stage
(:meth:`harness.runs.execution.evallog.EvalLog.run_loss_pool`). The run's task building
(:func:`harness.data.task_build.build_tasks`) draws it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from data_recipes.split_check import HELD_OUT_SPLITS, prompt_digest
from harness.core.metrics import loss_pool_split


def loss_pool_splits(
    make_recipe: Callable[[], Any],
    task: str,
    sizes: tuple[int, int],
    seed: int,
    eval_splits: tuple[str, ...],
    train: list,
) -> tuple[dict[str, list], int]:
    """``({loss_<split>: [Example]}, dropped)`` of ``task`` for every held-out split of ``eval_splits``: a fresh
    recipe's held-out splits at ``sizes = (tasks.<task>.train, eval.loss_items)``, minus the items whose prompt is in
    ``train`` (the run's training split; ``dropped`` counts them). Raises ``ValueError`` (the recipe's) when it
    cannot make that many."""
    recipe = make_recipe()
    built = recipe.build(task, *sizes, seed)
    with_answer = getattr(recipe, "heldout_overlap", "prompt") == "prompt_answer"
    trained = {prompt_digest(ex, with_answer) for ex in train}
    out, dropped = {}, 0
    for split in eval_splits:
        if split not in HELD_OUT_SPLITS or not built.get(split):
            continue
        kept = [ex for ex in built[split] if prompt_digest(ex, with_answer) not in trained]
        dropped += len(built[split]) - len(kept)
        out[loss_pool_split(split)] = kept
    return out, dropped
