"""What a run leaves on disk to start from again: Hugging Face checkpoints (a stage's end, the pretrained base) and
resume points (a killed run's way back in), and the :class:`Start` a run begins from.

Every checkpoint directory is written through :func:`atomic_directory`: into a temporary sibling first, then
renamed into place, so a checkpoint directory is either absent or complete, never half-written.

- :func:`save_hf_checkpoint`: ``save_pretrained`` + tokenizer + ``meta.json`` (the pretraining cache);
  :func:`save_stage_checkpoint`: the same for a stage's end, with the merged model and, for a peft model, the
  adapter under ``adapter/``.
- :func:`save_resume_point` (every ``train.checkpoint_every`` steps, under ``checkpoints/resume/step-N``): model
  weights, optimiser and scheduler state, every rank's random generators (torch CPU, its own CUDA device, numpy,
  Python: :mod:`harness.training.rng`), the data position and the loop's metrics window. :func:`resume_start` reads
  the newest one back into a :class:`Start`, whose :meth:`SavedWeights.restore_rng` sets this rank's generators.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_model
from transformers import AutoModelForCausalLM

from harness.config import ResolvedStage
from harness.training import parallel as distributed
from harness.training import rng
from harness.training.adapters import adapter_prefix, is_peft_model, merged_copy, trainable_report, vocab_parameters
from harness.training.loop import LoopState

RESUME_DIR = "resume"  # under <run>/checkpoints/

RowFilter = Callable[[str, int, str], bool]  # (stage, step, metric) -> keep the row?


@contextmanager
def atomic_directory(target: Path) -> Iterator[Path]:
    """A fresh temporary sibling of ``target`` to write into; when the block ends without error it replaces
    ``target`` whole (an existing one is moved aside, then deleted), otherwise it is deleted. So ``target`` is at
    every moment absent, the old directory or the new one — never half-written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            old = target.with_name(f".{target.name}.old{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ----------------------------------------------------------------------------------------------------------------
# Hugging Face checkpoints
# ----------------------------------------------------------------------------------------------------------------


def save_hf_checkpoint(target: Path, model, tokenizer, meta: dict) -> None:
    """Write a Hugging Face checkpoint (safetensors + tokenizer + ``meta.json``) into ``target`` atomically."""
    with atomic_directory(target) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=str))


def load_state_dict(directory: Path) -> dict:
    """The state dict of the Hugging Face checkpoint in ``directory``."""
    return AutoModelForCausalLM.from_pretrained(directory).state_dict()


class _StageArtifacts:
    """What :func:`save_hf_checkpoint` writes through ``save_pretrained`` for a stage: the merged model in HF
    format and, for a peft model, the adapter under ``adapter/``."""

    def __init__(self, merged, peft_model=None, save_embedding_layers: bool = False):
        self.merged, self.peft_model, self.save_embedding_layers = merged, peft_model, save_embedding_layers

    def save_pretrained(self, directory, safe_serialization: bool = True) -> None:
        self.merged.save_pretrained(directory, safe_serialization=safe_serialization)
        if self.peft_model is not None:
            self.peft_model.save_pretrained(
                Path(directory) / "adapter",
                safe_serialization=safe_serialization,
                save_embedding_layers=self.save_embedding_layers,
            )


