"""Data-parallel training over torch.distributed: the process group and the few hooks the training loop calls when
there is more than one rank (launching the ranks and running a rank's experiment is
:mod:`harness.runs.execution.process_ranks`).

- the data pipeline and the seeded mixture sampler are global and identical on every rank; each rank trains on
  its contiguous slice of the rows of every global batch (:meth:`DataParallel.shard`), so ``batch_size`` is the
  global batch and the mixture's composition is unchanged;
- gradients are exchanged by ``DistributedDataParallel`` (its all-reduce averages over ranks); the loss each rank
  back-propagates is its share of the *global* supervised-token mean, ``Σ_rank-tokens w·l / Σ_all-tokens w ×
  world`` (the denominator all-reduced), so the gradient equals one process's on the whole batch — not the mean
  of per-rank means, which weighs a rank with few supervised tokens like one with many;
- the non-finite flag is all-reduced, so a NaN on one rank stops every rank at that step (the report names it);
- evaluation is sharded: each rank runs its share of the eval batches on the identical model and the per-item
  results are gathered (:mod:`harness.evaluation.sharding`), so every rank holds the one-process result;
- resume points gather every rank's RNG state and metrics window to rank 0 (:mod:`harness.training.checkpoint`).

A stage with ``train.parallel: fsdp`` trains a sharded replica through the same hooks
(:mod:`harness.training.parallel.fsdp`).

Collectives time out after ``HARNESS_DIST_TIMEOUT`` seconds (default 1800), so a rank that dies cannot leave
the others waiting forever. The backend is nccl on GPUs, gloo on CPU. NCCL takes only tensors on the rank's GPU, so
every tensor the hooks hand a collective lives on :attr:`DataParallel.device`, the device of the model the stage
trains (:meth:`DataParallel.trained_module` records it); the object collectives (``gather``, ``all_gather``,
``report_of``) pickle through ``torch.cuda.current_device()``, which :func:`process_group` sets to the rank's GPU.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import weakref
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from harness.data.batches import Batch
from harness.data.packed_batches import repacked, rows_of
from harness.training.adapters import unwrap
from harness.training.forward import supervised_logits
from harness.training.losses import token_weights
from harness.training.parallel.single import WholeModelHooks


class ParallelError(ValueError):
    """A run that cannot train the way ``train.parallel`` asks (an unsupported model); the CLI's one-line exit 2."""


TIMEOUT_ENV = "HARNESS_DIST_TIMEOUT"


