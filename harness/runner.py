"""Run an experiment end to end: data → base model → stages (train, evaluate, checkpoint) → summary.

This module wires components together; the loop itself is :func:`harness.train.train_stage` and the metrics
come from :mod:`harness.evaluation`.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import numpy as np

from harness.config import Experiment, ResolvedStage, dump_yaml
from harness.store import Row, atomic_write_text

SUMMARY_METRICS = ("greedy", "mode_ok", "tf_first", "ft_rank_mean", "ft_hijack")


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


@dataclass
class EncodedData:
    train: dict[str, list]  # task -> [Encoded]
    eval_items: list  # [EvalItem] over every task and eval split, fixed for the whole run


def encode_task_data(exp: Experiment, data: TaskData, tokenizer) -> EncodedData:
    from harness.data import encode_examples, eval_items

    train = {name: encode_examples(tokenizer, splits["train"]) for name, splits in data.splits.items()}
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


def stage_batches(stage: ResolvedStage, index: int, seed: int, pools: dict[str, list], pad_id: int):
    """The stage's batches and its effective composition (examples and tokens per task, too-long drops)."""
    from harness.data import collate, length_grouped_batches, mixture_stream

    kept, dropped = {}, {}
    for task in stage.mixture.tasks:
        kept[task] = [e for e in pools[task] if e.length <= stage.train.max_length]
        dropped[task] = len(pools[task]) - len(kept[task])
        if not kept[task]:
            raise DataError(f"stage {stage.name!r}: every example of task {task!r} is longer than "
                            f"max_length={stage.train.max_length}")
    rng = np.random.default_rng([seed, index])
    n = sum(stage.mixture.counts.values()) if stage.mixture.kind == "counts" else stage.steps * stage.train.batch_size
    draws = mixture_stream(stage.mixture, {t: len(p) for t, p in kept.items()}, n, rng)
    examples = [kept[t][i] for t, i in draws]
    grouped = length_grouped_batches(examples, stage.train.batch_size, stage.train.length_grouping, rng)
    batches = [collate(b, pad_id) for b in grouped]
    composition: dict[str, dict[str, float]] = {}
    for e in examples:
        c = composition.setdefault(e.task, {"examples": 0, "tokens": 0, "supervised_tokens": 0})
        c["examples"] += 1
        c["tokens"] += e.length
        c["supervised_tokens"] += e.n_supervised
    for task, c in composition.items():
        c["share"] = c["examples"] / len(examples)
        c["dropped_too_long"] = dropped.get(task, 0)
    return batches, composition


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
    history: list[dict] = field(default_factory=list)  # every (stage, step, task, split, metric, value)
    last_rows: list[Row] = field(default_factory=list)
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
        self._record(rows, step)
        with open(self.samples_path, "a", encoding="utf-8") as f:
            for sample in result.samples:
                f.write(json.dumps({"stage": stage, "step": step, **sample}, ensure_ascii=False) + "\n")
        self._log_tables(result, step)
        self.seconds += time.perf_counter() - started

    def repeat_last(self, stage: str) -> None:
        """Record the previous evaluation again under ``stage`` (a stage starting from the previous one's
        weights begins exactly where that one ended: no need to evaluate twice)."""
        step = self.last_rows[0].step if self.last_rows else 0
        self._record([Row(stage, r.step, r.task, r.split, r.metric, r.value, r.text) for r in self.last_rows], step)

    def _record(self, rows: list[Row], step: int) -> None:
        self.tracker.log(rows, step)
        self.tracker.flush()
        self.last_rows = rows
        self.history.extend(
            {"stage": r.stage, "step": r.step, "task": r.task, "split": r.split, "metric": r.metric, "value": r.value}
            for r in rows
        )

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
        rows = [h for h in self.history if h["stage"] == stage]
        if not rows:
            return {}
        last = max(h["step"] for h in rows)
        out: dict[str, dict[str, dict[str, float]]] = {}
        for h in rows:
            if h["step"] == last:
                out.setdefault(h["split"], {}).setdefault(h["task"], {})[h["metric"]] = h["value"]
        return out


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


