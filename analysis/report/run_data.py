"""One run as every section of its report reads it (:class:`RunData`), loaded once: the store, config and summary,
the splits and tasks, the seesaw events of every family the run tested and the untested rule on mode_ok."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analysis import frames as F
from analysis import plots as P
from analysis.loading import AnalysisError, load_run, read_config, read_summary
from harness.core.seesaw_families import EVENT_METRICS


@dataclass
class RunData:
    """One run as every section of its report reads it, loaded once."""

    run_dir: Path
    frame: pl.DataFrame
    config: dict
    summary: dict
    metric: str
    delta: float
    splits: list[str]
    primary: str  # the split findings and folded tables read: heldout when evaluated
    tasks: list[str]
    colors: dict[str, str]
    events: pl.DataFrame
    mode_events: pl.DataFrame
    expected: set[str]  # tasks whose gold answers start with a hijack word
    bounds: pl.DataFrame
    name: str
    run_id: str


def load_run_data(run_dir: Path, metric: str, delta: float | None) -> RunData:
    """Read the run's store, config and summary; ``delta`` defaults to the config's ``eval.seesaw_delta``."""
    frame = load_run(run_dir)
    if frame.is_empty():
        raise AnalysisError(f"{run_dir}: the store is empty (the run has not evaluated yet)")
    config = read_config(run_dir)
    summary = read_summary(run_dir)
    delta = float(delta if delta is not None else (config.get("eval") or {}).get("seesaw_delta", 0.15))
    evals = F.eval_rows(frame)
    splits = list(
        dict.fromkeys(s for s in (config.get("eval") or {}).get("splits", []) if s in evals["split"].unique().to_list())
    ) or sorted(evals["split"].unique().to_list())
    tasks = sorted(evals["task"].unique().to_list())
    # The in-run definition reads greedy and ft_hijack; the same definition on mode_ok shows a seesaw in the answers'
    # *form* (yes/no vs open answers) that exact match at 0 would hide.
    return RunData(
        run_dir=run_dir,
        frame=frame,
        config=config,
        summary=summary,
        metric=metric,
        delta=delta,
        splits=splits,
        primary="heldout" if "heldout" in splits else splits[0],
        tasks=tasks,
        colors=P.task_colors(tasks),
        events=F.seesaw_events(frame, delta, metrics=EVENT_METRICS),  # every family the run tested
        mode_events=F.seesaw_events(frame, delta, metrics=["mode_ok"]),
        expected=F.hijack_tasks(run_dir),
        bounds=F.stage_bounds(frame),
        name=config.get("name") or summary.get("experiment") or run_dir.name,
        run_id=frame["run_id"][0],
    )
