"""Data-parallel training over torch.distributed: the process group, the launch through torchrun, and the few
hooks the training loop calls when there is more than one rank.

``harness run FILE --nproc N`` re-runs the same command as N ranks through torchrun's own launcher, called in this
process (:func:`launch`: it returns the exit code of the first rank that failed, which the ``torchrun`` command
turns into 1); any torchrun invocation, multi-node included, works the same: the ranks read torchrun's
environment. Each rank then runs the whole experiment:

- the data pipeline and the seeded mixture sampler are global and identical on every rank; each rank trains on
  its contiguous slice of the rows of every global batch (:meth:`DataParallel.shard`), so ``batch_size`` is the
  global batch and the mixture's composition is unchanged;
- gradients are exchanged by ``DistributedDataParallel`` (its all-reduce averages over ranks); the loss each rank
  back-propagates is its share of the *global* supervised-token mean, ``Σ_rank-tokens w·l / Σ_all-tokens w ×
  world`` (the denominator all-reduced), so the gradient equals one process's on the whole batch — not the mean
  of per-rank means, which weighs a rank with few supervised tokens like one with many;
- the non-finite flag is all-reduced, so a NaN on one rank stops every rank at that step (the report names it);
- evaluation is sharded: each rank runs its share of the eval batches on the identical model and the per-item
  results are gathered (:mod:`harness.evaluation.sharding`), so every rank holds the one-process result; only
  rank 0 writes: every other rank runs into a scratch directory it deletes, with wandb off and no console;
- resume points gather every rank's RNG state and metrics window to rank 0 (:mod:`harness.checkpoint`); a resumed
  rank other than 0 starts from a scratch copy of rank 0's run directory (:func:`rank_session`).

A stage with ``train.parallel: fsdp`` trains a sharded replica through the same hooks (:mod:`harness.fsdp`).

Collectives time out after ``HARNESS_DIST_TIMEOUT`` seconds (default 1800), so a rank that dies cannot leave
the others waiting forever. The backend is nccl on GPUs, gloo on CPU.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import signal
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Iterator, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from harness.config import dump_yaml
from harness.data import Batch
from harness.rundir import RunDirError  # one line, exit 2 (harness.cli_errors)


class ParallelError(ValueError):
    """A run that cannot train the way ``train.parallel`` asks (an unsupported model); the CLI's one-line exit 2."""


TIMEOUT_ENV = "HARNESS_DIST_TIMEOUT"
SCRATCH_ENV = "HARNESS_RANK_SCRATCH"  # where ranks other than 0 make their scratch run directories


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """The command that re-runs ``python -m harness ARGV`` (``--nproc`` removed) as ``nproc`` torchrun ranks on
    this machine."""
    args, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            args.append(a)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "harness", *args]


def launched_by_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