def save_stage_checkpoint(model, tokenizer, directory, meta: dict) -> dict:
    """Write ``directory`` atomically (temp dir, then rename): the merged model in Hugging Face format (loadable with
    ``AutoModelForCausalLM``), the tokenizer, ``meta.json``, and for a ``PeftModel`` the adapter in peft format under
    ``directory/adapter`` (``PeftModel.from_pretrained(base, directory / "adapter")``; ``base`` = the weights the
    adapter started from). The adapter also carries the embedding / head when they trained (new-token rows or
    unfrozen); other base parameters trained by ``unfreeze`` are only in the merged model — ``meta.json`` lists them
    under ``adapter.not_in_adapter``. The model being trained is not modified (the merge happens on a copy).
    Returns the meta written."""
    meta = dict(meta)
    meta.setdefault("trainable", trainable_report(model))
    if is_peft_model(model):
        vocab_ids = {id(w) for _, w, _ in vocab_parameters(model)}
        prefix = adapter_prefix(model)
        vocab_trained = any(w.requires_grad for _, w, _ in vocab_parameters(model))
        outside = [
            n for n, p in model.named_parameters() if p.requires_grad and prefix not in n and id(p) not in vocab_ids
        ]
        config = model.peft_config[model.active_adapter]
        meta["adapter"] = {
            "type": str(config.peft_type.value).lower(),
            "dir": "adapter",
            "includes_embeddings": vocab_trained,
            "not_in_adapter": outside,
            "complete": not outside,
        }
        artifacts = _StageArtifacts(merged_copy(model), model, save_embedding_layers=vocab_trained)
    else:
        artifacts = _StageArtifacts(model)
    save_hf_checkpoint(Path(directory), artifacts, tokenizer, meta)
    return meta


# ----------------------------------------------------------------------------------------------------------------
# Resume points and where a run starts
# ----------------------------------------------------------------------------------------------------------------


def save_resume_point(
    run_dir: Path, model, stage_index: int, stage: str, step: int, loop_state: LoopState, keep: int
) -> None:
    """Model, optimiser, scheduler, RNG states, the data position and the loop's window (and an adaptive stage's
    stream, ``mixture``, with each rank's partial per-task loss sums, ``steer``; the stage's packed or padded
    decision, ``packing``), written atomically; only the newest ``keep`` are kept.

    With several data-parallel ranks every rank calls this: the model, optimiser and scheduler are the same on all
    of them, but each has its own random generators (its own CUDA device's among them) and its own part of the
    metrics window (summed over ranks only when logged), so those are gathered to rank 0, which alone writes
    (``ranks`` in ``optimizer.pt``, ``world`` in ``state.json``)."""
    parallel = distributed.current()
    states = rng.capture()
    own = {"torch_rng": states["torch"], "rng": states, "window": loop_state.window, "steer": loop_state.steer}
    ranks = parallel.gather(own) if parallel is not None else None
    if parallel is not None and parallel.rank != 0:
        return
    root = run_dir / "checkpoints" / RESUME_DIR
    with atomic_directory(root / f"step-{step:08d}") as tmp:
        save_model(model, str(tmp / "model.safetensors"))
        torch.save(
            {
                "optimizer": loop_state.optimizer,
                "scheduler": loop_state.scheduler,
                "torch_rng": own["torch_rng"],
                "rng": states,
                **({"ranks": ranks} if ranks else {}),
            },
            tmp / "optimizer.pt",
        )
        state = {
            "stage_index": stage_index,
            "stage": stage,
            "step": step,
            "batch_index": loop_state.batch_index,
            "consecutive_skips": loop_state.consecutive_skips,
            "window": loop_state.window,
            "mixture": loop_state.mixture,
            "steer": loop_state.steer,
            "packing": loop_state.packing,
            "world": parallel.world if parallel is not None else 1,
        }
        (tmp / "state.json").write_text(json.dumps(state, indent=2))
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def latest_resume_point(run_dir: Path) -> Path | None:
    points = sorted((run_dir / "checkpoints" / RESUME_DIR).glob("step-*"))
    return points[-1] if points else None


class WorldSizeError(ValueError):
    """A resume with another number of data-parallel ranks than the run had (its RNG states and metrics windows
    are per rank, and the ranks' sums are not one process's: not the same run)."""


def check_resume_world(run_dir: Path, world: int) -> None:
    """Raise :class:`WorldSizeError` (one line) when the newest resume point in ``run_dir`` was written by another
    number of ranks than ``world`` (1: one process)."""
    point = latest_resume_point(run_dir)
    if point is not None:
        _check_world(point, world)


