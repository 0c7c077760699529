"""Loading run and sweep directories into polars frames.

A *run directory* is what ``harness run`` writes (``metrics.parquet``, ``config.resolved.yaml``, ``samples.jsonl``,
``summary.json``); a *sweep directory* holds ``trials.parquet`` (one row per trial, each trial a run directory) and
``sweep.resolved.yaml``. Every loader here works on a run that is still going: the store is rewritten atomically,
and a missing ``summary.json`` only means the run has not finished.
"""

from __future__ import annotations

import glob as globlib
import io
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import polars as pl
import yaml

from harness.core.store import SCHEMA

PathLike = str | Path
METRICS_FILE = "metrics.parquet"
TRIALS_FILE = "trials.parquet"
CONFIG_FILE = "config.resolved.yaml"
SWEEP_CONFIG_FILE = "sweep.resolved.yaml"

# The metric-contract columns, in order (``text`` carries tables such as ft_top1 as JSON).
CONTRACT_COLUMNS = (
    "run_id",
    "stage",
    "step",
    "task",
    "split",
    "metric",
    "value",
    "time",
    "text",
    "n",
    "ci_low",
    "ci_high",
)


class AnalysisError(Exception):
    """A path that is not a run or sweep directory, or data an analysis cannot use; the message says which."""


# ----------------------------------------------------------------------------------------------------------------
# Finding directories
# ----------------------------------------------------------------------------------------------------------------


def is_run_dir(path: PathLike) -> bool:
    return (Path(path) / METRICS_FILE).is_file()


def is_sweep_dir(path: PathLike) -> bool:
    return (Path(path) / TRIALS_FILE).is_file()


