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
update's steps (the stage's starting point; the excess is then the loss *risen* above where the stage began — the
seesaw's forgetting), or ``{task: loss}`` (e.g. what a run trained on that task alone reached), or the directory of
an earlier run, whose last per-task training loss is read (resolved by :mod:`harness.runs.prepare`). A task at its
reference (a noise task whose reference is its own floor) has no excess and gains nothing; a task lagging behind its
reference gains.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from harness.data.steering.controller import Controller, positive_number


def doremi_step(log_alpha: np.ndarray, excess: np.ndarray, eta: float, smoothing: float) -> np.ndarray:
    """log α after one update on the clipped ``excess`` losses (Algorithm 1, in log space for stability)."""
    logits = log_alpha + eta * np.maximum(excess, 0.0)
    alpha = np.exp(logits - logits.max())
    alpha = (1.0 - smoothing) * alpha / alpha.sum() + smoothing / len(alpha)
    return np.log(alpha)


class DoReMi(Controller):
    """Multiplicative weights on the per-task excess loss over a reference (module docstring)."""

    defaults = {"eta": 1.0, "smoothing": 1e-3, "reference": "start"}

    def __init__(self, start: np.ndarray, params: dict[str, Any], reference: Optional[np.ndarray] = None):
        super().__init__(start, params, reference)
        self.log_alpha = np.log(self.start)
        if self.reference is None:
            self.reference = np.full(len(self.start), np.nan)  # "start": each task's first observed loss

    @classmethod
    def check(cls, key: str, value: Any, tasks: list[str]) -> Optional[str]:
        if key == "eta":
            return positive_number(value, "eta (the step size)")
        if key == "smoothing":
            return positive_number(value, "smoothing (c)", 1.0)
        if key == "reference":
            if isinstance(value, str):
                return None  # "start", or an earlier run's directory (read when the stage is planned)
            if not isinstance(value, dict) or set(value) != set(tasks):
                return f"reference must be start, a run directory, or {{task: loss}} for each of {', '.join(tasks)}"
            bad = [t for t, v in value.items() if positive_number(v, "loss") is not None]
            return f"reference losses must be numbers > 0 ({', '.join(bad)})" if bad else None
        return None

    def probs(self) -> np.ndarray:
        return np.exp(self.log_alpha)

    def update(self, losses: np.ndarray, examples: np.ndarray) -> None:
        seen = (examples > 0) & np.isfinite(losses)
        unset = seen & np.isnan(self.reference)
        self.reference[unset] = losses[unset]  # reference: start — the first loss observed is the reference
        excess = np.where(seen, np.nan_to_num(losses) - np.nan_to_num(self.reference), 0.0)
        self.log_alpha = doremi_step(self.log_alpha, excess, float(self.params["eta"]),
                                     float(self.params["smoothing"]))

    def state(self) -> dict[str, Any]:
        return {"log_alpha": self.log_alpha.tolist(),
                "reference": [None if np.isnan(r) else float(r) for r in self.reference]}

    def load(self, state: dict[str, Any]) -> None:
        self.log_alpha = np.array(state["log_alpha"])
        self.reference = np.array([np.nan if r is None else r for r in state["reference"]], dtype=np.float64)
