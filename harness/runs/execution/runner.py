"""Run an experiment end to end — claim (or reopen) its run directory, compile the experiment into its plan
(:func:`harness.runs.planning.plan.plan_run`), write the run's files (:func:`run_files`), then execute the plan:
stages trained, evaluated and checkpointed, then the summary — continuing a killed run from its newest resume point.

Only planning and the steps around it (:func:`run_files`: the resolved config and the run id; :func:`_reopen_run`: a
resume's check that the experiment is the same) read the experiment; from :func:`_execute` on, everything reads the
:class:`RunPlan` (the loop is
:func:`harness.training.loop.train_stage`, the evaluations :class:`harness.runs.execution.evallog.EvalLog`, the
stage cache :class:`harness.runs.execution.stage_cache.StageCache`, where results go
:mod:`harness.runs.execution.tracking`).
"""

from __future__ import annotations

import functools
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness.config import ConfigError, Experiment, computing_debug, dump_yaml, safe_load
from harness.core.store import Row, atomic_write_text
from harness.data.stage_batches import StagePlan
from harness.evaluation.evidence import baseline_rows, baselines_summary, pool_baselines, run_seesaw, seesaw_rows
from harness.models.modality import model_io
from harness.runs.execution.console import Console
from harness.runs.execution.evallog import EvalLog
from harness.runs.execution.packing_decision import stage_layout
from harness.runs.execution.rundir import claim_run_dir, clear_run_outputs, unique_run_name
from harness.runs.execution.stage_cache import StageCache
from harness.runs.execution.tracking import Tracker
from harness.runs.planning.plan import RunPlan, plan_run
from harness.runs.planning.prepare import after_progress
from harness.training import parallel as distributed
from harness.training.adapters import (
    format_trainable_report,
    trainable_report,
)
from harness.training.checkpoint import (
    Start,
    latest_resume_point,
    resume_start,
    save_resume_point,
    save_stage_checkpoint,
)
from harness.training.guard import Injector, NoFaults, NonFiniteError, write_report
from harness.training.loop import LoopState, StageLoop, train_stage
from harness.training.special_tokens import stage_special_tokens
from harness.training.stage_start import InitStates, stage_model, starting_model


def new_run_id(exp: Experiment) -> str:
    return f"{exp.name}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def default_run_dir(exp: Experiment, root: Path = Path("runs")) -> Path:
    return root / exp.name / unique_run_name()


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]


def run_experiment(
    exp: Experiment,
    run_dir: Path,
    console=None,
    on_evaluation: Callable[[str, int, list[Row]], None] | None = None,
    resume: bool = False,
    force: bool = False,
    on_progress: Callable[[], None] | None = None,
) -> RunResult:
    """Train and evaluate ``exp`` into ``run_dir``; returns the summary (also written to ``summary.json``).

    ``on_progress()`` is called after every training step and every evaluation (a sweep trial's heartbeat: a run
    that stops progressing, hung in a step, stops calling it).

    ``run_dir`` is claimed first (:func:`harness.runs.execution.rundir.claim_run_dir`): a directory in use by another
    run, or holding files without ``resume`` / ``force``, raises
    :class:`~harness.runs.execution.rundir.RunDirError`; ``force`` deletes the earlier run's outputs before starting.
    """
    with claim_run_dir(run_dir, resume=resume, force=force):
        if force and not resume:
            clear_run_outputs(run_dir)
        return _run_claimed(exp, run_dir, console, after_progress(on_progress, on_evaluation), resume, on_progress)


