"""Seeds derived from the experiment: each task's data seed."""

from __future__ import annotations

import hashlib

from harness.config.schema import Experiment


def task_seed(exp: Experiment, task: str) -> int:
    """A task's data seed: its own, or one derived from the experiment's data seed (``data_seed``, else ``seed``)
    and the task name."""
    spec = exp.tasks[task]
    if spec.seed is not None:
        return spec.seed
    base = exp.data_seed if exp.data_seed is not None else exp.seed
    return int.from_bytes(hashlib.sha256(f"{base}/{task}".encode()).digest()[:4], "little")
