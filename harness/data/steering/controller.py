"""What every adaptive-mixture controller shares: its interface, the floor, and its state as JSON.

A controller is a small deterministic state machine over numpy arrays (no RNG, no torch): given the per-task
training loss of the steps since its last update (``nan`` for a task no step drew) and how many examples of each
task those steps drew, it moves its sampling distribution. The stream (:mod:`harness.data.steering.stream`) samples
from ``floored(controller.probs(), floor)``; every data-parallel rank holds the same controller and feeds it the
same all-reduced numbers, so all ranks draw the same global batch.
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

import numpy as np


def floored(probs: np.ndarray, floor: float) -> np.ndarray:
    """``(1 − K·floor)·p + floor``: every task keeps at least ``floor`` (a distribution stays one)."""
    k = len(probs)
    return (1.0 - k * floor) * probs / probs.sum() + floor


class Controller:
    """The interface: ``probs()``, ``update(losses, examples)``, ``state()`` / ``load(state)``.

    ``defaults``: the method's own settings and their defaults (the YAML keys under ``adaptive:``); ``signals``: the
    signals it can read, the first the default; ``check(key, value, tasks)``: a message when a setting is invalid."""

    defaults: ClassVar[dict[str, Any]] = {}
    signals: ClassVar[tuple[str, ...]] = ("train_loss",)

    def __init__(self, start: np.ndarray, params: dict[str, Any], reference: Optional[np.ndarray] = None):
        self.start = np.asarray(start, dtype=np.float64) / np.sum(start)
        self.params = params
        self.reference = None if reference is None else np.asarray(reference, dtype=np.float64)

    @classmethod
    def check(cls, key: str, value: Any, tasks: list[str]) -> Optional[str]:
        return None

    def probs(self) -> np.ndarray:
        raise NotImplementedError

    def update(self, losses: np.ndarray, examples: np.ndarray) -> None:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    def load(self, state: dict[str, Any]) -> None:
        raise NotImplementedError


def positive_number(value: Any, what: str, upper: Optional[float] = None) -> Optional[str]:
    """A message unless ``value`` is a finite number > 0 (and < ``upper`` when given)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not np.isfinite(value)
        or value <= 0
        or (upper is not None and value >= upper)
    ):
        bound = f" and < {upper}" if upper is not None else ""
        return f"{what} must be a number > 0{bound}, got {value!r}"
    return None
