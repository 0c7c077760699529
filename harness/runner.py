"""Run an experiment end to end: data → base model → stages (train, evaluate, checkpoint) → summary; and resume
a killed run from its last resumable checkpoint.

This module wires components together; the loop itself is :func:`harness.train.train_stage`, the metrics come
from :mod:`harness.evaluation`, and what goes where from :mod:`harness.tracking`.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from harness.config import ConfigError, Experiment, ResolvedStage, dump_yaml, safe_load
from harness.store import Row, atomic_write_text

RESUME_DIR = "resume"


class DataError(Exception):
    """Bad task data found before training (empty pool, unreadable file…); the message names the task."""


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------


def task_seed(exp: Experiment, task: str) -> int:
    """A task's data seed: its own, or one derived from the experiment seed and the task name."""
    spec = exp.tasks[task]
    if spec.seed is not None:
        return spec.seed
    return int.from_bytes(hashlib.sha256(f"{exp.seed}/{task}".encode()).digest()[:4], "little")


@dataclass
class TaskData:
    recipes: dict[str, Any]  # task -> Recipe instance
    splits: dict[str, dict[str, list]]  # task -> split -> [Example]
    corpus: list[str]


def build_task_data(exp: Experiment) -> TaskData:
    from data_recipes import build_world, corpus, get_recipe

    world = build_world(exp.world.people, exp.world.seed)
    recipes, splits = {}, {}
    for name, spec in exp.tasks.items():
        cls = get_recipe(spec.recipe)
        recipe = cls(cls.Params.model_validate(spec.params), world if cls.needs_world else None)
        try:
            splits[name] = recipe.build(name, spec.train, spec.eval, task_seed(exp, name))
        except (ValueError, OSError) as e:
            raise DataError(f"tasks.{name} (recipe {spec.recipe}): {e}") from None
        recipes[name] = recipe
    return TaskData(recipes, splits, corpus(world, exp.world.seed))


def load_base(exp: Experiment, data: TaskData, console=None) -> tuple[Any, Any, list[int], dict[str, Any]]:
    """The base model (on the GPU when there is one) and tokenizer — a hub/local model, or a builtin one,
    pretrained and cached — the ids of the tokens the harness added to it, and facts about where it came from."""
    import torch
    import transformers

    from harness.models import builtin_added_token_ids, load_hf
    from harness.pretrain import builtin_base

    transformers.utils.logging.disable_progress_bar()  # our own bars are enough
    if exp.model.hf:
        model, tokenizer, added = load_hf(exp.model, return_added=True)
        info: dict[str, Any] = {"source": exp.model.hf}
    else:
        all_train = [ex for splits in data.splits.values() for ex in splits["train"]]
        progress = console.progress_factory() if console is not None else None
        model, tokenizer, base = builtin_base(exp.model, data.corpus, all_train, exp.seed, progress)
        added = builtin_added_token_ids(tokenizer)
        if exp.model.pretrain is not None and console is not None:
            console.info("base model: " + ("cache hit" if base.cache_hit else f"pretrained (loss {base.final_loss:.3f})")
                         + f" ({base.cache_dir})")
        info = {"source": exp.model.builtin, "cache_hit": base.cache_hit,
                "cache_dir": str(base.cache_dir) if base.cache_dir else None, "pretrain_final_loss": base.final_loss}
    if torch.cuda.is_available():
        model = model.to("cuda")
    return model, tokenizer, added, info


@dataclass
class EncodedData:
    train: dict[str, list]  # task -> [Encoded]
    eval_items: list  # [EvalItem] over every task and eval split, fixed for the whole run


def encode_task_data(exp: Experiment, data: TaskData, tokenizer) -> EncodedData:
    from harness.data import encode_examples, eval_items

    train = {}
    for name, splits in data.splits.items():
        train[name] = encode_examples(tokenizer, splits["train"])
        for index, (ex, enc) in enumerate(zip(splits["train"], train[name])):
            if enc.n_supervised <= 1:  # only the end-of-turn token: the answer tokenised to nothing
                raise DataError(f"tasks.{name}: training example {index} has an answer that tokenises to nothing "
                                f"(prompt {ex.prompt[:60]!r})")
    items = []
    for name, splits in data.splits.items():
        for split in exp.eval.splits:
            if split == "train":
                # A fixed random subsample of training items, so the memorisation gap is visible.
                pool = splits["train"]
                rng = np.random.default_rng(task_seed(exp, name))
                chosen = sorted(rng.choice(len(pool), size=min(exp.tasks[name].eval, len(pool)), replace=False))
                examples = [pool[i] for i in chosen]
            else:
                examples = splits[split]
            items.extend(eval_items(tokenizer, examples, split))
    return EncodedData(train, items)


