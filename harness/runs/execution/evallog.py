"""The run's evaluation log: runs the evaluators on the fixed eval items at a step and sends every result where it
belongs — metric rows (with ``n`` and a Wilson interval on proportions) to the tracker (store, wandb), predictions
with their per-item outcomes to ``samples.jsonl``, tables to wandb — and keeps the history the stage summaries and
the seesaw detection read (metric values, and per-item outcomes for the paired test). The lm-eval benchmarks due at
an evaluation (``eval.benchmarks``) run with it and go the same ways (:func:`make_benchmarks`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config import EvalSpec
from harness.core.jsonl import append_jsonl, read_jsonl
from harness.core.metrics import LOSS_POOL_METRICS, is_benchmark_task
from harness.core.store import Row, atomic_write_text
from harness.evaluation import EVAL_METRICS, hijack_token_ids, run_evaluation
from harness.evaluation.evidence import outcome_rows
from harness.evaluation.forgetting import ReferenceText, is_reference_task
from harness.evaluation.image_use import image_eval
from harness.models.modality import model_io
from harness.runs.planning.plan import RunPlan
from harness.training import parallel as distributed


@dataclass
class EvalLog:
    """Runs the evaluators on the fixed eval items and sends every result where it belongs.

    ``resume_filter(stage, step, metric)``: this run continues a killed one; its samples the filter rejects are
    dropped from ``samples.jsonl`` (the tracker drops its rows the same way). The history starts with the
    evaluation rows already in the tracker's store.
    """

    spec: EvalSpec  # the experiment's eval section
    items: list
    recipes: dict[str, Any]
    tokenizer: Any
    tracker: Any
    samples_path: Path
    on_evaluation: Callable[[str, int, list[Row]], None] | None = None
    resume_filter: Callable[[str, int, str], bool] | None = None
    run_id: str | None = None  # written first on every sample line
    image_eval: Callable[[Any], tuple[list, list]] | None = None  # harness.evaluation.image_use.ImageEval
    shard: Any = None  # data-parallel ranks share out the eval batches (harness.evaluation.sharding.Shard)
    benchmarks: Any = None  # eval.benchmarks (harness.evaluation.benchmarks.Benchmarks): lm-eval tasks, when due
    reference: Any = None  # the forgetting probe's reference text (harness.evaluation.forgetting.ReferenceText)
    # the loss pool's items (eval.loss_items; data_recipes.loss_pool)
    loss_items: list = field(default_factory=list)
    history: list[Row] = field(default_factory=list)  # every evaluation row, in order
    outcomes: list[dict] = field(default_factory=list)  # per-item outcome rows (evidence.outcome_rows), in order
    seconds: float = 0.0
    bench_seconds: float = 0.0  # the part of ``seconds`` spent in benchmarks

    def __post_init__(self):
        self.hijack_ids = hijack_token_ids(self.tokenizer, self.spec.hijack_words)
        if self.resume_filter is not None:
            _truncate_samples(self.samples_path, self.resume_filter)
        self.history = [r for r in self.tracker.existing_rows() if _is_eval_row(r)]
        if self.history:  # a resumed run, or stages replayed from the stage cache: their items' outcomes too
            self.outcomes = _resumed_outcomes(self.samples_path, self.history)

    @classmethod
    def for_run(
        cls,
        plan: RunPlan,
        tracker,
        run_dir: Path,
        on_evaluation: Callable[[str, int, list[Row]], None] | None,
        run_id: str,
        resume_filter: Callable[[str, int, str], bool] | None = None,
    ) -> EvalLog:
        """The log of the run ``plan`` compiled, in ``run_dir``: its eval items and evaluators — the image tasks'
        (:func:`harness.evaluation.image_use.image_eval`), the benchmarks (:func:`make_benchmarks`), the forgetting
        probe's reference text (``plan.data.reference``) with the base model's losses on it, measured here before
        any stage trains it — the loss pool, and this process's share of the evaluation batches."""
        data, tokenizer = plan.data, plan.base.tokenizer
        benchmarks = make_benchmarks(plan.eval, plan.name, data.world, tokenizer, run_dir, plan.stage_steps)
        reference = None
        if data.reference is not None:
            reference = ReferenceText(*data.reference, tokenizer, plan.base.model, plan.eval.batch_size)
        return cls(
            plan.eval,
            plan.encoded.eval_items,
            data.recipes,
            tokenizer,
            tracker,
            run_dir / "samples.jsonl",
            on_evaluation,
            resume_filter=resume_filter,
            run_id=run_id,
            image_eval=image_eval(plan.images, data, model_io(tokenizer)),
            shard=distributed.current(),
            benchmarks=benchmarks,
            reference=reference,
            loss_items=plan.encoded.loss_items,  # eval.loss_items: scored at the end of every stage
        )

    def run(self, model, stage: str, step: int) -> None:
        started = time.perf_counter()
        result = run_evaluation(
            model, self.tokenizer, self.items, self.recipes, self.spec, self.hijack_ids, shard=self.shard
        )
        metrics, samples = list(result.metrics), list(result.samples)
        if self.image_eval is not None:  # image tasks: greedy with their images and the image_use probe
            image_rows, image_samples = self.image_eval(model)
            metrics, samples = metrics + image_rows, samples + image_samples
        rows = []
        for task, split, metric, value, *given in metrics:  # image rows may carry (n, low, high) themselves
            text = json.dumps(result.top1.get((task, split), [])) if metric == "ft_top1" else None
            ci = result.interval(task, split, metric)
            interval = tuple(given) if given else (ci.n, ci.low, ci.high) if ci is not None else ()
            rows.append(Row(stage, step, task, split, metric, value, text, *interval))
        bench_rows, bench_samples = self._benchmarks(model, step)
        if self.reference is not None:  # the forgetting probe: every rank computes it (FSDP needs them all)
            ref_rows, ref_samples = self.reference.evaluate(model)
            bench_rows, bench_samples = bench_rows + ref_rows, bench_samples + ref_samples
        rows += [Row(stage, step, *row[:4], None, *row[4:]) for row in bench_rows]
        self._log_tables(result, step)
        self._store(stage, step, rows, samples + bench_samples, started)

    def run_loss_pool(self, model, stage: str, step: int) -> None:
        """Score the loss pool (``eval.loss_items``) teacher-forced only and record its loss targets, split
        ``loss_<split>``, at ``step`` (a stage's end: beside its last evaluation, so the stage summary holds them).
        Sent to ``on_evaluation`` at that same step: a sweep's reporter adds the rows to the stage's last evaluation
        (its trial table) and does not report the step to the pruner again."""
        if not self.loss_items:
            return
        started = time.perf_counter()
        spec = self.spec.model_copy(update={"evaluators": ["teacher_forced"], "probes": []})
        result = run_evaluation(model, self.tokenizer, self.loss_items, self.recipes, spec, set(), shard=self.shard)
        rows = [Row(stage, step, t, s, m, v) for t, s, m, v in result.metrics if m in LOSS_POOL_METRICS]
        self._store(stage, step, rows, result.samples, started)

    def _store(self, stage: str, step: int, rows: list[Row], samples: list[dict], started: float) -> None:
        """Write an evaluation's samples (tagged with its stage and step) and per-item outcomes, count its time
        since ``started``, and record its rows."""
        samples = [{"stage": stage, "step": step, **sample} for sample in samples]
        # One write + flush + fsync per evaluation: a kill leaves at most an unfinished last line, which readers skip.
        append_jsonl(self.samples_path, samples, run_id=self.run_id)
        self.outcomes.extend(outcome_rows(samples))
        self.seconds += time.perf_counter() - started
        self._record(rows, step)

    def _benchmarks(self, model, step: int) -> tuple[list[tuple], list[dict]]:
        """The rows and samples of the benchmarks due at ``step``; with several ranks rank 0 alone runs them."""
        due = self.benchmarks.due(step) if self.benchmarks is not None else []
        if not due or (self.shard is not None and self.shard.rank != 0):
            return [], []
        started = time.perf_counter()
        result = self.benchmarks.run(model, due)
        self.bench_seconds += time.perf_counter() - started
        return result.rows, result.samples

    def repeat_last(self, stage: str) -> None:
        """Record the previous evaluation again under ``stage`` (a stage starting from the previous one's
        weights begins exactly where that one ended: no need to evaluate twice)."""
        if not self.history:
            return
        step = self.history[-1].step
        last = [r for r in self.history if r.step == step and r.stage == self.history[-1].stage]
        self._record(
            [Row(stage, r.step, r.task, r.split, r.metric, r.value, r.text, r.n, r.ci_low, r.ci_high) for r in last],
            step,
        )
        self.outcomes.extend(_relabelled(self.outcomes, step, stage))

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
            if per_key.get(key, 0) >= self.spec.samples:
                continue
            per_key[key] = per_key.get(key, 0) + 1
            top5 = " ".join(f"{t['token']!r}:{t['prob']:.2f}" for t in s.get("top5", []))
            data.append([s["task"], s["split"], s["prompt"], s["gold"], s.get("pred"), s.get("correct"), top5])
        self.tracker.log_table(
            "samples", ["task", "split", "prompt", "gold", "pred", "correct", "top5_first"], data, step
        )
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

    def stage_end_intervals(self, stage: str) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
        """``{split: {task: {metric: {n, ci_low, ci_high}}}}`` of the proportions in :meth:`stage_end_table`."""
        rows = [r for r in self.history if r.stage == stage]
        out: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
        for r in rows:
            if r.step == max(x.step for x in rows) and r.n is not None:
                out.setdefault(r.split, {}).setdefault(r.task, {})[r.metric] = {
                    "n": r.n,
                    "ci_low": r.ci_low,
                    "ci_high": r.ci_high,
                }
        return out

    def history_dicts(self) -> list[dict[str, Any]]:
        return [
            {"stage": r.stage, "step": r.step, "task": r.task, "split": r.split, "metric": r.metric, "value": r.value}
            for r in self.history
        ]


