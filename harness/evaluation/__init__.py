"""Evaluation: evaluators and probes picked by name, run together with as few forward passes as possible.

Registered components (``eval.evaluators`` / ``eval.probes`` in the experiment file):

- evaluators: ``greedy`` (exact match of greedy decoding after the task's normaliser), ``mode_ok`` (share of greedy
  outputs with the task's answer shape), ``teacher_forced`` (``tf_first``, ``tf_exact``, ``eval_loss`` and
  ``gold_logprob``);
- probes: ``first_token`` (rank of the gold first token over the whole vocabulary, hijack share, top-1 table),
  ``forgetting`` (the loss on a fixed reference text next to the base model's: :mod:`harness.evaluation.forgetting`).

Importing this package is light (no torch): the registries and the component descriptions live in
:mod:`harness.evaluation.components`; the model work is in :mod:`harness.evaluation.passes`, imported on first use
of :func:`run_evaluation`. :mod:`harness.core.seesaw` is pure Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.core.registry import EVALUATORS, PROBES
from harness.evaluation.components import EVAL_METRICS, Component, EvalContext, ItemRecord
from harness.evaluation.hijack import hijack_token_ids
from harness.evaluation.result import EvalResult

if TYPE_CHECKING:  # pragma: no cover
    from harness.evaluation.passes import run_evaluation

__all__ = [
    "EVAL_METRICS",
    "EVALUATORS",
    "PROBES",
    "Component",
    "EvalContext",
    "EvalResult",
    "ItemRecord",
    "hijack_token_ids",
    "run_evaluation",
]


def __getattr__(name: str) -> Any:
    if name == "run_evaluation":
        from harness.evaluation.passes import run_evaluation

        return run_evaluation
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
