"""A distributed run's ranks: launching ``harness run … --nproc N`` as N torchrun ranks, and the rank session in
which each rank runs the whole experiment.

``harness run FILE --nproc N`` re-runs the same command as N ranks through torchrun's own launcher, called in this
process (:func:`launch`: it returns the exit code of the first rank that failed, which the ``torchrun`` command
turns into 1); any torchrun invocation, multi-node included, works the same: the ranks read torchrun's
environment. ``--nodes M`` inside a SLURM allocation (one ``srun`` task per node) takes the rendezvous from SLURM's
environment (:func:`slurm_rendezvous`). Each rank then runs the whole experiment inside :func:`rank_session` (the
training hooks it activates are :mod:`harness.training.parallel`): only rank 0 writes; every other rank runs into a
scratch directory it deletes, with wandb off and no console; a resumed rank other than 0 starts from a scratch copy
of rank 0's run directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harness.config import dump_yaml
from harness.runs.execution.rundir import RunDirError  # one line, exit 2 (harness.cli.errors)
from harness.runs.planning.prepare import warm_base
from harness.training.parallel import ddp

SCRATCH_ENV = "HARNESS_RANK_SCRATCH"  # where ranks other than 0 make their scratch run directories


class RendezvousError(ValueError):
    """``--nodes`` outside a SLURM allocation that gives them (one line, exit 2)."""


def slurm_rendezvous(nodes: int, environ=None) -> list[str]:
    """torchrun's multi-node options read from SLURM's environment: the first host of the allocation
    (``scontrol show hostnames $SLURM_JOB_NODELIST``) as the c10d endpoint (port ``$MASTER_PORT``, else 29500),
    ``$SLURM_JOB_ID`` as the rendezvous id, ``$SLURM_NODEID`` as this node's rank."""
    environ = os.environ if environ is None else environ
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not environ.get("SLURM_JOB_ID") or not nodelist:
        raise RendezvousError(
            f"--nodes {nodes}: the rendezvous is read from SLURM's environment — run it in an sbatch script, one srun "
            "task per node (docs/distributed.md), or call torchrun with --rdzv-endpoint yourself"
        )
    have = int(environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or 0)
    if have != nodes:
        raise RendezvousError(f"--nodes {nodes}, but this SLURM allocation has {have} node(s) ({nodelist})")
    import subprocess

    hosts = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
    ).stdout.split()
    return [
        f"--nnodes={nodes}",
        f"--node-rank={environ.get('SLURM_NODEID', '0')}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={hosts[0]}:{environ.get('MASTER_PORT', '29500')}",
        f"--rdzv-id={environ['SLURM_JOB_ID']}",
    ]


def torchrun_command(nproc: int, argv: list[str], nodes: int = 1) -> list[str]:
    """The command that re-runs ``python -m harness ARGV`` (``--nproc`` and ``--nodes`` removed) as ``nproc``
    torchrun ranks on this machine, or on each of ``nodes`` SLURM nodes (:func:`slurm_rendezvous`)."""
    args, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--nproc", "--nodes"):
            skip = True
        elif not a.startswith(("--nproc=", "--nodes=")):
            args.append(a)
    where = ["--standalone"] if nodes == 1 else slurm_rendezvous(nodes)
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *where,
        f"--nproc-per-node={nproc}",
        "-m",
        "harness",
        *args,
    ]


def launched_by_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1


def launch(nproc: int, argv: list[str], nodes: int = 1) -> int:
    """Run ``harness ARGV`` as ``nproc`` ranks (torchrun's own code, in this process) and return the exit code of
    the rank that failed first (a NaN stop's 3 stays 3; torchrun itself would say 1), or 128 + the signal that
    killed it; when a rank fails, torchrun stops the others, and one line says which rank and how. Raises
    :class:`RendezvousError` (before any rank starts) for ``nodes`` > 1 outside a SLURM allocation of that size."""
    command = torchrun_command(nproc, argv, nodes)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # The ranks' scratch directories go under one the launcher deletes: a killed rank cannot delete its own.
    scratch = tempfile.mkdtemp(prefix="harness-ranks-")
    os.environ[SCRATCH_ENV] = scratch
    try:
        run(parse_args(command[3:]))
        return 0
    except SignalException as e:  # Ctrl-C / SIGTERM to the launcher: torchrun has stopped the ranks
        print(
            f"error: stopped by {signal.Signals(e.sigval).name} (torchrun stopped the {nproc} ranks)",
            file=sys.stderr,
            flush=True,
        )
        return 128 + int(e.sigval)
    except ChildFailedError as e:
        rank, code = _first_failure(e.failures)
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        print(
            f"error: rank {rank} of {nproc} {how} (the first rank to fail; torchrun stopped any other still running)",
            file=sys.stderr,
            flush=True,
        )
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
    checkpoint writes replace the links (:func:`harness.training.checkpoint.atomic_directory`), never their targets."""
    if not (run_dir / "checkpoints").is_dir():
        raise RunDirError(
            f"--resume: this rank cannot see {run_dir}/checkpoints (ranks on several machines need the "
            "run directory on a shared filesystem, or a copy of it on every node)"
        )
    shutil.copytree(run_dir, scratch, ignore=shutil.ignore_patterns("checkpoints", "wandb", ".*"))
    for sub in ("", "resume"):
        source = run_dir / "checkpoints" / sub
        if source.is_dir():
            (scratch / "checkpoints" / sub).mkdir(parents=True, exist_ok=True)
            for entry in source.iterdir():
                if entry.name != "resume" and not entry.name.startswith("."):
                    (scratch / "checkpoints" / sub / entry.name).symlink_to(entry.resolve())


@contextlib.contextmanager
def rank_session(exp, run_dir: Path, resume: bool = False) -> Iterator[tuple[object, Path]]:
    """Join the process group torchrun set up and yield ``(experiment, run directory)`` for this rank: rank 0's
    are the given ones; the others get a scratch directory (deleted afterwards) and no wandb or console. With
    ``resume`` the scratch directory starts as rank 0's run (every rank must be able to read it: one machine, or a
    shared filesystem)."""
    with ddp.process_group() as rank:
        scratch = None
        try:
            if rank == 0:
                warm_base(exp)  # rank 0 pretrains (or finds) the cached base before the others read it
            else:
                scratch = Path(tempfile.mkdtemp(prefix=f"harness-rank{rank}-", dir=os.environ.get(SCRATCH_ENV)))
                exp = exp.model_copy(
                    update={
                        "tracking": exp.tracking.model_copy(
                            update={
                                "console": False,
                                "wandb": exp.tracking.wandb.model_copy(update={"mode": "disabled"}),
                            }
                        )
                    }
                )
                if resume:  # before the barrier: rank 0 starts rewriting its store and samples after it
                    _scratch_for_resume(run_dir, scratch / "run")
                    # this rank's experiment differs in tracking only: the resume's same-experiment check compares it
                    (scratch / "run" / "config.resolved.yaml").write_text(dump_yaml(exp.resolved_dict()))
                run_dir = scratch / "run"
            with ddp.active():
                yield exp, run_dir
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