def _is_eval_row(row: Row) -> bool:
    """Rows written by evaluations (the others are training metrics, compositions and seesaw events)."""
    return row.task is not None and (
        row.metric in EVAL_METRICS
        or row.metric.startswith("img_")
        or is_benchmark_task(row.task)
        or is_reference_task(row.task)
    )


def _relabelled(outcomes: list[dict], step: int, stage: str) -> list[dict]:
    """The outcome rows of the evaluation at ``step`` (its last-recorded stage) again under ``stage``, as
    :meth:`EvalLog.repeat_last` records its metric rows again."""
    at_step = [o for o in outcomes if o["step"] == step]
    last_stage = at_step[-1]["stage"] if at_step else None
    return [{**o, "stage": stage} for o in at_step if o["stage"] == last_stage and last_stage != stage]


def _resumed_outcomes(samples_path: Path, history: list[Row]) -> list[dict]:
    """The outcome rows of a resumed run's kept evaluations, read back from its (truncated) ``samples.jsonl``; an
    evaluation that a stage repeated (same step, another stage, no samples of its own) is relabelled as it was."""
    if not samples_path.exists():
        return []
    outcomes = outcome_rows(read_jsonl(samples_path))
    have = {(o["step"], o["stage"]) for o in outcomes}
    for step, stage in dict.fromkeys((r.step, r.stage) for r in history):
        if (step, stage) not in have:
            outcomes.extend(_relabelled(outcomes, step, stage))
            have.add((step, stage))
    return outcomes


