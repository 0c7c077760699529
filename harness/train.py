"""The training loop: one stage of completion-only SFT, read top to bottom.

Per step: a length-grouped batch → forward through the model body → vocabulary projection *only at supervised
positions* (the completion-only loss never needs the others) → cross-entropy → backward → clip → AdamW step →
warmup/cosine schedule. Every ``log_every`` steps the window's training metrics go to the tracker (overall and
per-task loss, lr, grad norm, update ratio, tokens/s, pad fraction); every ``eval.every`` global steps, and at
both edges of the stage, the ``evaluate`` callback runs. Metrics are accumulated on-device and read back
(a host sync) once per window, not per step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from harness.config import OptimSpec
from harness.data import IGNORE_INDEX, Batch
from harness.store import Row

# Model types whose logits are exactly lm_head(last hidden state); for them the loss projects only supervised
# positions. Others (logit soft-capping, scaling) go through the model's own forward.
_HEAD_ONLY_TYPES = {"qwen2", "qwen3", "llama", "mistral", "gpt2", "qwen3_5", "qwen3_5_text", "olmo2", "phi3"}


def supervised_logits(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                      selected: torch.Tensor) -> torch.Tensor:
    """Logits ``[N, V]`` at the ``selected`` positions (a boolean ``[B, T]`` mask) only."""
    if getattr(model.config, "model_type", None) in _HEAD_ONLY_TYPES and model.get_output_embeddings() is not None:
        hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return model.get_output_embeddings()(hidden[selected])
    return model(input_ids=input_ids, attention_mask=attention_mask).logits[selected]


def token_losses(model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-supervised-token cross-entropy ``[N]`` and the batch row of each of those tokens ``[N]``."""
    selected = batch.labels != IGNORE_INDEX
    logits = supervised_logits(model, batch.input_ids, batch.attention_mask, selected)
    losses = F.cross_entropy(logits.float(), batch.labels[selected], reduction="none")
    rows = selected.nonzero()[:, 0]
    return losses, rows


def make_optimizer(model, spec: OptimSpec, total_steps: int):
    """AdamW (no weight decay on biases and norms) with linear warmup, then cosine / linear / constant."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=spec.lr, betas=spec.betas, eps=spec.eps, foreach=True)

    def factor(step: int) -> float:
        if step < spec.warmup:
            return (step + 1) / spec.warmup
        if spec.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - spec.warmup) / max(1, total_steps - spec.warmup))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if spec.schedule == "cosine" else 1 - progress
        return spec.min_lr_ratio + (1 - spec.min_lr_ratio) * shape

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return optimizer, scheduler


@dataclass
class Window:
    """Training metrics accumulated over one logging window (on-device sums, read once per window)."""

    tasks: list[str]
    loss_sum: torch.Tensor = None  # per task
    token_count: torch.Tensor = None  # per task
    grad_norm_sum: torch.Tensor = field(default_factory=lambda: torch.zeros(()))
    steps: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)

    def __post_init__(self):
        self.loss_sum = torch.zeros(len(self.tasks))
        self.token_count = torch.zeros(len(self.tasks))

    def add(self, losses: torch.Tensor, task_of_token: torch.Tensor, grad_norm: torch.Tensor, batch: Batch) -> None:
        self.loss_sum.index_add_(0, task_of_token, losses.detach())
        self.token_count.index_add_(0, task_of_token, torch.ones_like(losses))
        self.grad_norm_sum += grad_norm.detach()
        self.steps += 1
        self.real_tokens += batch.n_real_tokens
        self.padded_tokens += batch.n_padded_tokens

    def rows(self, stage: str, step: int, lr: float, update_ratio: Optional[float]) -> list[Row]:
        elapsed = time.perf_counter() - self.started
        counts = self.token_count.tolist()
        sums = self.loss_sum.tolist()
        out = [Row(stage, step, task, "train", "loss", s / c) for task, s, c in zip(self.tasks, sums, counts) if c]
        out += [
            Row(stage, step, None, "train", "loss", sum(sums) / max(1.0, sum(counts))),
            Row(stage, step, None, "train", "lr", lr),
            Row(stage, step, None, "train", "grad_norm", float(self.grad_norm_sum) / max(1, self.steps)),
            Row(stage, step, None, "train", "tokens_per_s", self.real_tokens / max(elapsed, 1e-9)),
            Row(stage, step, None, "train", "pad_fraction", 1 - self.real_tokens / max(1, self.padded_tokens)),
        ]
        if update_ratio is not None:
            out.append(Row(stage, step, None, "train", "update_ratio", update_ratio))
        return out


def _update_ratio(before: list[torch.Tensor], params: list[torch.Tensor]) -> float:
    """‖Δθ‖ / ‖θ‖ over all trainable parameters for the step just taken."""
    delta = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(params, before)))
    norm = torch.sqrt(sum((p.detach() ** 2).sum() for p in params))
    return float(delta / norm.clamp_min(1e-12))


def train_stage(
    model,
    batches: list[Batch],
    *,
    stage: str,
    start_step: int,
    optim: OptimSpec,
    log_every: int,
    eval_every: int,
    tasks: list[str],
    log: Callable[[list[Row], int], None],
    evaluate: Callable[[int], None],
    progress: Optional[Callable[[int], None]] = None,
) -> int:
    """Train ``model`` on ``batches`` (one optimiser step each); returns the global step at the end.

    ``evaluate(step)`` is called at the stage's last step and at every multiple of ``eval_every`` inside it (the
    caller evaluates the stage's first edge itself, since it may reuse the previous stage's end).
    """
    task_index = {t: i for i, t in enumerate(tasks)}
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler = make_optimizer(model, optim, len(batches))
    model.train()
    window = Window(tasks)
    step = start_step
    for i, batch in enumerate(batches):
        step += 1
        is_log_step = (i + 1) % log_every == 0 or i + 1 == len(batches)

        losses, rows = token_losses(model, batch)
        loss = losses.mean()
        loss.backward()
        max_norm = optim.grad_clip if optim.grad_clip is not None else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        before = [p.detach().clone() for p in params] if is_log_step else None
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        row_task = torch.tensor([task_index[t] for t in batch.tasks])
        window.add(losses, row_task[rows], grad_norm, batch)
        if is_log_step:
            log(window.rows(stage, step, lr, _update_ratio(before, params)), step)
            window = Window(tasks)
        if progress is not None:
            progress(1)
        if step % eval_every == 0 or i + 1 == len(batches):
            evaluate(step)
            model.train()
            window.started = time.perf_counter()  # evaluation time is not training throughput
    return step