class _SupervisedLogits(torch.nn.Module):
    """The model's logits at the supervised positions as one module, so DDP sees the whole training forward
    (the loop calls the model body and the head separately, which DDP cannot follow)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids,
        attention_mask,
        selected,
        compiled: bool = False,
        position_ids=None,
        segments=None,
        extra_inputs=None,
    ):
        return supervised_logits(
            unwrap(self.model), input_ids, attention_mask, selected, compiled, position_ids, segments, extra_inputs
        )


class DataParallel(WholeModelHooks):
    """This rank's view of the process group, with the hooks :func:`harness.training.loop.train_stage` calls
    (``sync`` and the optimiser state as in one process: DDP trains the model itself)."""

    # harness.training.parallel.fsdp's subclass: the trained module's weights exist in full only inside its forward
    sharded = False

    def __init__(self):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._wrapped: weakref.WeakKeyDictionary[torch.nn.Module, tuple] = weakref.WeakKeyDictionary()
        # Where the hooks' own tensors live; :meth:`trained_module` sets it to the model's device at each stage.
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
        )

    def trained_module(self, model: torch.nn.Module, precision: str) -> torch.nn.Module:
        """The module whose parameters the stage's optimiser trains: ``model`` itself (FSDP: a sharded replica).
        Records the model's device, where the hooks put what they hand a collective."""
        self.device = next(model.parameters()).device
        return model

    def shard(self, batch: Batch) -> Batch:
        """This rank's contiguous slice of the rows of a global batch (same width as the whole batch): of a padded
        batch, its examples; of a packed one (:mod:`harness.data.packed_batches`), the examples those rows hold, so that
        each row is computed as in one process. A packed batch with fewer rows than ranks gives each rank its
        contiguous slice of the examples instead, packed anew. An image batch's slice keeps its rows' pixels (it
        lost them before: a data-parallel image-text run trained without its images)."""
        if batch.packed and batch.input_ids.shape[0] >= self.world:
            rows = batch.input_ids.shape[0]
            return rows_of(batch, rows * self.rank // self.world, rows * (self.rank + 1) // self.world)
        rows = len(batch.tasks)
        if rows < self.world:
            raise ValueError(f"train.batch_size {rows} is smaller than the {self.world} ranks: each needs a row")
        start, end = rows * self.rank // self.world, rows * (self.rank + 1) // self.world
        if batch.packed:
            return repacked(batch, start, end)
        return batch.row_slice(start, end)  # an image batch's slice keeps its rows' images

    def logits_module(self, model: torch.nn.Module) -> DistributedDataParallel:
        """The DDP-wrapped training forward of ``model``, rebuilt when its trainable set changed (a new stage)."""
        trainable = tuple(n for n, p in model.named_parameters() if p.requires_grad)
        cached = self._wrapped.get(model)
        if cached is None or cached[0] != trainable:
            device = next(model.parameters()).device
            # An image-text model's vision tower and projector get no gradient on a rank whose slice holds no image:
            # DDP must look for unused parameters there (they count as zero, which is their share of the sum).
            image_text = getattr(unwrap(model).config, "vision_config", None) is not None
            ddp = DistributedDataParallel(
                _SupervisedLogits(model),
                device_ids=[device] if device.type == "cuda" else None,
                find_unused_parameters=image_text,
            )
            self._wrapped[model] = (trainable, ddp)
        return self._wrapped[model][1]

    def loss_mean(self, per_token, task_of_token, first, spec, tasks, by_example, n_examples) -> torch.Tensor:
        """This rank's term of the global weighted token mean (the loss's weights: :func:`token_weights`)."""
        return self.global_mean(per_token, token_weights(task_of_token, first, spec, tasks, by_example, n_examples))

    def global_mean(self, per_token: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
        """This rank's term of the global weighted token mean, scaled by the world size (DDP averages gradients)."""
        weights = torch.ones_like(per_token) if weights is None else weights.to(per_token.dtype)
        total = weights.sum().detach().float()
        dist.all_reduce(total)
        return (per_token * weights).sum() / total.clamp_min(1e-12).to(per_token.dtype) * self.world

    def sum_window(self, window) -> None:
        """Sum a training-metrics window's per-task losses, token counts and token totals over ranks (in place),
        as one float64 all-reduce on the model's device (a window without a successful step still has its sums
        on the CPU, where they were made); the grad norm is the same on every rank after the all-reduce, so it
        stays."""
        n, dtype = window.loss_sum.numel(), window.loss_sum.dtype
        packed = torch.cat(
            [
                window.loss_sum.to(self.device, torch.float64),
                window.token_count.to(self.device, torch.float64),
                torch.tensor([window.real_tokens, window.padded_tokens], dtype=torch.float64, device=self.device),
            ]
        )
        dist.all_reduce(packed)
        window.loss_sum, window.token_count = packed[:n].to(dtype), packed[n : 2 * n].to(window.token_count.dtype)
        window.real_tokens, window.padded_tokens = (int(v) for v in packed[2 * n :].tolist())

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over ranks (an adaptive mixture's per-task statistics), on the hooks' device whatever
        device it came from: NCCL takes only the rank's GPU (in place when ``tensor`` is there already)."""
        tensor = tensor.to(self.device)
        dist.all_reduce(tensor)
        return tensor

    def bad_ranks(self, loss_bad: bool, grad_bad: bool) -> list[int]:
        """The ranks where a non-finite step began: those whose loss was non-finite, else those whose gradient
        was (a NaN loss on one rank reaches every rank's gradient through the all-reduce). Every rank learns
        them; one host sync."""
        flags = torch.zeros(self.world, dtype=torch.int32, device=self.device)
        flags[self.rank] = 2 * int(loss_bad) + int(grad_bad)
        dist.all_reduce(flags)
        values = flags.tolist()
        return [r for r, f in enumerate(values) if f >= 2] or [r for r, f in enumerate(values) if f]

    def gather(self, obj) -> list | None:
        """``obj`` of every rank, in rank order, on rank 0 (None on the others): resume points' per-rank state."""
        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def all_gather(self, obj):
        """``obj`` of every rank, in rank order (sharded evaluation's per-item results, the packing check's verdicts:
        :mod:`harness.runs.execution.packing_decision`)."""
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def report_of(self, rank: int, report: dict) -> dict:
        """``rank``'s non-finite report on every rank (it names the module and parameters as that rank saw them)."""
        box = [report]
        dist.broadcast_object_list(box, src=rank)
        return {**box[0], "rank": rank}


_CURRENT: DataParallel | None = None


@contextlib.contextmanager
def process_group() -> Iterator[int]:
    """Join the process group torchrun set up (nccl on GPUs, each rank on its ``LOCAL_RANK`` device; gloo on CPU)
    and yield this rank; the group is destroyed on the way out."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "1800")))
    dist.init_process_group(backend, timeout=timeout)
    try:
        yield dist.get_rank()
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def active() -> Iterator[DataParallel]:
    """Make this rank's :class:`DataParallel` the one :func:`harness.training.parallel.current` returns, for the
    experiment run inside (after every rank has reached this point)."""
    global _CURRENT
    dist.barrier()
    _CURRENT = DataParallel()
    try:
        yield _CURRENT
    finally:
        _CURRENT = None


def active_ddp() -> DataParallel | None:
    """This rank's hooks while :func:`active`, else None (one process)."""
    return _CURRENT
