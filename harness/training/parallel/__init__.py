"""Training on several ranks: DDP (:mod:`.ddp`: the process group and the loop's hooks) and FSDP2 (:mod:`.fsdp`),
behind one set of hooks, :class:`DataParallel`. :func:`current` is the process group's hooks (None in one process);
:func:`loop_hooks` is what the training loop calls, :class:`SingleProcess` (:mod:`.single`) in one process.
"""

from __future__ import annotations

from harness.training.parallel.ddp import DataParallel, ParallelError, active_ddp
from harness.training.parallel.fsdp import FullyShardedDataParallel
from harness.training.parallel.single import SingleProcess

__all__ = [
    "DataParallel",
    "FullyShardedDataParallel",
    "ParallelError",
    "SingleProcess",
    "current",
    "kill_step",
    "loop_hooks",
]


def current(parallel: str = "ddp") -> DataParallel | None:
    """The data-parallel hooks when this process is one of several ranks, else None; ``parallel="fsdp"`` (a
    stage's ``train.parallel``): new hooks for one FSDP stage (:mod:`harness.training.parallel.fsdp`)."""
    here = active_ddp()
    if here is None or parallel == "ddp":
        return here
    return FullyShardedDataParallel()


def loop_hooks(parallel: str = "ddp") -> DataParallel | SingleProcess:
    """The hooks the training loop calls: :func:`current`'s on several ranks, :class:`SingleProcess` in one."""
    return current(parallel) or SingleProcess()


def kill_step(spec) -> int | None:
    """``debug.kill_rank``'s step when it names this process's rank (0 in a single process), else None."""
    here = current()
    return spec.step if spec is not None and spec.rank == (here.rank if here is not None else 0) else None
