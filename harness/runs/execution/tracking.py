"""Where metrics go: the local store (always), wandb (offline by default) and the console.

Every value is logged once through :meth:`Tracker.log`, which writes the same numbers to the store and to wandb
under the metric contract's key: ``"{metric}/{split}/{task}"`` per task, ``"{split}/{metric}"`` run-level
(``train/loss``, ``train/lr``…).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from harness.config import WandbSpec
from harness.core.store import MetricsStore, Row


def wandb_key(metric: str, split: str, task: str | None) -> str:
    return f"{metric}/{split}/{task}" if task is not None else f"{split}/{metric}"


class Tracker:
    """Fans rows out to the store and wandb; owns the wandb run."""

    def __init__(
        self,
        wandb_spec: WandbSpec,
        run_dir: Path,
        run_id: str,
        config: dict[str, Any],
        resume_filter: Callable[[str, int, str], bool] | None = None,
    ):
        """``wandb_spec``: the experiment's ``tracking.wandb``; ``config``: the resolved experiment wandb records;
        ``resume_filter(stage, step, metric)``: continue a run, keeping the stored rows it accepts."""
        self.store = MetricsStore(run_dir, run_id)
        if resume_filter is not None:
            self.store.load_existing(resume_filter)
        self.run_dir = run_dir
        self.wandb_run = None
        if wandb_spec.mode != "disabled":
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb

            self.wandb_run = wandb.init(
                mode=wandb_spec.mode,
                project=wandb_spec.project,
                entity=wandb_spec.entity,
                group=wandb_spec.group,
                tags=wandb_spec.tags,
                name=run_id,
                id=run_id,
                dir=str(run_dir),
                config=config,
                reinit="create_new",
                resume="allow" if resume_filter is not None else None,
                settings=wandb.Settings(console="off", silent=True),
            )

    def existing_rows(self) -> list[Row]:
        """Rows already in the store (those kept from a resumed run)."""
        return self.store.rows()

    def log(self, rows: Iterable[Row], step: int, cached_from: str | None = None) -> None:
        """``cached_from``: the rows are copied from the stage cache, computed by that run."""
        rows = list(rows)
        self.store.log(rows, cached_from)
        if self.wandb_run is not None and rows:
            self.wandb_run.log({wandb_key(r.metric, r.split, r.task): r.value for r in rows}, step=step)

    def log_table(self, key: str, columns: list[str], data: list[list[Any]], step: int) -> None:
        if self.wandb_run is not None and data:
            import wandb

            self.wandb_run.log({key: wandb.Table(columns=columns, data=data)}, step=step)

    def summary(self, values: dict[str, Any]) -> None:
        if self.wandb_run is not None:
            self.wandb_run.summary.update(values)

    def flush(self) -> None:
        self.store.flush()

    def close(self, exit_code: int = 0) -> None:
        self.store.flush()
        if self.wandb_run is not None:
            self.wandb_run.finish(exit_code=exit_code)
            self.wandb_run = None