def _run_claimed(
    exp: Experiment,
    run_dir: Path,
    console,
    on_evaluation: Callable[[str, int, list[Row]], None] | None,
    resume: bool,
    on_progress: Callable[[], None] | None = None,
) -> RunResult:
    """The body of :func:`run_experiment`, in a directory this process holds.

    ``on_evaluation(stage, step, rows)`` is called after every evaluation (sweeps report to their pruner there);
    an exception it raises ends the run, with the store flushed and the wandb run closed as failed.
    With ``resume``, ``run_dir`` holds a killed run of the same experiment, which continues from its newest
    resumable checkpoint (``train.checkpoint_every``); the final metrics equal an uninterrupted run's.
    """
    console = console or Console(enabled=exp.tracking.console)
    started = time.perf_counter()
    files: dict[str, str] = {}
    if resume:
        run_id, point = _reopen_run(exp, run_dir, console)
    else:
        run_id, point = new_run_id(exp), None
        files = run_files(exp, run_id)
        console.info(f"run {run_id} → {run_dir}")
    torch.manual_seed(exp.seed)
    np.random.seed(exp.seed % 2**32)  # third-party code that uses the global numpy RNG stays deterministic
    plan = plan_run(exp, console, on_progress)  # every data error surfaces here, before any training
    # Written once planned: a run stopped by its data (or killed while pretraining its base) leaves the directory
    # as it found it, so the corrected rerun on the same --out is not refused as a used one.
    for name, text in files.items():
        atomic_write_text(run_dir / name, text)
    return _execute(plan, run_dir, run_id, point, console, on_evaluation, resume, on_progress, started)


def _execute(
    plan: RunPlan,
    run_dir: Path,
    run_id: str,
    point: Path | None,
    console,
    on_evaluation: Callable[[str, int, list[Row]], None] | None,
    resume: bool,
    on_progress: Callable[[], None] | None,
    started: float,
) -> RunResult:
    """Run ``plan`` in ``run_dir``: decide once where to start (after the stages the stage cache holds, or where the
    resume point ``point`` left off), log the baselines, replay the cached stages, train the rest, close the run."""
    cache = StageCache.for_run(plan, run_dir, run_id, console)
    start = resume_start(point, plan.stages, plan.stage_steps) if resume else cache.start()
    tracker = Tracker(plan.tracking.wandb, run_dir, run_id, plan.resolved, resume_filter=start.keep)
    baselines = log_baselines(tracker, pool_baselines(plan.encoded.eval_items, plan.data.recipes), plan.stages[0].name)
    cache.replay(tracker, run_dir / "samples.jsonl", on_evaluation)  # after the baselines: the order of a whole run
    said = console.evaluation_hook(plan.encoded.eval_items, on_evaluation)
    evals = EvalLog.for_run(plan, tracker, run_dir, said, run_id, start.keep)
    summary_stages = [
        _stage_summary(plan.stage_plans[i].recorded(tracker.store.rows()), evals, i, plan.stage_plans)
        for i in range(start.stage_index)
    ]
    cache.annotate(summary_stages)
    model, init = starting_model(plan.base.model, start, plan.stages, run_dir, plan.base.added, plan.undertrained_ids)
    run = _Run(plan, run_dir, run_id, console, tracker, evals, init, baselines)
    step = _train_stages(run, model, start, cache, summary_stages, on_progress)
    summary = _close_run(run, step, summary_stages, started, start.resumed_from)
    return finish_run(run_dir, summary, console, plan.eval.splits)


def _train_stages(run: _Run, model, start: Start, cache: StageCache, summary_stages: list, on_progress) -> int:
    """Every stage from where ``start`` says to the last, each computed and stored through the stage cache, its
    summary appended to ``summary_stages``; the global step at the end. A non-finite stop leaves its report beside
    the last good checkpoint; on any failure the store is flushed and the wandb run closed as failed."""
    plan, tracker = run.plan, run.tracker
    faults = plan.debug.inject_nonfinite
    injector = Injector(**faults.model_dump()) if faults else NoFaults()
    step, loop_state, exit_code = start.step, start.loop_state, 1
    try:
        for index in range(start.stage_index, len(plan.stages)):
            run_stage = functools.partial(_run_stage, run, model, index, step, loop_state, injector, on_progress)
            begins = loop_state.batch_index == 0  # a resumed run may continue inside a stage
            model, step = cache.computed(index, run_stage, tracker, run.run_dir / "samples.jsonl", begins)
            summary_stages.append(_stage_summary(plan.stage_plans[index], run.evals, index, plan.stage_plans))
            loop_state = LoopState()  # the next stage begins at its first batch
        exit_code = 0
    except NonFiniteError as e:
        write_report(run.run_dir, e.report)  # the last good checkpoint is left as it was
        raise
    finally:
        tracker.flush()
        if exit_code:
            tracker.close(exit_code)
    return step


