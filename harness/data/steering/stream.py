"""The batches of an adaptive stage, drawn as it trains: one global batch per step from the current weights.

Same seed ⇒ same draws ⇒ same losses ⇒ same weight trajectory (the controller is deterministic and has no RNG of
its own). Every data-parallel rank holds an identical stream: it draws the same global batch (each rank then trains
its slice) and is fed the same all-reduced per-task losses, so the ranks never disagree about the weights. Within a
task, examples come in a fresh random order each pass over its pool, as in a static ``weights`` mixture
(:func:`harness.data.stream.mixture_stream`); length grouping needs the stage's future batches, so an adaptive
stage has none (the config refuses ``length_grouping`` > 1 there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from harness.config import AdaptiveSpec, update_interval
from harness.core.registry import MIXTURE_CONTROLLERS
from harness.data.steering.controller import floored
from harness.data.stream import Cycler


class AdaptiveStream:
    """``len(stream)`` steps; ``next_batch()`` draws the next one; ``observe(losses)`` feeds the controller the
    per-task mean training loss of the steps since its last update (``nan`` where none), or its signal's values;
    ``state()`` / ``load()`` for resume points. ``composition`` is the effective composition of what has been drawn
    so far (live)."""

    def __init__(
        self,
        spec: AdaptiveSpec,
        pools: dict[str, list],
        steps: int,
        batch_size: int,
        rng: np.random.Generator,
        collate: Callable[[list], Any],
        dropped: dict[str, int],
        reference: dict[str, float] | None = None,
    ):
        self.spec, self.tasks, self.pools = spec, list(spec.tasks), pools
        self.steps, self.batch_size, self.rng, self.collate = steps, batch_size, rng, collate
        start = dict(spec.start) if spec.start else {t: float(len(pools[t])) for t in self.tasks}
        ref = None if reference is None else np.array([reference[t] for t in self.tasks])
        self.controller = MIXTURE_CONTROLLERS.get(spec.method)(
            np.array([start[t] for t in self.tasks]), dict(spec.params), ref
        )
        self.every = update_interval(spec, steps)
        self.controller.begin(sum(self.updates_after(i) for i in range(steps)))  # the updates the stage will make
        self.cursors = {t: Cycler(len(pools[t]), rng) for t in self.tasks}
        self.position = 0  # batches drawn
        self.pending = np.zeros(len(self.tasks))  # examples per task drawn since the last update
        self.composition = {
            t: {"examples": 0, "tokens": 0, "supervised_tokens": 0, "share": 0.0, "dropped_too_long": dropped.get(t, 0)}
            for t in self.tasks
        }

    def __len__(self) -> int:
        return self.steps

    def updates_after(self, batch_index: int) -> bool:
        """Whether the controller updates after batch ``batch_index`` of the stage: after every ``every`` batches,
        except that a measured signal (``steering_error``) skips the stage's last batch, whose weights no batch would
        draw from (a wasted evaluation)."""
        if self.spec.signal == "steering_error" and batch_index + 1 == self.steps:
            return False
        return (batch_index + 1) % self.every == 0

    def weights(self) -> np.ndarray:
        """The sampling distribution of the next draw (the controller's, floored)."""
        return floored(self.controller.probs(), self.spec.floor)

    def next_batch(self):
        """The next global batch: each example's task drawn from :meth:`weights`, then the task's next example."""
        p = self.weights()
        chosen = self.rng.choice(len(self.tasks), size=self.batch_size, p=p / p.sum())
        examples = [self.pools[self.tasks[c]][self.cursors[self.tasks[c]].next()] for c in chosen]
        np.add.at(self.pending, chosen, 1)
        self.position += 1
        for e in examples:
            c = self.composition[e.task]
            c["examples"] += 1
            c["tokens"] += e.length
            c["supervised_tokens"] += e.n_supervised
        total = self.position * self.batch_size
        for c in self.composition.values():
            c["share"] = c["examples"] / total
        return self.collate(examples)

    def observe(self, losses: np.ndarray) -> None:
        """One controller update from the per-task mean losses (in :attr:`tasks` order) of the steps since the last."""
        # the draws since the last update all came from these weights: the controller's probs move only at an update
        self.controller.update(np.asarray(losses, dtype=np.float64), self.pending.copy(), self.weights())
        self.pending[:] = 0

    def pool_examples(self) -> list:
        """Every example the stage could draw (what the special-token check must look at)."""
        return [e for t in self.tasks for e in self.pools[t]]

    def state(self) -> dict[str, Any]:
        return {
            "rng": self.rng.bit_generator.state,
            "position": self.position,
            "pending": self.pending.tolist(),
            "controller": self.controller.state(),
            "composition": self.composition,
            "cursors": {t: [c.order.tolist(), c.pos] for t, c in self.cursors.items()},
        }

    def load(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.position, self.pending = state["position"], np.array(state["pending"], dtype=np.float64)
        self.controller.load(state["controller"])
        for t, c in state["composition"].items():  # in place: the stage's plan holds this very dict
            self.composition[t].update(c)
        for t, (order, pos) in state["cursors"].items():
            self.cursors[t].order, self.cursors[t].pos = np.array(order), pos
