"""Seed replicates: one experiment run once per seed, as a *group* directory.

``harness run FILE --seeds 0,1,2`` (or ``seeds: [0, 1, 2]`` in the file) runs replicate ``s`` into
``<group>/seed-<s>/`` — an ordinary run directory — with ``seed: s`` (model initialisation, pretraining of a
builtin base, data order) and ``data_seed`` pinned to the experiment's data seed, so that every replicate trains on
the same task pools and is scored on the same eval items: the spread across seeds is then training noise alone,
not a different test set. (To vary the task data too, give each run its own ``data_seed``.)

Replicates run one after another in this process, or ``jobs`` at a time as ``harness run`` subprocesses, each
writing its console output to ``<group>/seed-<s>.log``, or as the jobs of one SLURM job array (``--launcher
slurm``: :mod:`harness.studies.launch`; their logs and jobs file in ``<group>/slurm/``), each resuming from its
resume point when its job is requeued. ``group.json`` in the group directory marks it
(:data:`GROUP_FILE`) and records each replicate's status; :mod:`analysis.group` reads it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.config import Experiment
from harness.core.metrics import GROUP_FILE
from harness.core.store import atomic_write_text
from harness.studies.launch import Launcher, Task
from harness.studies.launch.run_job import RunJob


class SeedsError(ValueError):
    """A ``--seeds`` value that is not a list of distinct non-negative integers."""


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` → ``[0, 1, 2]``; a one-line :class:`SeedsError` naming the bad part otherwise."""
    seeds = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise SeedsError(f"--seeds {text!r}: {part!r} is not a non-negative integer (give e.g. --seeds 0,1,2)")
        seeds.append(int(part))
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise SeedsError(f"--seeds {text!r}: seed(s) {', '.join(map(str, repeated))} given more than once")
    return seeds


def replicate_dir(group_dir: Path, seed: int) -> Path:
    return group_dir / f"seed-{seed}"


def pinned_data_seed(exp: Experiment) -> int:
    return exp.data_seed if exp.data_seed is not None else exp.seed


def replicate(exp: Experiment, seed: int) -> Experiment:
    """The experiment of one replicate: ``seed`` replaced, the task data's seed pinned, no ``seeds`` list."""
    return exp.model_copy(update={"seed": seed, "seeds": None, "data_seed": pinned_data_seed(exp)})


def _write_group(group_dir: Path, exp: Experiment, seeds: Sequence[int], status: dict[int, str]) -> None:
    group_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        group_dir / GROUP_FILE,
        json.dumps(
            {
                "kind": "seeds",
                "experiment": exp.name,
                "seeds": list(seeds),
                "data_seed": pinned_data_seed(exp),
                "replicates": {str(s): replicate_dir(group_dir, s).name for s in seeds},
                "status": {str(s): status.get(s, "pending") for s in seeds},
            },
            indent=2,
        ),
    )


def run_group(
    exp: Experiment,
    group_dir: Path,
    seeds: Sequence[int],
    *,
    jobs: int = 1,
    command: list[str] | None = None,
    echo: Callable[[str], None] = print,
    launcher: Launcher | None = None,
) -> dict[int, int]:
    """Run every replicate; returns ``{seed: exit code}``.

    ``jobs == 1`` runs them in this process (an exception ends the group, as it would a single run); otherwise
    ``command`` — ``harness run`` argv for the experiment file with its ``--set`` overrides — is started per seed
    with the replicate's seed fields set, ``jobs`` at a time. A ``launcher`` runs each as one of its tasks instead
    (empty codes: it left them running, detached; :class:`~harness.studies.launch.JobsFailed` once all ended, when
    some failed).
    """
    status: dict[int, str] = {}
    _write_group(group_dir, exp, seeds, status)
    codes: dict[int, int] = {}
    if launcher is not None:
        return _run_launched(exp, group_dir, seeds, launcher, status)
    if jobs == 1:
        from harness.runs.execution.runner import (
            run_experiment,  # torch and transformers: only when replicates run here
        )

        for seed in seeds:
            echo(f"replicate seed {seed} → {replicate_dir(group_dir, seed)}")
            status[seed] = "running"
            _write_group(group_dir, exp, seeds, status)
            try:
                run_experiment(replicate(exp, seed), replicate_dir(group_dir, seed))
            except BaseException:
                status[seed] = "failed"
                _write_group(group_dir, exp, seeds, status)
                raise
            codes[seed], status[seed] = 0, "done"
            _write_group(group_dir, exp, seeds, status)
        return codes
    if command is None:
        raise ValueError("jobs > 1 needs the harness run command of the experiment file")
    pending, running = list(seeds), {}
    while pending or running:
        while pending and len(running) < jobs:
            seed = pending.pop(0)
            running[seed] = _start(command, exp, group_dir, seed)
            status[seed] = "running"
            echo(f"replicate seed {seed} started (log: {replica_log(group_dir, seed)})")
        for seed, process in list(running.items()):
            if process.poll() is not None:
                codes[seed] = process.returncode
                status[seed] = "done" if process.returncode == 0 else f"failed (exit {process.returncode})"
                echo(f"replicate seed {seed}: {status[seed]}")
                del running[seed]
        _write_group(group_dir, exp, seeds, status)
        time.sleep(0.2)
    return codes


def _run_launched(
    exp: Experiment, group_dir: Path, seeds: Sequence[int], launcher: Launcher, status: dict[int, str]
) -> dict[int, int]:
    """The replicates as ``launcher``'s tasks ("seed <s>"), ``group.json`` updated as each ends."""
    job = RunJob(launcher.max_requeues)
    tasks = [Task(f"seed {s}", job, (replicate(exp, s), replicate_dir(group_dir, s).resolve())) for s in seeds]
    codes: dict[int, int] = {}

    def ended(task: Task, outcome: str) -> None:
        seed = int(task.name.split()[-1])
        codes[seed], status[seed] = (0, "done") if outcome == "done" else (1, f"failed ({outcome})")
        _write_group(group_dir, exp, seeds, status)

    for seed in seeds:
        status[seed] = "submitted"
    _write_group(group_dir, exp, seeds, status)
    finished = launcher.run(tasks, on_done=lambda task, value: ended(task, "done"), on_failed=ended)
    return codes if finished else {}


def replica_log(group_dir: Path, seed: int) -> Path:
    """Where a ``--jobs`` replicate's console output goes."""
    return Path(group_dir) / f"seed-{seed}.log"


def _start(command: list[str], exp: Experiment, group_dir: Path, seed: int) -> subprocess.Popen:
    out = replicate_dir(group_dir, seed)
    out.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "harness",
        *command,
        "--set",
        f"seed={seed}",
        "--set",
        "seeds=null",
        "--set",
        f"data_seed={pinned_data_seed(exp)}",
        "--out",
        str(out),
    ]
    # beside the replicate's directory, not in it: the run claims its directory only if it is empty
    with open(replica_log(group_dir, seed), "w", encoding="utf-8") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