def _run_stage(
    run: _Run,
    model,
    index: int,
    step: int,
    loop_state: LoopState,
    injector: Injector | NoFaults,
    on_progress: Callable[[], None] | None,
) -> tuple[Any, int]:
    """Stage ``index`` from where ``loop_state`` left it (its first batch, or inside it on a resume) to its end:
    ``(model, step)`` after it."""
    plan, tracker = run.plan, run.tracker
    stage, stage_plan = plan.stages[index], plan.stage_plans[index]
    if loop_state.batch_index == 0:  # the stage begins here (a resumed run may continue inside one)
        model = _begin_stage(run, model, index, step)
    batches, loop_state.packing = stage_layout(  # a resumed stage keeps the layout it began with (no check)
        stage_plan,
        model,
        list(plan.tasks),
        plan.base.tokenizer.pad_token_id,
        step,
        tracker.log if loop_state.batch_index == 0 else None,
        loop_state.packing,
    )
    save_resume_point_at = _resume_saver(run, model, index)
    with run.console.stage_progress(stage.name, len(stage_plan.batches)) as advance:
        advance(loop_state.batch_index)
        step = train_stage(
            model,
            batches,
            StageLoop(
                stage=stage.name,
                start_step=step - loop_state.batch_index,
                tasks=list(plan.tasks),
                log=tracker.log,
                evaluate=lambda s, name=stage.name: run.evals.run(model, name, s),
                train=stage.train,
                special_tokens=stage_special_tokens(plan.base.tokenizer, stage_plan.token_batches()),
                eval_every=plan.eval.every,
                injector=injector,
                save_checkpoint=save_resume_point_at,
                progress=after_progress(on_progress, advance),
                kill_at=distributed.kill_step(plan.debug.kill_rank),
                measure_steering=plan.steering.measure(index, stage, model, distributed.current()),
            ),
            resume=loop_state,
        )
    _end_stage(run, model, index, step, save_resume_point_at)
    return model, step


# ----------------------------------------------------------------------------------------------------------------
# Opening and closing a run
# ----------------------------------------------------------------------------------------------------------------


def run_files(exp: Experiment, run_id: str, **identity: str) -> dict[str, str]:
    """What makes a directory the run ``run_id`` of ``exp``: the resolved experiment and ``run.json`` (the run id,
    the experiment's name, plus ``identity``), by file name."""
    return {
        "config.resolved.yaml": dump_yaml(exp.resolved_dict()),
        "run.json": json.dumps({"run_id": run_id, "experiment": exp.name, **identity}),
    }


def open_run(exp: Experiment, run_dir: Path, **identity: str) -> str:
    """Write :func:`run_files` of a new run id into ``run_dir`` (``identity`` added to ``run.json``); returns the
    run id."""
    run_id = new_run_id(exp)
    for name, text in run_files(exp, run_id, **identity).items():
        atomic_write_text(run_dir / name, text)
    return run_id


def _reopen_run(exp: Experiment, run_dir: Path, console) -> tuple[str, Path | None]:
    """The id of the killed run in ``run_dir`` (which must be of this very experiment) and its newest resume
    point, if it wrote one."""
    if not (run_dir / "config.resolved.yaml").exists():
        said = "not a run directory (no config.resolved.yaml, which a run writes once planned: rerun without --resume)"
        raise ConfigError(str(run_dir), [("", said)])
    changed = changed_sections(exp, run_dir)
    if changed:
        raise ConfigError(str(run_dir), [(k, "differs from the run being resumed") for k in changed])
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    point = latest_resume_point(run_dir)
    console.info(f"resuming {run_id} from {point.name if point else 'the start (no resumable checkpoint)'}")
    return run_id, point


