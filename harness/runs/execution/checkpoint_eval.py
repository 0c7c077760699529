"""``harness eval``: a saved checkpoint evaluated alone, with the experiment's evaluators, probes, benchmarks and
outputs (store, samples.jsonl, summary.json, wandb), in a run directory of its own."""

from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from harness.config import ConfigError, Experiment
from harness.data.encoding import position_limit
from harness.evaluation.evidence import pool_baselines
from harness.runs.execution.console import Console
from harness.runs.execution.evallog import EvalLog, make_benchmarks
from harness.runs.execution.rundir import claim_run_dir, unique_run_name
from harness.runs.execution.runner import RunResult, finish_run, log_baselines, open_run
from harness.runs.execution.tracking import Tracker
from harness.runs.planning.prepare import build_task_data, encode_task_data


def eval_output_dir(out: Path | None, exp: Experiment, root: Path = Path("runs")) -> Path:
    """Where ``harness eval`` writes: ``out`` when it is new or empty, else a new ``eval-<time>-<hex>``
    subdirectory of it (so ``--out RUN`` never touches the training run's own files); default
    ``runs/<name>/eval-<time>-<hex>``."""
    if out is None:
        return root / exp.name / unique_run_name("eval")
    if out.is_dir() and any(out.iterdir()):
        return out / unique_run_name("eval")
    return out


def evaluate_checkpoint(exp: Experiment, checkpoint: Path, run_dir: Path, console=None) -> RunResult:
    """Evaluate a saved checkpoint alone with the experiment's evaluators, probes and splits; writes the same
    outputs as a run (store, samples.jsonl, summary.json, wandb) into ``run_dir``, which it claims (a non-empty or
    busy directory raises :class:`~harness.runs.execution.rundir.RunDirError`)."""
    if not (checkpoint / "config.json").exists():
        raise ConfigError(str(checkpoint), [("", "not a Hugging Face checkpoint directory (no config.json)")])
    with claim_run_dir(run_dir, resume=False, force=False):
        return _evaluate_claimed(exp, checkpoint, run_dir, console or Console(enabled=exp.tracking.console))


def _evaluate_claimed(exp: Experiment, checkpoint: Path, run_dir: Path, console) -> RunResult:
    run_id = open_run(exp, run_dir, checkpoint=str(checkpoint))
    meta_path = checkpoint / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    stage, step = meta.get("stage", "checkpoint"), int(meta.get("step", 0))
    model = AutoModelForCausalLM.from_pretrained(checkpoint, trust_remote_code=exp.model.trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=exp.model.trust_remote_code)
    data = build_task_data(exp)
    encoded = encode_task_data(exp, data, tokenizer, position_limit(model.config))
    for note in encoded.notes():
        console.info(note)
    tracker = Tracker(exp.tracking.wandb, run_dir, run_id, {**exp.resolved_dict(), "checkpoint": str(checkpoint)})
    evals = EvalLog(
        exp.eval,
        encoded.eval_items,
        data.recipes,
        tokenizer,
        tracker,
        run_dir / "samples.jsonl",
        console.evaluation_hook(encoded.eval_items),
        run_id=run_id,
        benchmarks=make_benchmarks(exp.eval, exp.name, data.world, tokenizer, run_dir, [step]),
    )
    try:
        baselines = log_baselines(tracker, pool_baselines(encoded.eval_items, data.recipes), stage)
        evals.run(model, stage, step)
    finally:
        tracker.close()
    summary = {
        "run_id": run_id,
        "experiment": exp.name,
        "run_dir": str(run_dir),
        "checkpoint": str(checkpoint),
        "stages": [
            {
                "name": stage,
                "start_step": step,
                "end_step": step,
                "metrics": evals.stage_end_table(stage),
                "intervals": evals.stage_end_intervals(stage),
            }
        ],
        "baselines": baselines,
        "seesaw_events": [],
        "too_long": encoded.too_long_counts(),
        "timing": {"total_s": evals.seconds, "eval_s": evals.seconds, "eval_share": 1.0},
    }
    return finish_run(run_dir, summary, console, exp.eval.splits)
