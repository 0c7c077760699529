"""One logging window of the training loop's metrics: per-task loss sums and token counts, the grad norm, token and
pad counts, kept on the training device and read back once per window (:mod:`harness.training.loop`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from harness.core.store import Row
from harness.data.batches import Batch


@dataclass
class Window:
    """Training metrics accumulated over one logging window (on-device sums, read once per window)."""

    n_tasks: int
    loss_sum: torch.Tensor = None  # per task
    token_count: torch.Tensor = None  # per task
    grad_norm_sum: torch.Tensor = None
    steps: int = 0
    skipped: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    task_share_max_sum: float = 0.0  # per batch: the largest single task's share of its examples
    seconds: float = 0.0  # training time in the window (evaluation excluded)

    def __post_init__(self):
        self.loss_sum = torch.zeros(self.n_tasks) if self.loss_sum is None else self.loss_sum
        self.token_count = torch.zeros(self.n_tasks) if self.token_count is None else self.token_count
        self.grad_norm_sum = torch.zeros(()) if self.grad_norm_sum is None else self.grad_norm_sum

    def add(
        self,
        losses: torch.Tensor,
        task_of_token: torch.Tensor,
        grad_norm: torch.Tensor,
        batch: Batch,
        global_share: float,
    ) -> None:
        """One successful step. ``global_share``: the global batch's largest task share (:func:`task_share_max`;
        ``batch`` may be one rank's slice of it), from the stage's batch source."""
        if self.loss_sum.device != losses.device:  # sums live where the losses are: no per-step host copy
            self.loss_sum, self.token_count, self.grad_norm_sum = (
                t.to(losses.device) for t in (self.loss_sum, self.token_count, self.grad_norm_sum)
            )
        self.loss_sum.index_add_(0, task_of_token, losses.detach().float())
        self.token_count.index_add_(0, task_of_token, torch.ones_like(losses, dtype=torch.float32))
        self.grad_norm_sum += grad_norm.detach().float()
        self.steps += 1
        self.real_tokens += batch.n_real_tokens
        self.padded_tokens += batch.n_padded_tokens
        self.task_share_max_sum += global_share

    def rows(self, tasks: list[str], stage: str, step: int, lr: float) -> list[Row]:
        counts = self.token_count.tolist()
        sums = self.loss_sum.tolist()
        out = [Row(stage, step, task, "train", "loss", s / c) for task, s, c in zip(tasks, sums, counts) if c]
        if self.steps:
            out += [
                Row(stage, step, None, "train", "loss", sum(sums) / max(1.0, sum(counts))),
                Row(stage, step, None, "train", "grad_norm", float(self.grad_norm_sum) / self.steps),
                Row(stage, step, None, "train", "tokens_per_s", self.real_tokens / max(self.seconds, 1e-9)),
                Row(stage, step, None, "train", "pad_fraction", 1 - self.real_tokens / max(1, self.padded_tokens)),
                # how far batches stray from the mixture: a batcher that clusters tasks makes its own seesaw
                Row(stage, step, None, "train", "batch_task_share_max", self.task_share_max_sum / self.steps),
            ]
        out.append(Row(stage, step, None, "train", "lr", lr))
        if self.skipped:
            out.append(Row(stage, step, None, "train", "skipped_steps", self.skipped))
        return out

    def state(self) -> dict[str, Any]:
        return {
            "loss_sum": self.loss_sum.tolist(),
            "token_count": self.token_count.tolist(),
            "grad_norm_sum": float(self.grad_norm_sum),
            "steps": self.steps,
            "skipped": self.skipped,
            "real_tokens": self.real_tokens,
            "padded_tokens": self.padded_tokens,
            "task_share_max_sum": self.task_share_max_sum,
            "seconds": self.seconds,
        }

    @classmethod
    def from_state(cls, n_tasks: int, state: dict[str, Any]) -> Window:
        return cls(
            n_tasks,
            torch.tensor(state["loss_sum"]),
            torch.tensor(state["token_count"]),
            torch.tensor(state["grad_norm_sum"]),
            state["steps"],
            state["skipped"],
            state["real_tokens"],
            state["padded_tokens"],
            state.get("task_share_max_sum", 0.0),
            state["seconds"],
        )
