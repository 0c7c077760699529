"""The loop's side of an adaptive mixture: per-task training-loss sums since the controller's last update (made on
the training device, a resumed stage's too: no per-step host copy), all-reduced over data-parallel ranks at each
update so every rank feeds its stream the same numbers — or, for the signal ``steering_error``, each task's error on
the steering split measured at the update —, and the weight trajectory as ``mixture_weight`` rows (split ``train``,
one per task).

The stream itself (:class:`harness.data.steering.stream.AdaptiveStream`) draws the global batch; each rank trains
its slice of it (``parallel.shard``), exactly as with a precomputed static stream.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from harness.core.store import Row
from harness.data.batches import task_share_max


class Steering:
    """Feeds ``stream`` (an AdaptiveStream) after the batches it names (``stream.updates_after``); ``state``
    continues the partial sums of a resumed stage (this rank's own); ``parallel``: the loop's hooks
    (:func:`harness.training.parallel.loop_hooks`); ``device``: the training device, where the sums live;
    ``measure``: the signal ``steering_error``'s measurement (``{task: (error, n, low, high)}``), which then replaces
    the training losses and is logged as ``steering_error`` rows (split ``train``) with its item count and interval."""

    def __init__(
        self,
        stream,
        loop_tasks: list[str],
        stage: str,
        parallel,
        device: torch.device,
        state: dict[str, Any] | None = None,
        measure: Callable[[], dict[str, tuple[float, int, float, float]]] | None = None,
    ):
        self.stream, self.stage, self.parallel, self.measure = stream, stage, parallel, measure
        self.global_share: float | None = None  # the last global batch's largest task share (next_batch)
        self.columns = [loop_tasks.index(t) for t in stream.tasks]  # the stream's tasks among the loop's
        zeros = [0.0] * len(loop_tasks)
        # On the training device from the start, a resumed stage's too: an update may come before any trained step
        # (a skipped first step), and what the all-reduce is handed must be where the losses are added
        self.loss_sum = torch.tensor(state["loss_sum"] if state else zeros, dtype=torch.float64, device=device)
        self.token_count = torch.tensor(state["token_count"] if state else zeros, dtype=torch.float64, device=device)

    def next_batch(self, device):
        """The step's batch: the stream's next global batch, this rank's slice of it, on ``device``."""
        batch = self.stream.next_batch()
        # the largest task share of the global batch (train/batch_task_share_max), before this rank takes its slice
        self.global_share = task_share_max(batch.tasks)
        return self.parallel.shard(batch).to(device)

    def add(self, ce: torch.Tensor, task_of_token: torch.Tensor) -> None:
        """A trained step's per-token cross-entropy, summed per task (on the training device, as the sums are)."""
        self.loss_sum.index_add_(0, task_of_token, ce.detach().double())
        self.token_count.index_add_(0, task_of_token, torch.ones_like(ce, dtype=torch.float64))

    def after_step(self, batch_index: int, step: int) -> list[Row]:
        """At an update step (``stream.updates_after``): all-reduce the sums (or measure the steering split), update
        the controller and return the new weights' rows (and the measured errors'); otherwise nothing."""
        if not self.stream.updates_after(batch_index):
            return []
        measured: list[Row] = []
        if self.measure is not None:  # steering_error: every rank measures the same model on the steering split
            errors = self.measure()
            signal = np.array([errors[t][0] for t in self.stream.tasks])
            measured = [
                Row(self.stage, step, t, "train", "steering_error", errors[t][0], None, *errors[t][1:])
                for t in self.stream.tasks
            ]
        else:
            sums = self.parallel.all_reduce_sum(torch.stack([self.loss_sum, self.token_count]))
            loss_sum, count = sums.cpu().numpy()[:, self.columns]
            signal = np.where(count > 0, loss_sum / np.maximum(count, 1.0), math.nan)
        self.stream.observe(signal)
        self.loss_sum.zero_()
        self.token_count.zero_()
        return measured + self.weight_rows(step)

    def weight_rows(self, step: int) -> list[Row]:
        """The weights the next draws use, one ``mixture_weight`` row per task."""
        return [
            Row(self.stage, step, task, "train", "mixture_weight", float(w))
            for task, w in zip(self.stream.tasks, self.stream.weights())
        ]

    def state(self) -> dict[str, Any]:
        """This rank's partial sums since the last update (a resume point keeps each rank's own)."""
        return {"loss_sum": self.loss_sum.tolist(), "token_count": self.token_count.tolist()}