@dataclass
class StagePlan:
    stage: ResolvedStage
    batches: list
    composition: dict[str, dict[str, float]]


def plan_stage(exp: Experiment, stage: ResolvedStage, index: int, pools: dict[str, list], pad_id: int) -> StagePlan:
    """The stage's batches and its effective composition (examples and tokens per task, too-long drops)."""
    from harness.data import collate, length_grouped_batches, mixture_stream

    kept, dropped = {}, {}
    for task in stage.mixture.tasks:
        kept[task] = [e for e in pools[task] if e.length <= stage.train.max_length]
        dropped[task] = len(pools[task]) - len(kept[task])
        if dropped[task] and exp.data.too_long == "error":
            raise DataError(f"stage {stage.name!r}: {dropped[task]} examples of task {task!r} are longer than "
                            f"max_length={stage.train.max_length} (data.too_long: error)")
        if not kept[task]:
            raise DataError(f"stage {stage.name!r}: every example of task {task!r} is longer than "
                            f"max_length={stage.train.max_length}; its pool is empty")
    rng = np.random.default_rng([exp.seed, index])
    n = sum(stage.mixture.counts.values()) if stage.mixture.kind == "counts" else stage.steps * stage.train.batch_size
    draws = mixture_stream(stage.mixture, {t: len(p) for t, p in kept.items()}, n, rng)
    examples = [kept[t][i] for t, i in draws]
    grouped = length_grouped_batches(examples, stage.train.batch_size, stage.train.length_grouping, rng)
    composition: dict[str, dict[str, float]] = {}
    for e in examples:
        c = composition.setdefault(e.task, {"examples": 0, "tokens": 0, "supervised_tokens": 0})
        c["examples"] += 1
        c["tokens"] += e.length
        c["supervised_tokens"] += e.n_supervised
    for task, c in composition.items():
        c["share"] = c["examples"] / len(examples)
        c["dropped_too_long"] = dropped.get(task, 0)
    return StagePlan(stage, [collate(b, pad_id) for b in grouped], composition)