def changed_sections(exp: Experiment, run_dir: Path) -> list[str]:
    """The top-level sections of ``exp`` that differ from the experiment the run in ``run_dir`` was started with
    (its ``config.resolved.yaml``, which must exist)."""
    # debug.kill_rank says how a run was stopped, not what it computes: left out on both sides
    before = _without_kill(safe_load((run_dir / "config.resolved.yaml").read_text()))
    now = _without_kill(json.loads(json.dumps(exp.resolved_dict())))
    return sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))


def _without_kill(resolved: dict) -> dict:
    return {**resolved, "debug": computing_debug(resolved.get("debug") or {})}


def log_baselines(tracker: Tracker, baselines: dict, stage: str) -> dict[str, Any]:
    """Log the eval pools' baselines (``baseline_<metric>`` rows at step 0, unless a resumed run's store already has
    them); returns them for ``summary.json``."""
    if not any(r.metric.startswith("baseline_") for r in tracker.existing_rows()):
        tracker.log(baseline_rows(baselines, stage, 0), 0)
    return baselines_summary(baselines)


def _close_run(
    run: _Run,
    step: int,
    stages: list[dict[str, Any]],
    started: float,
    resumed_from: str | None,
) -> dict[str, Any]:
    """Log the seesaw events of the whole run (under ``eval.seesaw_test``) and close the tracker; returns the run's
    summary."""
    plan, spec = run.plan, run.plan.eval
    events, n_tests = run_seesaw(
        run.evals.outcomes,
        run.evals.history_dicts(),
        test=spec.seesaw_test,
        delta=spec.seesaw_delta,
        alpha=spec.seesaw_alpha,
        seed=plan.seed,
    )
    run.tracker.log(seesaw_rows(events, n_tests, spec, plan.stages[-1].name, step), step)
    total = time.perf_counter() - started
    summary = {
        "run_id": run.run_id,
        "experiment": plan.name,
        "run_dir": str(run.run_dir),
        "base": plan.base.info,
        "stages": stages,
        "baselines": run.baselines,
        "seesaw_events": events,
        "seesaw": {"test": spec.seesaw_test, "alpha": spec.seesaw_alpha, "delta": spec.seesaw_delta, "tests": n_tests},
        "timing": {
            "total_s": total,
            "eval_s": run.evals.seconds,
            "base_s": plan.base.info["seconds"],
            "eval_share": run.evals.seconds / total if total else 0.0,
            # of eval_s: the lm-eval benchmarks (eval.benchmarks), so their overhead reads off one run
            **({"bench_s": run.evals.bench_seconds} if spec.benchmarks else {}),
        },
        "resumed_from": resumed_from,
        "undertrained_tokens": plan.base.undertrained,
        "too_long": plan.encoded.too_long_counts(),  # eval items dropped as too long for the model, per "task/split"
    }
    run.tracker.summary({"final/" + k: v for k, v in summary["timing"].items()})
    run.tracker.close(0)
    return summary


def finish_run(run_dir: Path, summary: dict[str, Any], console, splits: list[str]) -> RunResult:
    """Write ``summary.json`` and say the final report (``splits``: the evaluation splits, in order)."""
    atomic_write_text(run_dir / "summary.json", json.dumps(summary, indent=2, default=str))
    console.final_report(summary, splits)
    return RunResult(run_dir, summary)


# ----------------------------------------------------------------------------------------------------------------
# The steps of run_experiment
# ----------------------------------------------------------------------------------------------------------------


