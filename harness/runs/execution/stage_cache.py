"""The stage cache: a finished stage's outcome, kept under ``$HARNESS_CACHE/stages/<key>`` so that a later run whose
first stages are the same starts after them instead of training them again.

An entry holds everything the rest of a run reads from a stage: the model as the stage left it (``model.safetensors``,
adapter included, in the stage's structure), the RNG states at its end (``rng.pt``: torch (+ CUDA: with several
data-parallel ranks, each rank's own device generator);
``rng.json``: numpy's and Python's global generators), the store rows it wrote (``rows.parquet``), its
``samples.jsonl`` lines, the global step it ended at and, when the stage wrote one, its Hugging Face checkpoint
(``checkpoint/``: later ``init: <stage>`` stages and ``train.checkpoint`` read it). ``meta.json`` lists every file
with its size and SHA-256; an entry that does not match it is ignored with a warning and rebuilt.

An entry is found by its key (:func:`harness.runs.planning.stage_key.stage_keys`: the stage, every earlier one, and what
computes them). A run replays cached stages in order and stops at the first miss.

Entries are written into a temporary sibling and renamed into place: a reader sees none or a whole one; when two
workers finish the same stage at once the second rename fails and that worker discards its copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from safetensors.torch import save_model

import harness
from harness.config import ResolvedStage
from harness.core.metrics import is_benchmark_task
from harness.core.store import SCHEMA as STORE_SCHEMA
from harness.core.store import Row
from harness.evaluation import EVAL_METRICS
from harness.runs.planning.plan import RunPlan
from harness.runs.planning.pretrain import cache_root
from harness.training import compiling, rng
from harness.training import parallel as distributed
from harness.training.checkpoint import SavedWeights, Start

META = "meta.json"
CHECKPOINT = "checkpoint"
# Every field of a Row, typed as the store types it: a replayed row must equal the computed one (n and the interval
# included)
_ROW_SCHEMA = {f.name: STORE_SCHEMA[f.name] for f in fields(Row)}
log = logging.getLogger(__name__)


def stages_root() -> Path:
    return cache_root() / "stages"


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------------------------------
# Entries on disk
# ----------------------------------------------------------------------------------------------------------------


def read_entry(path: Path, warn: Callable[[str], None] = log.warning) -> dict[str, Any] | None:
    """The entry's meta when every file it lists is there with its size and SHA-256; None when there is no entry
    (silently) or a corrupt / partial one (with a warning: it will be rebuilt)."""
    if not path.is_dir():
        return None
    try:
        meta = json.loads((path / META).read_text())
        for name, expected in meta["files"].items():
            file = path / name
            if file.stat().st_size != expected["size"] or _file_sha256(file) != expected["sha256"]:
                raise ValueError(f"{name} differs from meta.json")
        return meta
    except (OSError, ValueError, KeyError, TypeError) as e:
        warn(f"stage cache: ignoring corrupt entry {path} ({type(e).__name__}: {e}); it will be rebuilt")
        return None


def _publish(tmp: Path, target: Path, has_checkpoint: bool) -> bool:
    """Rename the finished ``tmp`` to ``target``; True when it is now there. A valid entry already there (another
    worker finished first) is kept and ``tmp`` discarded, unless ours adds a checkpoint it lacks; a corrupt one is
    replaced."""
    try:
        os.rename(tmp, target)
        return True
    except OSError:
        pass
    existing = read_entry(target, warn=lambda message: None)
    if existing is not None and (CHECKPOINT in existing.get("parts", []) or not has_checkpoint):
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    aside = target.with_name(f".{target.name}.stale{os.getpid()}")
    try:
        os.rename(target, aside)
        os.rename(tmp, target)
    except OSError:  # a third writer got in between: theirs stands
        shutil.rmtree(tmp, ignore_errors=True)
        return False
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    return True


def _rng_states(device_states: list | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(torch states for ``rng.pt``, numpy's and Python's global states as JSON). ``device_states``: with several
    data-parallel ranks, each rank's own CUDA generator state in rank order (``cuda_ranks``: rank r restores the
    r-th; rank 0's ``get_rng_state_all`` is only its own view of the other devices)."""
    tensors = {"torch": torch.get_rng_state()}
    if device_states and device_states[0] is not None:
        tensors["cuda_ranks"] = torch.stack(device_states)
    elif torch.cuda.is_available():
        tensors["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    version, state, gauss_next = random.getstate()
    return tensors, {
        "numpy": [name, keys.tolist(), pos, has_gauss, gauss],
        "python": [version, list(state), gauss_next],
    }


def _set_global_rng(entry: Path) -> torch.Tensor:
    """Set numpy's, Python's and CUDA's global generators as the entry's stage left them; returns torch's CPU
    state (the run sets it once the model is built: building an adapter draws from it)."""
    tensors = torch.load(entry / "rng.pt", weights_only=True)
    states = json.loads((entry / "rng.json").read_text())
    name, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    version, state, gauss_next = states["python"]
    random.setstate((version, tuple(state), gauss_next))
    parallel = distributed.current()
    if "cuda_ranks" in tensors and parallel is not None:  # this rank's own device generator, as it left the stage
        rng.set_device_state(tensors["cuda_ranks"][parallel.rank].clone())
    elif "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(tensors["cuda"]))
    return tensors["torch"]


# ----------------------------------------------------------------------------------------------------------------
# The runner's handle
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class _Began:
    rows: int  # rows in the store when the stage began
    samples: int  # bytes of samples.jsonl when the stage began


@dataclass
class StageCache:
    """What one run reads from and writes to the stage cache. ``keys``: one per stage
    (:func:`harness.runs.planning.stage_key.stage_keys`, computed by the planner)."""

    experiment: str  # the experiment's name, written into each entry's meta
    stages: Sequence[ResolvedStage]
    keys: Sequence[str]
    run_dir: Path
    run_id: str
    console: Any
    faults: bool = False  # debug.inject_nonfinite: a run that injects faults neither reads nor writes the cache
    root: Path = field(default_factory=stages_root)
    hits: list[dict[str, Any]] = field(default_factory=list)  # metas of the stages replayed, in order
    began: dict[int, _Began] = field(default_factory=dict)
    # A compile that fell back trained a stage eagerly under a key that says compiled: from then on, write nothing.
    fallbacks: int = field(default_factory=lambda: compiling.fallbacks)

    @classmethod
    def for_run(cls, plan: RunPlan, run_dir: Path, run_id: str, console) -> StageCache:
        """The cache handle of the run ``plan`` compiled (its stages and their keys) in ``run_dir``."""
        return cls(
            plan.name,
            plan.stages,
            plan.stage_keys,
            run_dir,
            run_id,
            console,
            bool(plan.debug.inject_nonfinite),
        )

    def _mode(self, index: int):
        return False if self.faults else self.stages[index].train.stage_cache

    def start(self) -> Start:
        """The run's :class:`Start`: after the longest prefix of stages with valid entries (each allowed to read
        the cache and, when the run needs its checkpoint, holding one); the first stage when there is none."""
        needed = {s.init for s in self.stages}
        for index, stage in enumerate(self.stages):
            if not self._mode(index):
                break
            meta = read_entry(self.root / self.keys[index], warn=self.console.info)
            wants_checkpoint = stage.train.checkpoint or stage.name in needed
            if meta is None or (wants_checkpoint and CHECKPOINT not in meta.get("parts", [])):
                break
            self.hits.append(meta)
        if not self.hits:
            return Start()
        last = self.root / self.keys[len(self.hits) - 1]
        torch_rng = torch.load(last / "rng.pt", weights_only=True)["torch"]
        weights = SavedWeights(last / "model.safetensors", len(self.hits) - 1, torch_rng)
        return Start(len(self.hits), self.hits[-1]["end_step"], weights=weights)

    def replay(
        self, tracker, samples_path: Path, on_evaluation: Callable[[str, int, list[Row]], None] | None = None
    ) -> None:
        """Copy the cached stages' rows into ``tracker`` and their samples into ``samples_path`` (marked
        ``cached_from``), their checkpoints into the run, and set the global RNGs as the last one left them;
        ``on_evaluation`` hears every cached evaluation as if it had just run."""
        evaluations: list[tuple[str, int, list[Row]]] = []
        for index, meta in enumerate(self.hits):
            entry, stage = self.root / self.keys[index], self.stages[index]
            source = meta["source_run_id"]
            rows = [Row(**r) for r in pl.read_parquet(entry / "rows.parquet").iter_rows(named=True)]
            for step, group in _runs_of(rows, key=lambda r: r.step):
                tracker.log(group, step, cached_from=source)
            evaluations += [
                (key[0], key[1], group)
                for key, group in _runs_of(rows, key=lambda r: (r.stage, r.step) if _is_eval(r) else None)
                if key
            ]
            _append_samples(entry / "samples.jsonl", samples_path, source, self.run_id)
            if CHECKPOINT in meta.get("parts", []):
                target = self.run_dir / "checkpoints" / stage.name
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(entry / CHECKPOINT, target)
            try:
                os.utime(entry)  # last used: what prune --older-than reads
            except OSError:  # a cache on a filesystem this user may only read
                pass
            self.console.info(
                f"stage {stage.name}: from the stage cache ({meta['end_step']} steps done; computed "
                f"by run {source}, entry {self.keys[index][:12]})"
            )
        tracker.flush()
        if self.hits:
            _set_global_rng(self.root / self.keys[len(self.hits) - 1])
        try:
            for stage_name, step, group in evaluations:
                if on_evaluation is not None:
                    on_evaluation(stage_name, step, group)
        except BaseException:
            tracker.close(1)
            raise

    def computed(
        self, index: int, run_stage: Callable[[], tuple[Any, int]], tracker, samples_path: Path, begins: bool
    ) -> tuple[Any, int]:
        """Stage ``index`` computed by ``run_stage() -> (model, step)`` and, when the stage may write to the cache
        and ran whole in this process (``begins``: it starts at its first batch, not inside it on a resume), its
        outcome stored as an entry. The one call a run makes to the cache for a stage it does not replay."""
        if begins:
            self._began(index, tracker, samples_path)
        model, step = run_stage()
        self._store(index, model, step, tracker, samples_path)
        return model, step

    def _began(self, index: int, tracker, samples_path: Path) -> None:
        """Mark where stage ``index``'s rows and samples begin (only stages begun in this process are stored)."""
        self.began[index] = _Began(
            len(tracker.existing_rows()), samples_path.stat().st_size if samples_path.exists() else 0
        )

    def _store(self, index: int, model, step: int, tracker, samples_path: Path) -> None:
        """Store stage ``index``'s outcome (after everything the stage does, before the next one begins)."""
        if self._mode(index) is not True or index not in self.began:
            return
        if compiling.fallbacks != self.fallbacks:
            self.console.info(
                f"stage {self.stages[index].name}: not stored in the stage cache (torch.compile fell "
                "back to eager in this run; the key says compiled)"
            )
            return
        began, stage = self.began.pop(index), self.stages[index]
        stores, device_states = self._rank_zero_stores(stage.name)
        if not stores:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.keys[index]}.", dir=self.root))
        try:
            parts = _write_entry(
                tmp,
                model,
                tracker.existing_rows()[began.rows :],
                samples_path,
                began.samples,
                self.run_dir / "checkpoints" / stage.name,
                step,
                device_states,
            )
            files = {
                str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _file_sha256(p)}
                for p in sorted(tmp.rglob("*"))
                if p.is_file()
            }
            meta = {
                "key": self.keys[index],
                "stage": stage.name,
                "index": index,
                "end_step": step,
                "steps": stage.steps,
                "source_run_id": self.run_id,
                "experiment": self.experiment,
                "created": time.time(),
                "harness": harness.__version__,
                "parts": parts,
                "files": files,
            }
            (tmp / META).write_text(json.dumps(meta, indent=2))
            _publish(tmp, self.root / self.keys[index], CHECKPOINT in parts)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _rank_zero_stores(self, stage: str) -> tuple[bool, list | None]:
        """Whether this process writes the entry, and every rank's own CUDA generator state (None in one process):
        in a data-parallel run only rank 0 writes (the run the summary and ``cached_from`` name), and only when
        every rank's torch CPU RNG state is the same — an entry holds one, which a replay gives every rank (they
        differ when dropout draws for unequal slices of a batch). The device states are per rank in the entry."""
        parallel = distributed.current()
        if parallel is None:
            return True, None
        states = parallel.all_gather((torch.get_rng_state(), rng.device_state()))  # every rank decides alike
        same = all(torch.equal(states[0][0], other) for other, _ in states[1:])
        if not same and parallel.rank == 0:
            self.console.info(f"stage {stage}: not stored in the stage cache (the ranks' RNG states differ)")
        return same and parallel.rank == 0, [device for _, device in states]

    def annotate(self, summary_stages: list[dict[str, Any]]) -> None:
        """Mark the summary's cached stages with the run that computed them."""
        for entry, meta in zip(summary_stages, self.hits):
            entry["cached_from"] = meta["source_run_id"]