# ----------------------------------------------------------------------------------------------------------------
# Evaluation bookkeeping
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class EvalLog:
    """Runs the evaluators on the fixed eval items and sends every result where it belongs."""

    exp: Experiment
    items: list
    recipes: dict[str, Any]
    tokenizer: Any
    tracker: Any
    samples_path: Path
    on_evaluation: Optional[Callable[[str, int, list[Row]], None]] = None
    history: list[Row] = field(default_factory=list)  # every evaluation row, in order
    seconds: float = 0.0

    def __post_init__(self):
        from harness.evaluation import hijack_token_ids

        self.hijack_ids = hijack_token_ids(self.tokenizer, self.exp.eval.hijack_words)

    def run(self, model, stage: str, step: int) -> None:
        from harness.evaluation import run_evaluation

        started = time.perf_counter()
        result = run_evaluation(model, self.tokenizer, self.items, self.recipes, self.exp.eval, self.hijack_ids)
        rows = []
        for task, split, metric, value in result.metrics:
            text = json.dumps(result.top1.get((task, split), [])) if metric == "ft_top1" else None
            rows.append(Row(stage, step, task, split, metric, value, text))
        with open(self.samples_path, "a", encoding="utf-8") as f:
            for sample in result.samples:
                f.write(json.dumps({"stage": stage, "step": step, **sample}, ensure_ascii=False) + "\n")
        self._log_tables(result, step)
        self.seconds += time.perf_counter() - started
        self._record(rows, step)

    def repeat_last(self, stage: str) -> None:
        """Record the previous evaluation again under ``stage`` (a stage starting from the previous one's
        weights begins exactly where that one ended: no need to evaluate twice)."""
        if not self.history:
            return
        step = self.history[-1].step
        last = [r for r in self.history if r.step == step and r.stage == self.history[-1].stage]
        self._record([Row(stage, r.step, r.task, r.split, r.metric, r.value, r.text) for r in last], step)

    def _record(self, rows: list[Row], step: int) -> None:
        self.tracker.log(rows, step)
        self.tracker.flush()
        self.history.extend(rows)
        if self.on_evaluation is not None and rows:
            self.on_evaluation(rows[0].stage, step, rows)

    def _log_tables(self, result, step: int) -> None:
        per_key: dict[tuple[str, str], int] = {}
        data = []
        for s in result.samples:
            key = (s["task"], s["split"])
            if per_key.get(key, 0) >= self.exp.eval.samples:
                continue
            per_key[key] = per_key.get(key, 0) + 1
            top5 = " ".join(f"{t['token']!r}:{t['prob']:.2f}" for t in s.get("top5", []))
            data.append([s["task"], s["split"], s["prompt"], s["gold"], s.get("pred"), s.get("correct"), top5])
        self.tracker.log_table("samples", ["task", "split", "prompt", "gold", "pred", "correct", "top5_first"],
                               data, step)
        top1 = [[task, split, tok, count] for (task, split), pairs in result.top1.items() for tok, count in pairs]
        self.tracker.log_table("ft_top1", ["task", "split", "token", "count"], top1, step)

    def stage_end_table(self, stage: str) -> dict[str, dict[str, dict[str, float]]]:
        """``{split: {task: {metric: value}}}`` of the last evaluation recorded for ``stage``."""
        rows = [r for r in self.history if r.stage == stage]
        if not rows:
            return {}
        last = max(r.step for r in rows)
        out: dict[str, dict[str, dict[str, float]]] = {}
        for r in rows:
            if r.step == last:
                out.setdefault(r.split, {}).setdefault(r.task, {})[r.metric] = r.value
        return out

    def history_dicts(self) -> list[dict[str, Any]]:
        return [{"stage": r.stage, "step": r.step, "task": r.task, "split": r.split, "metric": r.metric,
                 "value": r.value} for r in self.history]


# ----------------------------------------------------------------------------------------------------------------
# Resumable checkpoints
# ----------------------------------------------------------------------------------------------------------------


def save_resume_point(run_dir: Path, model, stage_index: int, stage: str, step: int, loop_state, keep: int) -> None:
    """Model, optimiser, scheduler, RNG states, the data position and the loop's window, written atomically;
    only the newest ``keep`` are kept."""
    import tempfile

    import torch
    from safetensors.torch import save_model

    root = run_dir / "checkpoints" / RESUME_DIR
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"step-{step:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        save_model(model, str(tmp / "model.safetensors"))
        torch.save({"optimizer": loop_state.optimizer, "scheduler": loop_state.scheduler,
                    "torch_rng": torch.get_rng_state()}, tmp / "optimizer.pt")
        state = {"stage_index": stage_index, "stage": stage, "step": step, "batch_index": loop_state.batch_index,
                 "consecutive_skips": loop_state.consecutive_skips, "window": loop_state.window}
        (tmp / "state.json").write_text(json.dumps(state, indent=2))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def latest_resume_point(run_dir: Path) -> Optional[Path]:
    points = sorted((run_dir / "checkpoints" / RESUME_DIR).glob("step-*"))
    return points[-1] if points else None


def _keep_row(stage_order: dict[str, int], stage_index: int, step: int):
    """Rows written before the resume point: earlier steps, or the same step in this stage or an earlier one."""
    def keep(row_stage: str, row_step: int, metric: str) -> bool:
        if metric == "seesaw":
            return False  # recomputed at the end of the run
        return row_step < step or (row_step == step and stage_order.get(row_stage, 10**9) <= stage_index)
    return keep


# ----------------------------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------------------------


def new_run_id(exp: Experiment) -> str:
    return f"{exp.name}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def default_run_dir(exp: Experiment, root: Path = Path("runs")) -> Path:
    return root / exp.name / datetime.now().strftime("%Y%m%d-%H%M%S")


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]


