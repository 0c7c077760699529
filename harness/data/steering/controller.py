"""What every adaptive-mixture controller shares: its interface, the floor, and its state as JSON.

A controller is a small deterministic state machine over numpy arrays (no RNG, no torch): given the per-task
training loss of the steps since its last update (``nan`` for a task no step drew) — or, for the signal
``steering_error``, each task's error on the stage's steering split measured now —, how many examples of each
task those steps drew and the distribution they were drawn from, it moves its sampling distribution. The stream
(:mod:`harness.data.steering.stream`) samples from ``floored(controller.probs(), floor)``; every data-parallel rank
holds the same controller and feeds it the same all-reduced numbers, so all ranks draw the same global batch.

A controller is a plug-in (:mod:`harness.core.plugins`): its settings (the YAML keys under ``adaptive:`` beside the
shared ones) are the fields of its pydantic ``Params``, validated with ``context={"tasks": [...]}`` (the stage's
adaptive tasks) and reported at ``stages[i].mixture.adaptive.<key>``; it registers with
``@MIXTURE_CONTROLLERS.plugin("name")``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from harness.core.plugins import Plugin, PluginParams


def floored(probs: np.ndarray, floor: float) -> np.ndarray:
    """``(1 − K·floor)·p + floor``: every task keeps at least ``floor`` (a distribution stays one)."""
    k = len(probs)
    return (1.0 - k * floor) * probs / probs.sum() + floor


class Controller(Plugin):
    """The interface: ``begin(updates)``, ``probs()``, ``update(losses, examples, sampled)``, ``state()`` /
    ``load(state)``.

    ``sampled``: the distribution the stream drew those examples from — ``floored(probs(), floor)``, not
    ``probs()``; ``None`` (a caller without a floor): ``probs()`` itself. A controller that weights by the chance of a
    draw (ODM's importance weight) must use it.

    ``Params``: the method's own settings (the YAML keys under ``adaptive:``), each with its default; their values
    reach ``__init__`` as the plain mapping ``params`` written in the file (defaults filled). ``defaults`` (derived
    from ``Params``): ``{setting: default}`` in field order. ``signals``: the signals it can read, the first the
    default."""

    Params: ClassVar[type[PluginParams]] = PluginParams
    defaults: ClassVar[dict[str, Any]] = {}
    signals: ClassVar[tuple[str, ...]] = ("train_loss",)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.defaults = {key: field.default for key, field in cls.Params.model_fields.items()}

    def __init__(self, start: np.ndarray, params: dict[str, Any], reference: np.ndarray | None = None):
        self.start = np.asarray(start, dtype=np.float64) / np.sum(start)
        self.params = params
        self.reference = None if reference is None else np.asarray(reference, dtype=np.float64)

    def begin(self, updates: int) -> None:
        """Told once, before the stage's first draw, how many updates the stage will make (a fixed-horizon step size
        needs it); most controllers ignore it."""

    def probs(self) -> np.ndarray:
        raise NotImplementedError

    def update(self, losses: np.ndarray, examples: np.ndarray, sampled: np.ndarray | None = None) -> None:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    def load(self, state: dict[str, Any]) -> None:
        raise NotImplementedError


def positive_number(value: Any, what: str, upper: float | None = None) -> str | None:
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


def require_positive(value: Any, what: str, upper: float | None = None) -> Any:
    """``value`` if :func:`positive_number` accepts it, else ``ValueError`` with its message (for ``Params``)."""
    problem = positive_number(value, what, upper)
    if problem:
        raise ValueError(problem)
    return value
