"""The two training loops ``bench/train_speed.py`` times, each on the inputs the parent prepared: the harness's
(:func:`harness_train`, the functions ``harness run`` calls) and TRL's ``SFTTrainer`` (:func:`trl_train`, fed the
harness's encoded examples as a pre-tokenised dataset). Both return per-step end times and each batch's real,
padded and supervised token counts. Not a script: ``bench/train_speed.py`` imports it (TRL itself is imported only
when a TRL run starts, so the harness configurations run without it).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.train_speed_inputs import load_inputs, load_model

# ----------------------------------------------------------------------------------------------------------------
# The harness side: the functions `harness run` calls
# ----------------------------------------------------------------------------------------------------------------


def harness_train(workdir: Path, device: str, overrides: dict, steps: int | None = None, log_every: int | None = None):
    """Plan the stage and train it with :func:`harness.training.loop.train_stage` as
    :func:`harness.runs.execution.runner.run_experiment` does. Returns ``(per-step end times, (real, padded,
    supervised) tokens per batch, logged rows, the model)``."""
    from harness.core.store import Row
    from harness.data.stage_batches import plan_stage
    from harness.runs.execution.packing_decision import stage_batches
    from harness.runs.execution.tracking import Tracker
    from harness.runs.planning.prepare import stage_batching
    from harness.training.loop import StageLoop, train_stage
    from harness.training.special_tokens import stage_special_tokens

    overrides = dict(overrides)
    if "row_factor" in overrides:  # masked packed rows of another width instead of the runner's choice of layout
        from harness.runs.execution import packing_decision

        factor = overrides.pop("row_factor")
        packing_decision.layouts = lambda model, compiled=False: [(False, factor)]
    exp, pools = load_inputs(workdir, overrides)
    model, tokenizer = load_model(workdir, device)
    stage = exp.resolved_stages()[0]
    plan = plan_stage(stage_batching(exp), stage, 0, pools, tokenizer.pad_token_id)
    if steps:
        plan.batches, plan.examples = plan.batches[:steps], plan.examples[:steps]
    run_dir = Path(tempfile.mkdtemp(prefix="harness-bench-run-"))
    tracker = Tracker(exp.tracking.wandb, run_dir, "bench", exp.resolved_dict())
    rows: list[Row] = []

    def log(new_rows, step):
        tracker.log(new_rows, step)
        rows.extend(new_rows)

    # train.packing as the runner decides it: the exactness check on this model, then packed or padded batches
    batches = stage_batches(plan, model, list(exp.tasks), tokenizer.pad_token_id, 0, log)

    times: list[float] = []
    train_stage(
        model,
        batches,
        StageLoop(
            stage=stage.name,
            start_step=0,
            tasks=list(exp.tasks),
            log=log,
            evaluate=lambda step: None,
            train=stage.train,
            special_tokens=stage_special_tokens(tokenizer, batches),
            eval_every=exp.eval.every,
            progress=lambda n: times.append(time.perf_counter()),
            log_every=log_every or stage.train.log_every,
        ),
    )
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
        times[-1] = time.perf_counter()
    tracker.close()
    counts = [(b.n_real_tokens, b.n_padded_tokens, b.supervised.numel()) for b in batches]
    return times, counts, rows, model


# ----------------------------------------------------------------------------------------------------------------
# The TRL side
# ----------------------------------------------------------------------------------------------------------------


def trl_dataset(exp, pools, order=None):
    """The same encoded examples as TRL's pre-tokenised input: ``input_ids`` and ``completion_mask`` (1 on every
    supervised token; the harness's labels are pre-shifted, TRL's head shifts itself)."""
    from datasets import Dataset

    from harness.data.encoding import IGNORE_INDEX

    kept = [e for task in exp.tasks for e in pools[task] if e.length <= exp.train.max_length]
    examples = order if order is not None else kept
    return Dataset.from_dict(
        {
            "input_ids": [e.input_ids.tolist() for e in examples],
            "completion_mask": [[0] + (e.labels[:-1] != IGNORE_INDEX).astype(int).tolist() for e in examples],
        }
    )


def plan_examples(exp, stage, pools, pad_id):
    """The examples of :func:`harness.data.stage_batches.plan_stage`'s batches, in batch order."""
    from harness.data.stage_batches import plan_stage
    from harness.runs.planning.prepare import stage_batching

    plan = plan_stage(stage_batching(exp), stage, 0, pools, pad_id)
    by_ids = {}
    for task in exp.tasks:
        for e in pools[task]:
            by_ids.setdefault((task, e.input_ids.tobytes()), e)
    out = []
    for b in plan.batches:
        for row, task in enumerate(b.tasks):
            n = int(b.attention_mask[row].sum())
            out.append(by_ids[(task, b.input_ids[row, :n].numpy().tobytes())])
    return out


class _CountingCollator:
    """Wraps TRL's collator and records (real, padded, supervised) tokens of every batch it builds."""

    def __init__(self, inner):
        self.inner, self.counts = inner, []

    def __call__(self, examples):
        out = self.inner(examples)
        ids = out["input_ids"]
        real = int(out["attention_mask"].sum()) if "attention_mask" in out else ids.numel()
        self.counts.append(
            (real, ids.numel(), int((out["labels"] != -100).sum()))
        )  # TRL masks its own labels with -100
        return out


def trl_train(workdir: Path, device: str, settings: dict, steps: int, dataset=None, record_losses: bool = False):
    import torch
    from transformers import TrainerCallback
    from trl import SFTConfig, SFTTrainer

    exp, pools = load_inputs(workdir)
    model, tokenizer = load_model(workdir, device)
    optim = exp.train.optim
    settings = dict(settings)
    batch_size = exp.train.batch_size
    if settings.get("packing"):  # TRL packs rows of max_length tokens: one row per step, as many tokens as a
        # harness step holds on average, so a step is the same work
        kept = [e for task in exp.tasks for e in pools[task] if e.length <= exp.train.max_length]
        max_length = round(batch_size * sum(e.length for e in kept) / len(kept))
        batch_size = 1
    else:
        max_length = None
    sampling = settings.pop("sampling", None)
    if sampling is not None:  # transformers 5: train_sampling_strategy; 4.x: group_by_length (no sequential)
        fields = SFTConfig.__dataclass_fields__
        settings.update(
            {"train_sampling_strategy": sampling}
            if "train_sampling_strategy" in fields
            else {"group_by_length": sampling == "group_by_length"}
        )
    config = SFTConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-bench-"),
        per_device_train_batch_size=batch_size,
        max_steps=steps,
        learning_rate=optim.lr,
        adam_beta1=optim.betas[0],
        adam_beta2=optim.betas[1],
        adam_epsilon=optim.eps,
        weight_decay=optim.weight_decay,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=optim.grad_clip,
        bf16=device == "cuda",
        fp16=False,
        use_cpu=device == "cpu",
        completion_only_loss=True,
        max_length=max_length,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=exp.seed,
        dataloader_num_workers=0,
        **settings,
    )
    times: list[float] = []
    losses: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter())

    class Recording(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            losses.append(float(loss.detach()))
            return loss

    cls = Recording if record_losses else SFTTrainer
    trainer = cls(
        model=model,
        args=config,
        train_dataset=dataset if dataset is not None else trl_dataset(exp, pools),
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    trainer.data_collator = counter = _CountingCollator(trainer.data_collator)
    trainer.train()
    return times, counter.counts, losses, model
