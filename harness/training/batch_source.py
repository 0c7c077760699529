"""Where a stage's batches come from, behind one interface the training loop calls at fixed points of a step: a
static stage's precomputed global batches (padded or packed), or an adaptive stage's stream, which draws each
step's batch from the weights of its controller's last update (:class:`harness.training.steering.Steering`).

Both hand the loop this rank's slice of each global batch (``parallel.shard``) and the global batch's largest task
share (``train/batch_task_share_max`` is about the batch the mixture sampler drew, not one rank's slice of it).
An adaptive stage whose signal is ``steering_error`` measures it on the model through the loop's
``measure_steering`` (the runs layer's evaluation of the steering split) at each update.
"""

from __future__ import annotations

from typing import Any

import torch

from harness.core.store import Row
from harness.data.batches import Batch, task_share_max
from harness.training.steering import Steering


class StaticBatches:
    """A stage's batches, known before it starts. The next one is copied to the device right after a step's
    backward, so that on a GPU the copy overlaps the rest of the step's work."""

    def __init__(self, batches: list[Batch], parallel):
        self.batches = [parallel.shard(b) for b in batches]
        self.shares = [task_share_max(b.tasks) for b in batches]  # of each global batch
        self._upcoming: Batch | None = None

    def __len__(self) -> int:
        return len(self.batches)

    def begin(self, index: int, device: torch.device) -> None:
        """Get batch ``index`` (where the stage starts or resumes) onto ``device``."""
        self.device = device
        self._upcoming = self.batches[index].to(device) if index < len(self.batches) else None

    def start_rows(self, index: int, step: int) -> list[Row]:
        return []

    def batch(self, index: int) -> Batch:
        return self._upcoming

    def after_backward(self, index: int) -> None:
        if index + 1 < len(self.batches):
            self._upcoming = self.batches[index + 1].to(self.device)

    def share(self, index: int) -> float:
        return self.shares[index]

    def trained(self, ce: torch.Tensor, task_of_token: torch.Tensor) -> None:
        """A static stage does not listen to its losses."""

    def after_step(self, index: int, step: int) -> list[Row]:
        return []

    def resume_state(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """``(stream, partial sums)`` for a resume point: nothing beyond the batch index for a static stage."""
        return None, None


class SteeredBatches:
    """An adaptive stage's stream (:class:`harness.data.steering.stream.AdaptiveStream`), fed the per-task training
    losses by :class:`~harness.training.steering.Steering`; each step's batch is drawn when the step begins."""

    def __init__(self, stream, steering: Steering, mixture):
        if mixture is not None:  # a resumed stage: the stream continues where its resume point left it
            stream.load(mixture)
        self.stream, self.steering = stream, steering

    def __len__(self) -> int:
        return len(self.stream)

    def begin(self, index: int, device: torch.device) -> None:
        self.device = device

    def start_rows(self, index: int, step: int) -> list[Row]:
        """The start weights, when the stage begins (not when it resumes)."""
        return self.steering.weight_rows(step) if index == 0 else []

    def batch(self, index: int) -> Batch:
        return self.steering.next_batch(self.device)

    def after_backward(self, index: int) -> None:
        """Nothing to prefetch: the next batch depends on the weights after this step."""

    def share(self, index: int) -> float:
        return self.steering.global_share

    def trained(self, ce: torch.Tensor, task_of_token: torch.Tensor) -> None:
        self.steering.add(ce, task_of_token)

    def after_step(self, index: int, step: int) -> list[Row]:
        return self.steering.after_step(index, step)

    def resume_state(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        return self.stream.state(), self.steering.state()


def batch_source(batches, loop, parallel, state, model) -> StaticBatches | SteeredBatches:
    """The source of a stage's batches: ``batches`` is a list (a static stage) or an adaptive stream; ``loop``: the
    stage's :class:`harness.training.loop.StageLoop`; ``state``: the :class:`harness.training.loop.LoopState` it
    starts from; ``model``: the model being trained (on its training device)."""
    if isinstance(batches, list):
        return StaticBatches(batches, parallel)
    measure = None
    if batches.spec.signal == "steering_error":
        if loop.measure_steering is None:
            raise ValueError(f"stage {loop.stage!r}: the signal steering_error needs a steering split to measure")

        def measure() -> dict[str, tuple[float, int, float, float]]:
            parallel.sync(model)  # FSDP: the measured weights are the trained replica's
            return loop.measure_steering()

    device = next(model.parameters()).device
    steering = Steering(batches, loop.tasks, loop.stage, parallel, device, state.steer, measure)
    return SteeredBatches(batches, steering, state.mixture)