def _check_same_experiment(exp: Experiment, run_dir: Path) -> None:
    resolved = run_dir / "config.resolved.yaml"
    if not resolved.exists():
        raise ConfigError(str(run_dir), [("", "not a run directory (no config.resolved.yaml)")])
    before = safe_load(resolved.read_text())
    now = json.loads(json.dumps(exp.resolved_dict()))
    changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    if changed:
        raise ConfigError(str(run_dir), [(k, "differs from the run being resumed") for k in changed])


def run_experiment(exp: Experiment, run_dir: Path, console=None,
                   on_evaluation: Optional[Callable[[str, int, list[Row]], None]] = None,
                   resume: bool = False) -> RunResult:
    """Train and evaluate ``exp`` into ``run_dir``; returns the summary (also written to ``summary.json``).

    ``on_evaluation(stage, step, rows)`` is called after every evaluation (sweeps report to their pruner there);
    an exception it raises ends the run, with the store flushed and the wandb run closed as failed.
    With ``resume``, ``run_dir`` holds a killed run of the same experiment, which continues from its newest
    resumable checkpoint (``train.checkpoint_every``); the final metrics equal an uninterrupted run's.
    """
    import torch
    from safetensors.torch import load_model

    from harness.adapters import drop_adapter, merged_state_dict, prepare_stage_model, save_stage_checkpoint
    from harness.adapters import format_report as format_trainable
    from harness.adapters import stage_special_tokens, trainable_report
    from harness.console import Console
    from harness.evaluation.seesaw import seesaw_events
    from harness.guard import Injector, NonFiniteError, write_report
    from harness.models import count_parameters
    from harness.tracking import Tracker
    from harness.train import LoopState, StageLoop, train_stage

    console = console or Console(enabled=exp.tracking.console)
    started = time.perf_counter()

    # -- run identity: new, or the one being resumed ------------------------------------------------------------
    point = None
    if resume:
        _check_same_experiment(exp, run_dir)
        run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
        point = latest_resume_point(run_dir)
        console.info(f"resuming {run_id} from {point.name if point else 'the start (no resumable checkpoint)'}")
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "config.resolved.yaml", dump_yaml(exp.resolved_dict()))
        run_id = new_run_id(exp)
        atomic_write_text(run_dir / "run.json", json.dumps({"run_id": run_id, "experiment": exp.name}))
        console.info(f"run {run_id} → {run_dir}")
    torch.manual_seed(exp.seed)
    np.random.seed(exp.seed % 2**32)  # third-party code that uses the global numpy RNG stays deterministic

    # -- data and base model (all data errors surface here, before any training) -------------------------------
    data = build_task_data(exp)
    t0 = time.perf_counter()
    model, tokenizer, added, base_info = load_base(exp, data, console)
    base_seconds = time.perf_counter() - t0
    console.info(f"model: {count_parameters(model)[0] / 1e6:.2f}M parameters, vocabulary {len(tokenizer)}")
    encoded = encode_task_data(exp, data, tokenizer)
    stages = exp.resolved_stages()
    plans = [plan_stage(exp, s, i, encoded.train, tokenizer.pad_token_id) for i, s in enumerate(stages)]

    # -- where to start -------------------------------------------------------------------------------------------
    stage_order = {s.name: i for i, s in enumerate(stages)}
    start_stage, loop_resume, step = 0, None, 0
    keep = None
    if point is not None:
        state = json.loads((point / "state.json").read_text())
        keep = _keep_row(stage_order, state["stage_index"], state["step"])
        step = state["step"]
        done = state["batch_index"] >= len(plans[state["stage_index"]].batches)
        start_stage = state["stage_index"] + (1 if done else 0)
    elif resume:
        keep = lambda stage, row_step, metric: False  # noqa: E731 — nothing usable: start over
    if resume:
        _truncate_samples(run_dir / "samples.jsonl", keep)
    tracker = Tracker(exp, run_dir, run_id, exp.resolved_dict(), resume_filter=keep)
    evals = EvalLog(exp, encoded.eval_items, data.recipes, tokenizer, tracker, run_dir / "samples.jsonl",
                    on_evaluation)
    evals.history = [r for r in tracker.existing_rows() if _is_eval_row(r)]

    needed_states = {s.init for s in stages} - {"previous"}
    saved_states: dict[str, dict] = {}
    if "base" in needed_states:
        saved_states["base"] = merged_state_dict(model)
    for earlier in stages[:start_stage]:
        if earlier.name in needed_states:
            saved_states[earlier.name] = _load_state_dict(run_dir / "checkpoints" / earlier.name)
    previous_trainable = None  # what trained in the stage the current weights come from
    if point is not None:
        # Give the model the structure (adapter or not) it had when the checkpoint was written, then its weights.
        k = state["stage_index"]
        inherited = stages[k - 1].train.trainable if k > 0 and stages[k].init == "previous" else None
        model = prepare_stage_model(model, stages[k].train.trainable, added, inherited)
        load_model(model, str(point / "model.safetensors"))
        previous_trainable = stages[k].train.trainable
        bundle = torch.load(point / "optimizer.pt", weights_only=True)
        torch.set_rng_state(bundle["torch_rng"])
        if start_stage == state["stage_index"]:
            loop_resume = LoopState(state["batch_index"], state["consecutive_skips"], state["window"],
                                    bundle["optimizer"], bundle["scheduler"])

    injector = Injector(**exp.debug.inject_nonfinite.model_dump()) if exp.debug.inject_nonfinite else None
    tasks = list(exp.tasks)
    summary_stages = [_stage_summary(plans[i], evals, i, plans) for i in range(start_stage)]
    exit_code = 1
    try:
        for index in range(start_stage, len(stages)):
            stage, plan = stages[index], plans[index]
            resuming_here = loop_resume is not None and index == start_stage
            if not resuming_here:
                if stage.init != "previous":
                    model = drop_adapter(model)
                    model.load_state_dict(saved_states[stage.init])
                    previous_trainable = None
                model = prepare_stage_model(model, stage.train.trainable, added, previous_trainable)
                report = trainable_report(model)
                tracker.log([Row(stage.name, step, None, "train", "trainable_params", report["trainable"]),
                             Row(stage.name, step, None, "train", "trainable_share", report["share"])], step)
                console.info(f"stage {stage.name}: {format_trainable(report)}")
                console.info(f"stage {stage.name} ({index + 1}/{len(stages)}): {len(plan.batches)} steps, init "
                             f"{stage.init}, mixture {stage.mixture.kind}: "
                             + ", ".join(f"{t} {c['share']:.2f}" for t, c in sorted(plan.composition.items())))
                if index > 0 and stage.init == "previous":
                    evals.repeat_last(stage.name)
                else:
                    evals.run(model, stage.name, step)

            def checkpoint(at_step: int, loop_state, index=index, stage=stage) -> None:
                tracker.flush()
                save_resume_point(run_dir, model, index, stage.name, at_step, loop_state, stage.train.keep_checkpoints)

            with console.stage_progress(stage.name, len(plan.batches)) as advance:
                if resuming_here:
                    advance(loop_resume.batch_index)
                step = train_stage(model, plan.batches, StageLoop(
                    stage=stage.name, start_step=step - (loop_resume.batch_index if resuming_here else 0),
                    optim=stage.train.optim, tasks=tasks, log=tracker.log,
                    evaluate=lambda s, name=stage.name: evals.run(model, name, s),
                    loss=stage.train.loss, precision=stage.train.precision,
                    special_tokens=stage_special_tokens(tokenizer, plan.batches),
                    log_every=stage.train.log_every, eval_every=exp.eval.every, nonfinite=stage.train.nonfinite,
                    diagnostics=stage.train.diagnostics, compile=stage.train.compile, injector=injector,
                    checkpoint_every=stage.train.checkpoint_every, save_checkpoint=checkpoint, progress=advance,
                ), resume=loop_resume if resuming_here else None)
            tracker.log([Row(stage.name, step, task, "train", f"mix_{key}", value)
                         for task, c in plan.composition.items() for key, value in c.items()], step)
            previous_trainable = stage.train.trainable
            if stage.name in needed_states:
                saved_states[stage.name] = merged_state_dict(model)
            if stage.train.checkpoint or stage.name in needed_states:
                save_stage_checkpoint(model, tokenizer, run_dir / "checkpoints" / stage.name,
                                      {"run_id": run_id, "stage": stage.name, "step": step, "experiment": exp.name})
            if stage.train.checkpoint_every:
                checkpoint(step, LoopState(len(plan.batches)))
            summary_stages.append(_stage_summary(plan, evals, index, plans))
        exit_code = 0
    except NonFiniteError as e:
        write_report(run_dir, e.report)  # the last good checkpoint is left as it was
        raise
    finally:
        tracker.flush()
        if exit_code:
            tracker.close(exit_code)

    events = seesaw_events(evals.history_dicts(), exp.eval.seesaw_delta)
    tracker.log([Row(e["stage_to"], e["step_to"], e["rose"], e["split"], "seesaw", e["rose_by"], json.dumps(e))
                 for e in events], step)
    total = time.perf_counter() - started
    summary = {
        "run_id": run_id,
        "experiment": exp.name,
        "run_dir": str(run_dir),
        "base": {**base_info, "seconds": base_seconds},
        "stages": summary_stages,
        "seesaw_events": events,
        "timing": {"total_s": total, "eval_s": evals.seconds, "base_s": base_seconds,
                   "eval_share": evals.seconds / total if total else 0.0},
        "resumed_from": point.name if point is not None else None,
    }
    tracker.summary({"final/" + k: v for k, v in summary["timing"].items()})
    tracker.close(0)
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, default=str))
    console.final_report(summary, exp.eval.splits)
    return RunResult(run_dir, summary)


