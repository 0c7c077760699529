"""DoReMi's domain weights: Xie, Pham, Dong, Du, Liu, Lu, Liang, Le, Ma & Yu 2023, "DoReMi: Optimizing Data
Mixtures Speeds Up Language Model Pretraining" (NeurIPS 2023), Algorithm 1 — Group DRO's exponentiated-gradient
(multiplicative-weights) update on each domain's loss in excess of a reference:

    λ_i   = max(L_i(θ) − L_i(ref), 0)                  (excess loss; tasks not drawn since the last update: 0)
    α'    = α ⊙ exp(η·λ)                               (η: step size, the paper's 1)
    α     ← (1 − c)·α' / Σ α' + c/K                    (c: smoothing, the paper's 1e-3)

Two changes for a stage of SFT, both stated: (1) the paper trains a small proxy with the loss reweighted by α and
then trains the real model on the averaged ᾱ; here the stage itself samples its examples from the current α (the
online variant, as ODM does); (2) the paper's reference is a reference *model* with per-token excess clipped at
zero; here it is a per-task number — ``reference: start`` (default): each task's mean training loss over the first
``START_UPDATES`` updates in which it was drawn (the stage's starting point, averaged so that one noisy step does not
set it; the weights stay put meanwhile; the excess is then the loss *risen* above where the stage began — the
seesaw's forgetting), or ``{task: loss}`` (e.g. what a run trained on that task alone reached), or the directory of
an earlier run, whose last per-task training loss is read (resolved by
:func:`harness.data.stage_batches.reference_losses`). A task at its reference (a noise task whose reference is its own
floor) has no excess and gains nothing; a task lagging behind its reference gains.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field, ValidationInfo, field_validator

from harness.core.plugins import PluginParams
from harness.core.registry import MIXTURE_CONTROLLERS
from harness.data.steering.controller import Controller, positive_number, require_positive

START_UPDATES = 10  # reference: start — a task's reference is its mean loss over its first 10 updates


def doremi_step(log_alpha: np.ndarray, excess: np.ndarray, eta: float, smoothing: float) -> np.ndarray:
    """log α after one update on the clipped ``excess`` losses (Algorithm 1, in log space for stability)."""
    logits = log_alpha + eta * np.maximum(excess, 0.0)
    alpha = np.exp(logits - logits.max())
    alpha = (1.0 - smoothing) * alpha / alpha.sum() + smoothing / len(alpha)
    return np.log(alpha)


class DoReMiParams(PluginParams):
    """DoReMi's settings; ``reference`` is checked against the stage's tasks (validation context ``tasks``)."""

    eta: Any = Field(1.0, description="Step size η of the exponentiated-gradient update (> 0).")
    smoothing: Any = Field(1e-3, description="Smoothing c towards uniform, in (0, 1).")
    reference: Any = Field("start", description="start | an earlier run's directory | {task: loss} for every task.")

    @field_validator("eta")
    @classmethod
    def _eta(cls, value: Any) -> Any:
        return require_positive(value, "eta (the step size)")

    @field_validator("smoothing")
    @classmethod
    def _smoothing(cls, value: Any) -> Any:
        return require_positive(value, "smoothing (c)", 1.0)

    @field_validator("reference")
    @classmethod
    def _reference(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            return value  # "start", or an earlier run's directory (read when the stage is planned)
        tasks = list((info.context or {}).get("tasks", value if isinstance(value, dict) else []))
        if not isinstance(value, dict) or set(value) != set(tasks):
            raise ValueError(
                f"reference must be start, a run directory, or {{task: loss}} for each of {', '.join(tasks)}"
            )
        bad = [t for t, v in value.items() if positive_number(v, "loss") is not None]
        if bad:
            raise ValueError(f"reference losses must be numbers > 0 ({', '.join(bad)})")
        return value


@MIXTURE_CONTROLLERS.plugin("doremi")
class DoReMi(Controller):
    """Multiplicative weights on the per-task excess loss over a reference (module docstring)."""

    Params = DoReMiParams

    def __init__(self, start: np.ndarray, params: dict[str, Any], reference: np.ndarray | None = None):
        super().__init__(start, params, reference)
        self.log_alpha = np.log(self.start)
        self.from_start = self.reference is None
        if self.from_start:  # "start": each task's mean loss over its first START_UPDATES updates
            self.reference = np.zeros(len(self.start))
        self.seen = np.zeros(len(self.start))  # updates in which each task was drawn

    def probs(self) -> np.ndarray:
        return np.exp(self.log_alpha)

    def update(self, losses: np.ndarray, examples: np.ndarray, sampled: np.ndarray | None = None) -> None:
        # ``sampled`` is unused: DoReMi's step is the excess loss itself, not weighted by the chance of a draw
        seen = (examples > 0) & np.isfinite(losses)
        ready = seen & (self.seen >= START_UPDATES) if self.from_start else seen
        if self.from_start:  # the running mean of the first START_UPDATES losses of each task
            warming = seen & (self.seen < START_UPDATES)
            self.reference[warming] += (losses[warming] - self.reference[warming]) / (self.seen[warming] + 1)
        self.seen += seen
        excess = np.where(ready, np.nan_to_num(losses) - self.reference, 0.0)
        self.log_alpha = doremi_step(self.log_alpha, excess, float(self.params["eta"]), float(self.params["smoothing"]))

    def state(self) -> dict[str, Any]:
        return {"log_alpha": self.log_alpha.tolist(), "reference": self.reference.tolist(), "seen": self.seen.tolist()}

    def load(self, state: dict[str, Any]) -> None:
        self.log_alpha = np.array(state["log_alpha"])
        self.reference, self.seen = np.array(state["reference"]), np.array(state["seen"])