def _ranks_said(n: int) -> str:
    return "one process" if n == 1 else f"{n} data-parallel ranks"


def _check_world(point: Path, world: int) -> None:
    saved = json.loads((point / "state.json").read_text()).get("world", 1)
    if saved != world:
        hint = "without --nproc" if saved == 1 else f"with --nproc {saved}"
        raise WorldSizeError(
            f"--resume: {point} was written by {_ranks_said(saved)}, this run has "
            f"{_ranks_said(world)}; resume it {hint}"
        )


@dataclass
class SavedWeights:
    """A resume point's model: its weights file, the stage whose structure (adapter or not) they have, and the
    random states saved with them: torch's CPU state, and from a resume point this rank's other generators
    (:func:`harness.training.rng.capture`; None from the stage cache, which sets those itself, and from resume
    points written before they were saved)."""

    file: Path
    stage_index: int
    torch_rng: torch.Tensor
    generators: dict | None = None

    def restore_rng(self) -> None:
        """Set this process's generators as they were saved (call once the model is built: building an adapter
        draws from torch's)."""
        torch.set_rng_state(self.torch_rng)
        if self.generators is not None:
            rng.restore(self.generators)


@dataclass
class Start:
    """Where a run begins. A new run: the first stage at step 0, from the base model. A resumed run: where its
    newest resume point left off — inside that stage (``loop_state`` continues its loop exactly), or at the next
    stage when that one had finished."""

    stage_index: int = 0
    step: int = 0  # the global step before the first batch still to train
    loop_state: LoopState = field(default_factory=LoopState)  # batch_index 0: the stage has not begun
    weights: SavedWeights | None = None  # None: the base model as loaded
    keep: RowFilter | None = None  # the rows (and samples) of the killed run that stay; None: a new run
    resumed_from: str | None = None  # the resume point's name


def resume_start(point: Path | None, stages: Sequence[ResolvedStage], stage_lengths: Sequence[int]) -> Start:
    """The :class:`Start` of a resumed run from its newest resume ``point`` (``stage_lengths``: batches per stage);
    without one, the run starts over and keeps nothing of the killed run."""
    if point is None:
        return Start(keep=lambda stage, step, metric: False)
    state = json.loads((point / "state.json").read_text())
    bundle = torch.load(point / "optimizer.pt", weights_only=True)
    parallel = distributed.current()
    _check_world(point, parallel.world if parallel is not None else 1)
    if "ranks" in bundle:  # a data-parallel run: this rank's own random states, window and steering sums
        own = bundle["ranks"][parallel.rank]
        state["window"], bundle["torch_rng"], bundle["rng"] = own["window"], own["torch_rng"], own.get("rng")
        state["steer"] = own.get("steer")
    index, step = state["stage_index"], state["step"]
    weights = SavedWeights(point / "model.safetensors", index, bundle["torch_rng"], bundle.get("rng"))
    keep = _rows_before({s.name: i for i, s in enumerate(stages)}, index, step)
    if state["batch_index"] >= stage_lengths[index]:  # the stage had finished: the next one begins
        return Start(index + 1, step, LoopState(), weights, keep, point.name)
    loop_state = LoopState(
        state["batch_index"],
        state["consecutive_skips"],
        state["window"],
        bundle["optimizer"],
        bundle["scheduler"],
        state.get("mixture"),
        state.get("steer"),
        state.get("packing"),  # None from resume points written before it was kept: the stage checks again
    )
    return Start(index, step, loop_state, weights, keep, point.name)


def _rows_before(stage_order: dict[str, int], stage_index: int, step: int) -> RowFilter:
    """Rows written before the resume point: earlier steps, or the same step in this stage or an earlier one."""

    def keep(row_stage: str, row_step: int, metric: str) -> bool:
        if metric == "seesaw":
            return False  # recomputed at the end of the run
        return row_step < step or (row_step == step and stage_order.get(row_stage, 10**9) <= stage_index)

    return keep
