"""One process: the training loop's data-parallel hooks when there is nothing to exchange, so that
:func:`harness.training.loop.train_stage` calls the same hooks in one process as on several ranks, with no branch on
whether there are ranks (a null object in place of :class:`harness.training.parallel.ddp.DataParallel`).

Each hook does what ``DataParallel``'s would do on a world of one rank, without a collective; the loss mean is the
plain weighted mean (:func:`harness.training.losses.weighted_mean`), which is what ``DataParallel.global_mean``
computes on one rank but in the one-process order of operations, so one-process numbers do not move.
"""

from __future__ import annotations

import functools

import torch

from harness.data.batches import Batch
from harness.training.adapters import unwrap
from harness.training.forward import supervised_logits
from harness.training.losses import weighted_mean


def _logits(
    model, input_ids, attention_mask, selected, compiled=False, position_ids=None, segments=None, extra_inputs=None
):
    return supervised_logits(
        unwrap(model), input_ids, attention_mask, selected, compiled, position_ids, segments, extra_inputs
    )


class WholeModelHooks:
    """The hooks of a loop whose optimiser trains the model itself (one process, DDP; FSDP overrides them)."""

    def sync(self, model: torch.nn.Module) -> None:
        """Bring ``model`` up to date with the trained module before it is evaluated or saved (here: it is that)."""

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """The optimiser's state for a resumable checkpoint (the one-process format)."""
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load a resume point's optimiser state (the one-process format) into this process's optimiser."""
        optimizer.load_state_dict(state)


class SingleProcess(WholeModelHooks):
    """The loop's hooks in one process: rank 0 of a world of 1, every exchange a no-op."""

    rank, world, sharded = 0, 1, False

    def trained_module(self, model: torch.nn.Module, precision: str) -> torch.nn.Module:
        """The optimiser trains ``model`` itself."""
        return model

    def shard(self, batch: Batch) -> Batch:
        """The whole batch is this process's."""
        return batch

    def logits_module(self, model: torch.nn.Module):
        """The training forward: the model body, then the head at the selected positions only."""
        return functools.partial(_logits, model)

    def loss_mean(self, per_token, task_of_token, first, spec, tasks, by_example, n_examples) -> torch.Tensor:
        """The batch's weighted token mean (:func:`harness.training.losses.weighted_mean`)."""
        return weighted_mean(per_token, task_of_token, first, spec, tasks, by_example, n_examples)

    def sum_window(self, window) -> None:
        """A window's sums are already this process's totals."""

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over one process is the tensor itself."""
        return tensor

    def bad_ranks(self, loss_bad: bool, grad_bad: bool) -> list[int]:
        """No other rank to hear from: the loop's own flags decide."""
        return []

    def all_gather(self, obj) -> list:
        """``obj`` of every rank, in rank order: this process's alone (the packing check's verdict)."""
        return [obj]