def _write_entry(
    tmp: Path,
    model,
    rows: list[Row],
    samples_path: Path,
    samples_from: int,
    checkpoint: Path,
    step: int,
    device_states: list | None = None,
) -> list[str]:
    """Write a stage's outcome into ``tmp``; returns the optional parts written (``checkpoint``)."""
    save_model(model, str(tmp / "model.safetensors"))
    tensors, states = _rng_states(device_states)
    torch.save(tensors, tmp / "rng.pt")
    (tmp / "rng.json").write_text(json.dumps(states))
    frame = pl.DataFrame({c: [getattr(r, c) for r in rows] for c in _ROW_SCHEMA}, schema=_ROW_SCHEMA)
    frame.write_parquet(tmp / "rows.parquet")
    with open(tmp / "samples.jsonl", "wb") as out:
        if samples_path.exists():
            with open(samples_path, "rb") as f:
                f.seek(samples_from)
                shutil.copyfileobj(f, out)
    meta_file = checkpoint / "meta.json"
    if meta_file.exists() and json.loads(meta_file.read_text()).get("step") == step:  # written by this stage
        shutil.copytree(checkpoint, tmp / CHECKPOINT)
        return [CHECKPOINT]
    return []


def _append_samples(source: Path, target: Path, cached_from: str, run_id: str) -> None:
    """The cached stage's sample lines, as this run's (its ``run_id``) and marked with the run that computed them."""
    with open(source, encoding="utf-8") as f, open(target, "a", encoding="utf-8") as out:
        for line in f:
            if line.strip():
                sample = {**json.loads(line), "cached_from": cached_from}
                if "run_id" in sample:
                    sample["run_id"] = run_id
                out.write(json.dumps(sample, ensure_ascii=False) + "\n")


def _is_eval(row: Row) -> bool:
    return row.task is not None and (row.metric in EVAL_METRICS or is_benchmark_task(row.task))


def _runs_of(rows: list[Row], key: Callable[[Row], Any]) -> list[tuple[Any, list[Row]]]:
    """Consecutive rows with the same ``key``, in order."""
    out: list[tuple[Any, list[Row]]] = []
    for row in rows:
        k = key(row)
        if out and out[-1][0] == k:
            out[-1][1].append(row)
        else:
            out.append((k, [row]))
    return out