def _truncate_samples(path: Path, keep: Callable[[str, int, str], bool]) -> None:
    if not path.exists():
        return
    # read_jsonl skips (with a warning) the unfinished last line a kill mid-write leaves.
    kept = [json.dumps(s, ensure_ascii=False) + "\n" for s in read_jsonl(path) if keep(s["stage"], s["step"], "")]
    atomic_write_text(path, "".join(kept))


def make_benchmarks(spec: EvalSpec, experiment: str, world: Any, tokenizer: Any, run_dir: Path, stage_steps: list[int]):
    """The run's :class:`harness.evaluation.benchmarks.Benchmarks` (None without ``eval.benchmarks``): the shipped
    world tasks written into ``run_dir/benchmarks``, the stage edges from each stage's step count, and every task
    name checked against lm-eval's index — an unknown one is a :class:`ConfigError` naming its field (in experiment
    ``experiment``), before any training."""
    if not spec.benchmarks:
        return None
    from harness.config import ConfigError
    from harness.evaluation.benchmarks import Benchmarks, materialise

    include = [str(materialise(spec.benchmarks, world, run_dir / "benchmarks"))]
    include += list(dict.fromkeys(s.include_path for s in spec.benchmarks if s.include_path))
    edges = {0}
    for steps in stage_steps:
        edges.add(max(edges) + steps)
    benchmarks = Benchmarks(
        spec.benchmarks, include, tokenizer, batch_size=spec.batch_size, stage_edges=frozenset(edges)
    )
    unknown = benchmarks.unknown()
    if unknown:
        raise ConfigError(experiment, [(f"eval.benchmarks[{i}].task", m) for i, m in unknown])
    return benchmarks