@dataclass
class _Run:
    """A run as it executes: its plan (read only) and what the stages share besides it."""

    plan: RunPlan
    run_dir: Path
    run_id: str
    console: Any
    tracker: Tracker
    evals: EvalLog
    init: InitStates
    baselines: dict[str, Any] = field(default_factory=dict)  # summary.json's "baselines"


def _begin_stage(run: _Run, model, index: int, step: int):
    """The stage's starting weights and trainable set, logged; then the evaluation of its starting point."""
    stages, stage_plan = run.plan.stages, run.plan.stage_plans[index]
    stage = stages[index]
    model = stage_model(model, stages, index, run.init, run.plan.base.added, run.plan.undertrained_ids)
    report = trainable_report(model)
    run.tracker.log(
        [
            Row(stage.name, step, None, "train", "trainable_params", report["trainable"]),
            Row(stage.name, step, None, "train", "trainable_share", report["share"]),
        ],
        step,
    )
    run.console.info(f"stage {stage.name}: {format_trainable_report(report)}")
    run.console.info(
        f"stage {stage.name} ({index + 1}/{len(stages)}): {len(stage_plan.batches)} steps, init "
        f"{stage.init}, mixture {_mixture_said(stage.mixture)}: "
        + ", ".join(f"{t} {c['share']:.2f}" for t, c in sorted(stage_plan.composition.items()))
    )
    if index > 0 and stage.init == "previous":
        run.evals.repeat_last(stage.name)
    else:
        run.evals.run(model, stage.name, step)
    return model


def _mixture_said(mixture) -> str:
    """``weights``, ``natural``, … or ``adaptive (odm, every: 1; shares so far)``."""
    if mixture.kind != "adaptive":
        return mixture.kind
    return f"adaptive ({mixture.adaptive.method}, every: {mixture.adaptive.every}; shares so far)"


def _resume_saver(run: _Run, model, index: int) -> Callable[[int, LoopState], None]:
    """``save(step, loop_state)``: a resume point in stage ``index`` (the store flushed first, so the rows a
    resume keeps are on disk)."""
    stage = run.plan.stages[index]

    def save(at_step: int, loop_state: LoopState) -> None:
        run.tracker.flush()
        save_resume_point(run.run_dir, model, index, stage.name, at_step, loop_state, stage.train.keep_checkpoints)

    return save


def _end_stage(run: _Run, model, index: int, step: int, save_resume_point_at) -> None:
    """Log the stage's effective composition; keep its weights when a later stage starts from them; write its
    Hugging Face checkpoint and a resume point at its end (as the stage asks); score the loss pool, if any."""
    stage, stage_plan = run.plan.stages[index], run.plan.stage_plans[index]
    run.evals.run_loss_pool(model, stage.name, step)  # inside the stage: the stage cache stores and replays it
    run.tracker.log(
        [
            Row(stage.name, step, task, "train", f"mix_{key}", value)
            for task, c in stage_plan.composition.items()
            for key, value in c.items()
        ],
        step,
    )
    if run.init.keep(stage.name, model) or stage.train.checkpoint:
        save_stage_checkpoint(
            model,
            model_io(run.plan.base.tokenizer).saved_with_weights(),
            run.run_dir / "checkpoints" / stage.name,
            {"run_id": run.run_id, "stage": stage.name, "step": step, "experiment": run.plan.name},
        )
    if stage.train.checkpoint_every:
        save_resume_point_at(step, LoopState(len(stage_plan.batches)))


def _stage_summary(plan: StagePlan, evals: EvalLog, index: int, plans: list[StagePlan]) -> dict[str, Any]:
    start = sum(len(p.batches) for p in plans[:index])
    return {
        "name": plan.stage.name,
        "start_step": start,
        "end_step": start + len(plan.batches),
        "init": plan.stage.init,
        "mixture": plan.stage.mixture.to_yaml(),
        "composition": plan.composition,
        "metrics": evals.stage_end_table(plan.stage.name),
        "intervals": evals.stage_end_intervals(plan.stage.name),
    }