def run_dirs(paths: PathLike | Sequence[PathLike]) -> list[Path]:
    """Run directories named by ``paths``: run directories themselves, glob patterns (``runs/micro/*``), sweep
    directories (their trials' directories) or any other directory (every run directory below it). Sorted, no
    duplicates; raises :class:`AnalysisError` when nothing is found."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    found: list[Path] = []
    for raw in paths:
        text = str(raw)
        candidates = [Path(p) for p in sorted(globlib.glob(text))] if globlib.has_magic(text) else [Path(text)]
        for path in candidates:
            if is_run_dir(path):
                found.append(path)
            elif is_sweep_dir(path):
                trials = pl.read_parquet(path / TRIALS_FILE)
                if "trial_dir" in trials.columns:
                    for d in trials["trial_dir"].drop_nulls().to_list():
                        d = Path(d) if Path(d).is_absolute() else path / d
                        if is_run_dir(d):
                            found.append(d)
            elif path.is_dir():
                found.extend(sorted(p.parent for p in path.rglob(METRICS_FILE)))
    unique = list(dict.fromkeys(p.resolve() for p in found))
    if not unique:
        raise AnalysisError(f"no run directory (a folder with {METRICS_FILE}) in {', '.join(map(str, paths))}")
    return unique


def _latest(root: PathLike | None, marker: str) -> Path | None:
    """The most recently written directory holding ``marker`` under ``root`` (default: the repository's ``runs/``)."""
    root = Path(root) if root is not None else Path(__file__).resolve().parents[1] / "runs"
    if not root.is_dir():
        return None
    found = [p.parent for p in root.rglob(marker)]
    return max(found, key=lambda p: (p / marker).stat().st_mtime) if found else None


def latest_run(root: PathLike | None = None) -> Path | None:
    """The most recently written run directory under ``root`` (default: ``runs/`` of the repository), or None."""
    return _latest(root, METRICS_FILE)


def latest_sweep(root: PathLike | None = None) -> Path | None:
    """The most recently written sweep directory under ``root`` (default: ``runs/`` of the repository), or None."""
    return _latest(root, TRIALS_FILE)


# ----------------------------------------------------------------------------------------------------------------
# Config flattening
# ----------------------------------------------------------------------------------------------------------------


def read_config(run_dir: PathLike) -> dict[str, Any]:
    """``config.resolved.yaml`` of a run ({} when absent)."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return {}
    return yaml.safe_load(path.read_text()) or {}


def read_summary(run_dir: PathLike) -> dict[str, Any]:
    """``summary.json`` of a finished run ({} while the run is going)."""
    path = Path(run_dir) / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def mixture_shares(mixture: Any, tasks: dict[str, Any] | None = None) -> dict[str, float]:
    """Nominal task shares of a resolved stage mixture, summing to 1: ``weights`` normalised, ``counts`` as
    n_t / Σn, ``natural`` as pool sizes (``tasks.<t>.train``) over their sum, ``adaptive`` as its start weights (the
    controller moves them: the store's ``mixture_weight`` rows say where). {} when unknown."""
    if not isinstance(mixture, dict):
        return {}
    if isinstance(mixture.get("adaptive"), dict):
        start, names = mixture["adaptive"].get("start"), mixture["adaptive"].get("tasks") or []
        mixture = {"weights": start} if isinstance(start, dict) else {"natural": names}
    if "weights" in mixture:
        raw = {t: float(w) for t, w in mixture["weights"].items()}
    elif "counts" in mixture:
        raw = {t: float(n) for t, n in mixture["counts"].items()}
    elif "natural" in mixture:
        names = mixture["natural"] or list(tasks or {})
        raw = {t: float((tasks or {}).get(t, {}).get("train", 0) or 0) for t in names}
    else:  # the short form {task: weight}
        raw = {t: float(w) for t, w in mixture.items() if isinstance(w, (int, float))}
    total = sum(raw.values())
    return {t: w / total for t, w in raw.items()} if total > 0 else {}


def flatten_config(config: dict[str, Any]) -> dict[str, Any]:  # noqa: C901 — one branch per config value type a flattened column can hold
    """A resolved experiment as flat ``{dotted.path: scalar}``.

    Stages are keyed by name, not index: ``stages.assistant.steps``, ``stages.assistant.optim.lr``. A stage's
    mixture becomes ``stages.<stage>.mixture.kind`` (weights | natural | counts | adaptive) and one *share* per task,
    ``stages.<stage>.mixture.<task>``, summing to 1 (weights normalised; counts n/Σn; natural: pool sizes), so
    runs with different mixture forms sit in the same columns; raw counts stay under
    ``stages.<stage>.mixture.counts.<task>``. Lists of scalars become JSON strings (``eval.splits``).
    """
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            if not value and prefix:
                flat[prefix] = "{}"
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, list):
            flat[prefix] = json.dumps(value)
        else:
            flat[prefix] = value

    tasks = config.get("tasks") or {}
    for key, value in config.items():
        if key != "stages":
            walk(key, value)
    for i, stage in enumerate(config.get("stages") or []):
        name = stage.get("name", str(i))
        prefix = f"stages.{name}"
        flat[f"{prefix}.index"] = i
        for key, value in stage.items():
            if key == "name":
                continue
            if key == "mixture":
                kind = next(
                    (k for k in ("weights", "natural", "counts", "adaptive") if isinstance(value, dict) and k in value),
                    "weights",
                )
                flat[f"{prefix}.mixture.kind"] = kind
                for task, share in mixture_shares(value, tasks).items():
                    flat[f"{prefix}.mixture.{task}"] = share
                if kind == "counts":
                    for task, n in value["counts"].items():
                        flat[f"{prefix}.mixture.counts.{task}"] = n
                    flat[f"{prefix}.mixture.replace"] = bool(value.get("replace", False))
                if kind == "adaptive":  # its settings: method, every, floor, … (start shares are the task columns)
                    walk(f"{prefix}.mixture.adaptive", value["adaptive"])
            else:
                walk(f"{prefix}.{key}", value)
    return flat


def _config_row(run_dir: Path, fields: bool | Sequence[str]) -> dict[str, Any]:
    flat = flatten_config(read_config(run_dir)) if fields else {}
    if fields is not True and fields:
        wanted = list(fields)
        flat = {k: v for k, v in flat.items() if any(k == w or k.startswith(w.rstrip(".*") + ".") for w in wanted)}
    return flat


def _literal(value: Any) -> pl.Expr:
    if isinstance(value, float) and math.isnan(value):
        return pl.lit(None, dtype=pl.Float64)
    if value is None:
        return pl.lit(None)
    return pl.lit(value)


# ----------------------------------------------------------------------------------------------------------------
# Loaders
# ----------------------------------------------------------------------------------------------------------------


def load_run(run_dir: PathLike) -> pl.DataFrame:
    """The metrics store of one run (finished or in progress), as written."""
    from harness.core.store import read_metrics

    if not is_run_dir(run_dir):
        raise AnalysisError(f"{run_dir}: not a run directory (no {METRICS_FILE})")
    return read_metrics(run_dir)


def load_runs(
    paths: PathLike | Sequence[PathLike], *, config: bool | Sequence[str] = True, lazy: bool = False
) -> pl.DataFrame | pl.LazyFrame:
    """Every run named by ``paths`` (directories, globs, sweep directories; see :func:`run_dirs`) as one long frame.

    Columns: the metric contract (``run_id, stage, step, task, split, metric, value, time, text, n, ci_low,
    ci_high``; the last three null in stores written before they existed), ``run_dir``,
    then the run's flattened config (:func:`flatten_config`: ``name``, ``seed``, ``stages.assistant.mixture.yesno``…;
    ``config=False`` for none, or a list of fields / prefixes such as ``["seed", "stages.assistant.mixture"]``).
    Runs with different configs are aligned by column name (missing fields are null).

    The stores are scanned lazily; ``lazy=True`` returns the :class:`polars.LazyFrame` so a filter on many large
    runs reads only what it needs (``load_runs("runs/*/*", lazy=True).filter(pl.col("metric") == "greedy")``).
    """
    frames = []
    for run_dir in run_dirs(paths):
        scan = pl.scan_parquet(run_dir / METRICS_FILE)
        have = scan.collect_schema().names()  # a store from before n / ci_low / ci_high gets them as nulls
        scan = scan.with_columns(pl.lit(None, dtype=t).alias(c) for c, t in SCHEMA.items() if c not in have)
        extra = {"run_dir": str(run_dir), **_config_row(run_dir, config)}
        scan = scan.with_columns([_literal(v).alias(k) for k, v in extra.items()])
        frames.append(scan)
    try:
        combined = pl.concat(frames, how="diagonal_relaxed")
        result = combined if lazy else combined.collect()
    except (pl.exceptions.SchemaError, pl.exceptions.ComputeError, pl.exceptions.InvalidOperationError):
        # The same config field with incompatible types across runs (e.g. an int here, a string there).
        frames = [
            f.with_columns(
                pl.col(c).cast(pl.Utf8)
                for c in f.collect_schema().names()
                if c not in CONTRACT_COLUMNS and c != "run_dir"
            )
            for f in frames
        ]
        combined = pl.concat(frames, how="diagonal_relaxed")
        result = combined if lazy else combined.collect()
    return result


def load_samples(run_dir: PathLike, lazy: bool = False) -> pl.DataFrame | pl.LazyFrame:
    """``samples.jsonl`` of a run: one row per evaluated item per evaluation (run_id, stage, step, task, split,
    prompt, gold, pred, correct, mode_ok, gold_first_rank, top5 …). An empty frame when the run wrote none.

    A run killed mid-write leaves an unfinished last line: it is skipped with a warning naming file and line
    (:func:`harness.core.jsonl.complete_jsonl_bytes`); a malformed line before it raises ``AnalysisError`` naming
    them."""
    from harness.core.jsonl import JsonlError, complete_jsonl_bytes

    path = Path(run_dir) / "samples.jsonl"
    try:
        data = complete_jsonl_bytes(path) if path.is_file() else b""
    except JsonlError as e:
        raise AnalysisError(str(e)) from None
    if not data:
        empty = pl.DataFrame(
            schema={
                "stage": pl.Utf8,
                "step": pl.Int64,
                "task": pl.Utf8,
                "split": pl.Utf8,
                "prompt": pl.Utf8,
                "gold": pl.Utf8,
                "pred": pl.Utf8,
                "correct": pl.Boolean,
            }
        )
        return empty.lazy() if lazy else empty
    # Read from the validated bytes, not the file: polars would fail on the unfinished line.
    frame = pl.read_ndjson(io.BytesIO(data), infer_schema_length=None)
    return frame.lazy() if lazy else frame


def load_sweep(sweep_dir: PathLike) -> pl.DataFrame:
    """The trials frame of a sweep (``trials.parquet``): one row per trial — ``number, state, objective`` (or
    ``objective_0, objective_1, …``), ``param/<path>`` and ``param/<path>.<task>`` (simplex weights),
    ``metric/<stage>/<split>/<task>/<metric>``, ``duration_s, trial_dir, fail_reason, pruned_step``."""
    path = Path(sweep_dir) / TRIALS_FILE
    if not path.is_file():
        raise AnalysisError(f"{sweep_dir}: not a sweep directory (no {TRIALS_FILE})")
    trials = pl.read_parquet(path)
    if "number" in trials.columns:
        trials = trials.sort("number")
    return trials


def read_sweep_config(sweep_dir: PathLike) -> dict[str, Any]:
    """``sweep.resolved.yaml`` of a sweep ({} when absent)."""
    path = Path(sweep_dir) / SWEEP_CONFIG_FILE
    if not path.is_file():
        return {}
    return yaml.safe_load(path.read_text()) or {}


def as_frame(runs: pl.DataFrame | pl.LazyFrame | PathLike | Iterable[PathLike]) -> pl.DataFrame:
    """A metrics frame from a frame (returned as is), a lazy frame (collected) or paths (:func:`load_runs`,
    without config columns)."""
    if isinstance(runs, pl.DataFrame):
        return runs
    if isinstance(runs, pl.LazyFrame):
        return runs.collect()
    return load_runs(runs, config=False)