class _SupervisedLogits(torch.nn.Module):
    """The model's logits at the supervised positions as one module, so DDP sees the whole training forward
    (the loop calls the model body and the head separately, which DDP cannot follow)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, selected, compiled: bool = False):
        from harness.adapters import unwrap  # harness.train imports this module: a cycle at import time
        from harness.train import supervised_logits

        return supervised_logits(unwrap(self.model), input_ids, attention_mask, selected, compiled)


class DataParallel:
    """This rank's view of the process group, with the hooks :func:`harness.train.train_stage` calls."""

    sharded = False  # harness.fsdp's subclass: the trained module's weights exist in full only inside its forward

    def __init__(self):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._wrapped: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()

    def trained_module(self, model: torch.nn.Module, precision: str) -> torch.nn.Module:
        """The module whose parameters the stage's optimiser trains: ``model`` itself (FSDP: a sharded replica)."""
        return model

    def sync(self, model: torch.nn.Module) -> None:
        """Bring ``model`` up to date with the trained module before it is evaluated or saved (DDP: it is that)."""

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """The optimiser's state for a resumable checkpoint (the one-process format)."""
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        """Load a resume point's optimiser state (the one-process format) into this rank's optimiser."""
        optimizer.load_state_dict(state)

    def shard(self, batch: Batch) -> Batch:
        """This rank's contiguous slice of the rows of a global batch (same padded width as the whole batch)."""
        rows = batch.input_ids.shape[0]
        if rows < self.world:
            raise ValueError(f"train.batch_size {rows} is smaller than the {self.world} ranks: each needs a row")
        start, end = rows * self.rank // self.world, rows * (self.rank + 1) // self.world
        mask = batch.attention_mask[start:end]
        return Batch(batch.input_ids[start:end], mask, batch.labels[start:end], batch.tasks[start:end],
                     int(mask.sum()), int(mask.numel()))

    def logits_module(self, model: torch.nn.Module) -> DistributedDataParallel:
        """The DDP-wrapped training forward of ``model``, rebuilt when its trainable set changed (a new stage)."""
        trainable = tuple(n for n, p in model.named_parameters() if p.requires_grad)
        cached = self._wrapped.get(model)
        if cached is None or cached[0] != trainable:
            device = next(model.parameters()).device
            ddp = DistributedDataParallel(_SupervisedLogits(model),
                                          device_ids=[device] if device.type == "cuda" else None)
            self._wrapped[model] = (trainable, ddp)
        return self._wrapped[model][1]

    def global_mean(self, per_token: torch.Tensor, weights: Optional[torch.Tensor]) -> torch.Tensor:
        """This rank's term of the global weighted token mean, scaled by the world size (DDP averages gradients)."""
        weights = torch.ones_like(per_token) if weights is None else weights.to(per_token.dtype)
        total = weights.sum().detach().float()
        dist.all_reduce(total)
        return (per_token * weights).sum() / total.clamp_min(1e-12).to(per_token.dtype) * self.world

    def sum_window(self, window) -> None:
        """Sum a training-metrics window's per-task losses, token counts and token totals over ranks (in place);
        the grad norm is the same on every rank after the all-reduce, so it stays."""
        counts = torch.tensor([window.real_tokens, window.padded_tokens], dtype=torch.float64)
        for t in (window.loss_sum, window.token_count, counts):
            dist.all_reduce(t)
        window.real_tokens, window.padded_tokens = int(counts[0]), int(counts[1])

    def bad_ranks(self, loss_bad: bool, grad_bad: bool) -> list[int]:
        """The ranks where a non-finite step began: those whose loss was non-finite, else those whose gradient
        was (a NaN loss on one rank reaches every rank's gradient through the all-reduce). Every rank learns
        them; one host sync."""
        flags = torch.zeros(self.world, dtype=torch.int32)
        flags[self.rank] = 2 * int(loss_bad) + int(grad_bad)
        dist.all_reduce(flags)
        values = flags.tolist()
        return [r for r, f in enumerate(values) if f >= 2] or [r for r, f in enumerate(values) if f]

    def gather(self, obj) -> Optional[list]:
        """``obj`` of every rank, in rank order, on rank 0 (None on the others): resume points' per-rank state."""
        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def all_gather(self, obj):
        """``obj`` of every rank, in rank order (sharded evaluation's per-item results)."""
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def report_of(self, rank: int, report: dict) -> dict:
        """``rank``'s non-finite report on every rank (it names the module and parameters as that rank saw them)."""
        box = [report]
        dist.broadcast_object_list(box, src=rank)
        return {**box[0], "rank": rank}


_CURRENT: Optional[DataParallel] = None


def current(parallel: str = "ddp") -> Optional[DataParallel]:
    """The data-parallel hooks when this process is one of several ranks, else None; ``parallel="fsdp"`` (a
    stage's ``train.parallel``): new hooks for one FSDP stage (:mod:`harness.fsdp`)."""
    if _CURRENT is None or parallel == "ddp":
        return _CURRENT
    from harness.fsdp import FullyShardedDataParallel  # imports this module: a cycle at import time

    return FullyShardedDataParallel()


def kill_step(spec) -> Optional[int]:
    """``debug.kill_rank``'s step when it names this process's rank (0 in a single process), else None."""
    here = current()
    return spec.step if spec is not None and spec.rank == (here.rank if here is not None else 0) else None