def run_experiment(exp: Experiment, run_dir: Path, console=None) -> RunResult:
    """Train and evaluate ``exp`` into ``run_dir``; returns the summary (also written to ``summary.json``)."""
    import torch
    import transformers

    from harness.checkpoint import save_atomically
    from harness.console import Console
    from harness.evaluation.seesaw import seesaw_events
    from harness.models import count_parameters, load_hf
    from harness.pretrain import builtin_base
    from harness.tracking import Tracker
    from harness.train import train_stage

    console = console or Console(enabled=exp.tracking.console)
    transformers.utils.logging.disable_progress_bar()  # our own bars are enough
    started = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.resolved.yaml", dump_yaml(exp.resolved_dict()))
    run_id = new_run_id(exp)
    torch.manual_seed(exp.seed)
    np.random.seed(exp.seed % 2**32)  # third-party code that uses the global numpy RNG stays deterministic

    console.info(f"run {run_id} → {run_dir}")
    data = build_task_data(exp)
    t0 = time.perf_counter()
    if exp.model.hf:
        model, tokenizer = load_hf(exp.model)
        base_info = {"source": exp.model.hf}
    else:
        all_train = [ex for splits in data.splits.values() for ex in splits["train"]]
        model, tokenizer, info = builtin_base(exp.model, data.corpus, all_train, exp.seed, console.progress_factory())
        base_info = {"source": exp.model.builtin, "cache_hit": info.cache_hit,
                     "cache_dir": str(info.cache_dir) if info.cache_dir else None,
                     "pretrain_final_loss": info.final_loss}
        if exp.model.pretrain is not None:
            console.info("base model: " + ("cache hit" if info.cache_hit else f"pretrained (loss {info.final_loss:.3f})")
                         + f" ({info.cache_dir})")
    base_seconds = time.perf_counter() - t0
    total_params, _ = count_parameters(model)
    console.info(f"model: {total_params / 1e6:.2f}M parameters, vocabulary {len(tokenizer)}")
    encoded = encode_task_data(exp, data, tokenizer)

    tracker = Tracker(exp, run_dir, run_id, exp.resolved_dict())
    evals = EvalLog(exp, encoded.eval_items, data.recipes, tokenizer, tracker, run_dir / "samples.jsonl")
    stages = exp.resolved_stages()
    needed_states = {s.init for s in stages} - {"previous"}
    saved_states: dict[str, dict] = {}
    if "base" in needed_states:
        saved_states["base"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    tasks = list(exp.tasks)
    step = 0
    summary_stages = []
    exit_code = 1
    try:
        for index, stage in enumerate(stages):
            if stage.init != "previous":
                model.load_state_dict(saved_states[stage.init])
            batches, composition = stage_batches(stage, index, exp.seed, encoded.train, tokenizer.pad_token_id)
            console.info(f"stage {stage.name} ({index + 1}/{len(stages)}): {len(batches)} steps, "
                         f"init {stage.init}, mixture {stage.mixture.kind}: "
                         + ", ".join(f"{t} {c['share']:.2f}" for t, c in sorted(composition.items())))
            if index > 0 and stage.init == "previous":
                evals.repeat_last(stage.name)
            else:
                evals.run(model, stage.name, step)
            start_step = step
            with console.stage_progress(stage.name, len(batches)) as advance:
                step = train_stage(
                    model, batches, stage=stage.name, start_step=step, optim=stage.train.optim,
                    log_every=stage.train.log_every, eval_every=exp.eval.every, tasks=tasks,
                    log=tracker.log, evaluate=lambda s, name=stage.name: evals.run(model, name, s),
                    progress=advance,
                )
            tracker.log([Row(stage.name, step, task, "train", f"mix_{key}", value)
                         for task, c in composition.items() for key, value in c.items()], step)
            if stage.name in needed_states:
                saved_states[stage.name] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            if stage.train.checkpoint:
                save_atomically(run_dir / "checkpoints" / stage.name, model, tokenizer,
                                {"run_id": run_id, "stage": stage.name, "step": step, "experiment": exp.name})
            summary_stages.append({"name": stage.name, "start_step": start_step, "end_step": step,
                                   "init": stage.init, "mixture": stage.mixture.to_yaml(),
                                   "composition": composition, "metrics": evals.stage_end_table(stage.name)})
        exit_code = 0
    finally:
        tracker.flush()
        if exit_code:
            tracker.close(exit_code)

    events = seesaw_events(evals.history, exp.eval.seesaw_delta)
    tracker.log([Row(e["stage_to"], e["step_to"], e["rose"], e["split"], "seesaw",
                     e["rose_by"], json.dumps(e)) for e in events], step)
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
    }
    tracker.summary({"final/" + k: v for k, v in summary["timing"].items()})
    tracker.close(0)
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, default=str))
    console.final_report(summary, exp.eval.splits)
    return RunResult(run_dir, summary)


def nullprogress():
    return nullcontext(lambda n=1: None)
