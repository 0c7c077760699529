"""Online Data Mixing (ODM): Albalak, Pan, Raffel & Wang 2023, "Efficient Online Data Mixing For Language Model
Pre-Training" (arXiv:2312.02406), Algorithm 1 — the mixture as a multi-armed bandit solved with Exp3 (Auer et al.
2002), each task an arm, the training loss of the task drawn its reward ("higher loss: more to learn").

Per update t (the paper updates every step; here every ``every`` steps), with K tasks:

    ε_t   = min(1/K, sqrt(ln K / (K·t)))                                 (exploration, decaying)
    π_i   = (1 − K·ε_t) · p0_i·exp(ε_{t−1}·R̂_i) / Σ_j p0_j·exp(ε_{t−1}·R̂_j) + ε_t
    R̂_i  ← α·R̂_i + (1 − α)·L_i / p_i                                    (for the arm drawn; α: smoothing)

p_i being the probability task i was drawn with: π_i floored (``floor``: the stream samples ``(1 − K·floor)·π +
floor``), which is the paper's π_i when the floor is 0.

The paper draws one domain per step and updates the R̂ of the domain drawn with its loss over its probability. A
batch here mixes tasks example by example, so every task drawn since the last update gets that same update, with L_i
its mean training loss over those steps; a task not drawn keeps its R̂ (as an arm not drawn does in the paper). The
update counter t counts updates (the paper's steps). The scale is the paper's: R̂ of a task is an average of L/π,
about K·L under a uniform π (the unbiased L·(n_i/N)/π_i would be K times smaller, and then the decaying ε_t
would let the policy barely leave uniform). ``p0``, the start weights, is uniform in the paper; a non-uniform start
is the exponential-weights prior p0 (the same algorithm from another starting distribution).

Hazard, as the reward says: a task whose loss cannot fall (noise, random labels) keeps a high loss, so ODM keeps
sampling it (the unit tests show both sides: a learnable lagging task gains, and so does a noise task).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import Field, field_validator

from harness.core.plugins import PluginParams
from harness.core.registry import MIXTURE_CONTROLLERS
from harness.data.steering.controller import Controller, positive_number


def exploration(t: int, k: int) -> float:
    """ε_t = min(1/K, sqrt(ln K / (K t))); ε_0 = 1/K (Algorithm 1's initialisation)."""
    return 1.0 / k if t <= 0 else min(1.0 / k, math.sqrt(math.log(k) / (k * t)))


def odm_policy(prior: np.ndarray, rewards: np.ndarray, t: int) -> np.ndarray:
    """π at update t from the reward estimates R̂ (exponents ε_{t−1}·R̂, mixed with ε_t of uniform)."""
    k = len(rewards)
    logits = np.log(prior) + exploration(t - 1, k) * rewards
    weights = np.exp(logits - logits.max())
    return (1.0 - k * exploration(t, k)) * weights / weights.sum() + exploration(t, k)


def odm_rewards(
    rewards: np.ndarray, losses: np.ndarray, examples: np.ndarray, policy: np.ndarray, alpha: float
) -> np.ndarray:
    """R̂ after observing per-task mean ``losses`` (nan: not drawn) of the ``examples`` drawn under ``policy``."""
    drawn = (examples > 0) & np.isfinite(losses)
    estimate = np.where(drawn, np.nan_to_num(losses) / policy, 0.0)
    return np.where(drawn, alpha * rewards + (1.0 - alpha) * estimate, rewards)


class OdmParams(PluginParams):
    """ODM's settings (raw values are kept: the stage's key and resolved file show what was written)."""

    alpha: Any = Field(0.9, description="Smoothing of the reward estimates R̂, in (0, 1).")

    @field_validator("alpha")
    @classmethod
    def _alpha(cls, value: Any) -> Any:
        if positive_number(value, "alpha", 1.0) is not None:
            raise ValueError(f"alpha (the reward estimate's smoothing) must be a number in (0, 1), got {value!r}")
        return value


@MIXTURE_CONTROLLERS.plugin("odm")
class OnlineDataMixing(Controller):
    """Exp3 over the tasks with the training loss as reward (module docstring)."""

    Params = OdmParams

    def __init__(self, start: np.ndarray, params: dict[str, Any], reference: np.ndarray | None = None):
        super().__init__(start, params, reference)
        self.rewards = np.zeros(len(self.start))
        self.t = 0  # updates made
        self.policy = self.start.copy()  # before the first update: the start weights

    def probs(self) -> np.ndarray:
        return self.policy

    def update(self, losses: np.ndarray, examples: np.ndarray, sampled: np.ndarray | None = None) -> None:
        # Exp3's importance weight is 1 / the probability the arm was actually drawn with (Albalak et al. 2023,
        # "Efficient Online Data Mixing For Language Model Pre-Training", Algorithm 1: L_i / π_i, π being what it
        # samples from). The stream samples the floored policy, which lifts a task near 0 to the floor: dividing
        # by the unfloored π would inflate that task's reward by the ratio of the two, once the decaying
        # exploration ε_t is below the floor.
        drawn_from = self.policy if sampled is None else np.asarray(sampled, dtype=np.float64)
        self.rewards = odm_rewards(self.rewards, losses, examples, drawn_from, float(self.params["alpha"]))
        self.t += 1
        self.policy = odm_policy(self.start, self.rewards, self.t + 1)  # π for the next draws

    def state(self) -> dict[str, Any]:
        return {"rewards": self.rewards.tolist(), "t": self.t, "policy": self.policy.tolist()}

    def load(self, state: dict[str, Any]) -> None:
        self.rewards, self.t = np.array(state["rewards"]), int(state["t"])
        self.policy = np.array(state["policy"])