def launch(nproc: int, argv: list[str]) -> int:
    """Run ``harness ARGV`` as ``nproc`` ranks (torchrun's own code, in this process) and return the exit code of
    the rank that failed first (a NaN stop's 3 stays 3; torchrun itself would say 1), or 128 + the signal that
    killed it; when a rank fails, torchrun stops the others, and one line says which rank and how."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # The ranks' scratch directories go under one the launcher deletes: a killed rank cannot delete its own.
    scratch = tempfile.mkdtemp(prefix="harness-ranks-")
    os.environ[SCRATCH_ENV] = scratch
    try:
        run(parse_args(torchrun_command(nproc, argv)[3:]))
        return 0
    except SignalException as e:  # Ctrl-C / SIGTERM to the launcher: torchrun has stopped the ranks
        print(f"error: stopped by {signal.Signals(e.sigval).name} (torchrun stopped the {nproc} ranks)",
              file=sys.stderr, flush=True)
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        rank, code = _first_failure(e.failures)
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        print(f"error: rank {rank} of {nproc} {how} (the first rank to fail; torchrun stopped any other still "
              "running)", file=sys.stderr, flush=True)
        return 128 - code if code < 0 else code
    finally:
        del os.environ[SCRATCH_ENV]
        shutil.rmtree(scratch, ignore_errors=True)


def _first_failure(failures: dict) -> tuple[int, int]:
    """The rank that failed first and its exit code. torchrun's timestamps are whole seconds, so ranks that died in
    the same second tie; the survivors' deaths are effects — a gloo error (exit 1) or torchrun's own SIGTERM when it
    stops them — so a rank killed otherwise, or one that exited with its own code, goes first."""
    effects = (1, -signal.SIGTERM)

    def order(item):
        rank, failure = item
        return failure.timestamp, failure.exitcode in effects, rank
    rank, failure = min(failures.items(), key=order)
    return rank, failure.exitcode


def _scratch_for_resume(run_dir: Path, scratch: Path) -> None:
    """A rank other than 0 resuming: its scratch run directory starts as a copy of rank 0's ``run_dir`` (store,
    samples, config), with symbolic links to the checkpoints it reads. What it writes goes into the scratch copy:
    checkpoint writes replace the links (:func:`harness.checkpoint.atomic_directory`), never their targets."""
    if not (run_dir / "checkpoints").is_dir():
        raise RunDirError(f"--resume: this rank cannot see {run_dir}/checkpoints (ranks on several machines need the "
                          "run directory on a shared filesystem, or a copy of it on every node)")
    shutil.copytree(run_dir, scratch, ignore=shutil.ignore_patterns("checkpoints", "wandb", ".*"))
    for sub in ("", "resume"):
        source = run_dir / "checkpoints" / sub
        if source.is_dir():
            (scratch / "checkpoints" / sub).mkdir(parents=True, exist_ok=True)
            for entry in source.iterdir():
                if entry.name != "resume" and not entry.name.startswith("."):
                    (scratch / "checkpoints" / sub / entry.name).symlink_to(entry.resolve())


def _warm_base_model(exp) -> None:
    """Rank 0 pretrains (or finds) the cached builtin base model before the others read the cache."""
    if exp.model.hf or exp.model.pretrain is None:
        return
    from harness.prepare import build_task_data  # torch-free module imports stay light: see harness.cli
    from harness.pretrain import builtin_base

    data = build_task_data(exp)
    all_train = [ex for splits in data.splits.values() for ex in splits["train"]]
    builtin_base(exp.model, data.corpus, all_train, exp.seed, None)


@contextlib.contextmanager
def rank_session(exp, run_dir: Path, resume: bool = False) -> Iterator[tuple[object, Path]]:
    """Join the process group torchrun set up and yield ``(experiment, run directory)`` for this rank: rank 0's
    are the given ones; the others get a scratch directory (deleted afterwards) and no wandb or console. With
    ``resume`` the scratch directory starts as rank 0's run (every rank must be able to read it: one machine, or a
    shared filesystem)."""
    global _CURRENT
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = datetime.timedelta(seconds=float(os.environ.get(TIMEOUT_ENV, "1800")))
    dist.init_process_group(backend, timeout=timeout)
    scratch = None
    try:
        if dist.get_rank() == 0:
            _warm_base_model(exp)
        else:
            scratch = Path(tempfile.mkdtemp(prefix=f"harness-rank{dist.get_rank()}-", dir=os.environ.get(SCRATCH_ENV)))
            exp = exp.model_copy(update={"tracking": exp.tracking.model_copy(update={
                "console": False, "wandb": exp.tracking.wandb.model_copy(update={"mode": "disabled"})})})
            if resume:  # before the barrier: rank 0 starts rewriting its store and samples after it
                _scratch_for_resume(run_dir, scratch / "run")
                # this rank's experiment differs in tracking only: the resume's same-experiment check compares it
                (scratch / "run" / "config.resolved.yaml").write_text(dump_yaml(exp.resolved_dict()))
            run_dir = scratch / "run"
        dist.barrier()
        _CURRENT = DataParallel()
        yield exp, run_dir
    finally:
        _CURRENT = None
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        dist.destroy_process_group()