def _is_eval_row(row: Row) -> bool:
    """Rows written by evaluations (the others are training metrics, compositions and seesaw events)."""
    from harness.evaluation import EVAL_METRICS

    return row.task is not None and row.metric in EVAL_METRICS


def _stage_summary(plan: StagePlan, evals: EvalLog, index: int, plans: list[StagePlan]) -> dict[str, Any]:
    start = sum(len(p.batches) for p in plans[:index])
    return {"name": plan.stage.name, "start_step": start, "end_step": start + len(plan.batches),
            "init": plan.stage.init, "mixture": plan.stage.mixture.to_yaml(), "composition": plan.composition,
            "metrics": evals.stage_end_table(plan.stage.name)}


def _truncate_samples(path: Path, keep) -> None:
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            sample = json.loads(line)
            if keep(sample["stage"], sample["step"], ""):
                kept.append(line + "\n")
    atomic_write_text(path, "".join(kept))


def _load_state_dict(directory: Path) -> dict:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory).state_dict()


def evaluate_checkpoint(exp: Experiment, checkpoint: Path, run_dir: Path, console=None) -> RunResult:
    """Evaluate a saved checkpoint alone with the experiment's evaluators, probes and splits; writes the same
    outputs as a run (store, samples.jsonl, summary.json, wandb) into ``run_dir``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness.console import Console
    from harness.tracking import Tracker

    console = console or Console(enabled=exp.tracking.console)
    if not (checkpoint / "config.json").exists():
        raise ConfigError(str(checkpoint), [("", "not a Hugging Face checkpoint directory (no config.json)")])
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.resolved.yaml", dump_yaml(exp.resolved_dict()))
    run_id = new_run_id(exp)
    meta_path = checkpoint / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    stage, step = meta.get("stage", "checkpoint"), int(meta.get("step", 0))
    atomic_write_text(run_dir / "run.json", json.dumps({"run_id": run_id, "experiment": exp.name,
                                                        "checkpoint": str(checkpoint)}))
    model = AutoModelForCausalLM.from_pretrained(checkpoint, trust_remote_code=exp.model.trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=exp.model.trust_remote_code)
    data = build_task_data(exp)
    encoded = encode_task_data(exp, data, tokenizer)
    tracker = Tracker(exp, run_dir, run_id, {**exp.resolved_dict(), "checkpoint": str(checkpoint)})
    evals = EvalLog(exp, encoded.eval_items, data.recipes, tokenizer, tracker, run_dir / "samples.jsonl")
    try:
        evals.run(model, stage, step)
    finally:
        tracker.close()
    summary = {"run_id": run_id, "experiment": exp.name, "run_dir": str(run_dir), "checkpoint": str(checkpoint),
               "stages": [{"name": stage, "start_step": step, "end_step": step,
                           "metrics": evals.stage_end_table(stage)}],
               "seesaw_events": [], "timing": {"total_s": evals.seconds, "eval_s": evals.seconds, "eval_share": 1.0}}
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, default=str))
    console.final_report(summary, exp.eval.splits)
    return RunResult(run_dir, summary)
