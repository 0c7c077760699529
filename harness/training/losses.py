"""Training losses on the supervised positions: plain cross-entropy and GEM, plus the per-token weighting
(per-task weights, first-answer-token weight).

The loop computes logits only at supervised positions (``[N, V]``), so every function here works on flat
per-token tensors:

- :func:`token_losses_from_logits` — the per-token training loss ``[N]`` for ``loss.name`` (``ce`` | ``gem``);
- :func:`token_losses_and_ce` — that, plus the plain CE ``[N]`` (detached) that is always logged, from one call;
- :func:`first_answer_tokens` — which supervised positions start an answer (a ``[B, T]`` mask from the labels);
- :func:`weighted_mean` — the scalar to back-propagate: ``Σ w_i l_i / Σ w_i`` with
  ``w_i = task_weights[task_i] · f_i``, ``f_i = first_token_weight if token i starts an answer else 1`` — under
  ``reduction: example`` ``f_i`` is divided by the sum of ``f`` over the token's example (its supervised-token count
  when the first-token weight is 1), so every example weighs its task weight.

GEM: "Entropic Distribution Matching for Supervised Fine-tuning of LLMs: Less Overfitting and Better Diversity"
(Ziniu Li et al., 2024; arXiv 2408.16673), also published as "Preserving Diversity in Supervised Fine-tuning of
Large Language Models" (ICLR 2025). No maintained package provides it (it is not in transformers, TRL, peft or
torch), so it is written here by hand, following the authors' public code: ``SFTTrainer.gem_loss`` in
``sft_trainer.py`` of github.com/liziniu/GEM (read through its fork xzy-bit/DiversityOfLLM, ``sft_trainer.py`` at
commit 33593bf; the same function appears verbatim in the other copies of that trainer). Per supervised token
with logits ``z`` and label ``y``::

    q      = softmax(z / beta)            (no gradient: the sharpened "generated" distribution)
    w_v    = 1                            h = linear
           = sigmoid(0.01 · (z_v − z_y))  h = logsigmoid   (no gradient; the authors' 0.01 temperature)
    loss   = − Σ_v q_v · w_v · (log p_y − log p_v),   p = softmax(z)

Its gradient with respect to the logits is ``c − (Σ_v c_v) · onehot(y)`` with ``c = q ⊙ w`` (the log-partition
cancels in ``log p_y − log p_v = z_y − z_v``); for ``h = linear`` that is ``softmax(z/β) − onehot(y)``, CE's
``softmax(z) − onehot(y)`` with the model distribution replaced by its sharpened copy, so ``beta = 1`` with
``h = linear`` gives exactly CE's gradient. The loss *value* is not a log-likelihood (it is ``Σ_v q_v z_v − z_y``
for ``h = linear`` and can be negative); that is why plain CE is always logged next to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from harness.data.encoding import IGNORE_INDEX

if TYPE_CHECKING:  # pragma: no cover
    from harness.config import LossSpec

GEM_LOGSIGMOID_TEMPERATURE = 0.01  # the authors' constant in ``sigmoid(0.01 * logits_diff)``


def gem_token_losses(logits: torch.Tensor, targets: torch.Tensor, beta: float = 0.7, h: str = "linear") -> torch.Tensor:
    """GEM per token ``[N]`` from logits ``[N, V]`` and targets ``[N]`` (computed in float32 or wider)."""
    if not 0 < beta <= 1:
        raise ValueError(f"GEM beta must be in (0, 1], got {beta}")
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    with torch.no_grad():
        on_label = logits.gather(-1, targets.unsqueeze(-1))
        if h == "linear":
            weights = torch.ones_like(logits)
        elif h == "logsigmoid":
            weights = torch.sigmoid(GEM_LOGSIGMOID_TEMPERATURE * (logits - on_label))
        else:
            raise ValueError(f"unknown GEM h {h!r}; use linear or logsigmoid")
        q = torch.softmax(logits / beta, dim=-1)
    log_p = F.log_softmax(logits, dim=-1)
    log_p_label = log_p.gather(-1, targets.unsqueeze(-1))
    return -(q * weights * (log_p_label - log_p)).sum(dim=-1)


def token_losses_from_logits(logits: torch.Tensor, targets: torch.Tensor, spec: LossSpec) -> torch.Tensor:
    """The per-token training loss ``[N]`` (``spec.name``: ``ce`` | ``gem``), in float32."""
    if spec.name == "ce":
        return F.cross_entropy(logits.float(), targets, reduction="none")
    if spec.name == "gem":
        return gem_token_losses(logits, targets, spec.beta, spec.h)
    raise ValueError(f"unknown loss {spec.name!r}")


def token_losses_and_ce(
    logits: torch.Tensor, targets: torch.Tensor, spec: LossSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(training loss [N], plain CE [N] detached)`` — CE is what the loop logs whatever the training loss."""
    losses = token_losses_from_logits(logits, targets, spec)
    if spec.name == "ce":
        return losses, losses.detach()
    with torch.no_grad():
        ce = F.cross_entropy(logits.detach().float(), targets, reduction="none")
    return losses, ce


def first_answer_tokens(labels: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool: supervised positions whose previous position is not supervised — the first token of every
    assistant turn (labels are already shifted: position t predicts token t+1)."""
    supervised = labels != IGNORE_INDEX
    previous = torch.zeros_like(supervised)
    previous[:, 1:] = supervised[:, :-1]
    return supervised & ~previous


def token_weights(
    task_of_token: torch.Tensor,
    is_first_token: torch.Tensor | None,
    spec: LossSpec,
    tasks: Sequence[str] | None = None,
    example_of_token: torch.Tensor | None = None,
    n_examples: int = 0,
) -> torch.Tensor | None:
    """Per-token weights ``[N]`` (float32), or ``None`` when every weight is 1.

    ``spec.task_weights`` maps a task name (resolved through ``tasks``, the task list whose indices
    ``task_of_token`` holds) or a task index (int or digit string) to its weight; unlisted tasks weigh 1.
    With ``spec.reduction == "example"`` each example (``example_of_token``: the batch row, ``< n_examples``, of each
    token) gets one unit of weight times its task's, shared among its tokens — the first-token weight moves weight
    within the example, not onto it — so the weighted mean is the mean of per-example means.
    """
    task = _task_weight_per_token(task_of_token, spec, tasks)
    first = None
    if is_first_token is not None and spec.first_token_weight != 1.0:
        first = torch.where(is_first_token.to(task_of_token.device), spec.first_token_weight, 1.0).float()
    if spec.reduction == "token":
        if task is None or first is None:
            return task if first is None else first
        return task * first
    if example_of_token is None or n_examples < 1:
        raise ValueError("loss.reduction: example needs each supervised token's example and the example count")
    share = first if first is not None else torch.ones(task_of_token.shape, device=task_of_token.device)
    # index_add_ into a fixed size, not bincount: no host sync on a GPU
    per_example = torch.zeros(n_examples, device=share.device).index_add_(0, example_of_token, share)
    share = share / per_example.clamp_min(1e-12)[example_of_token]
    return share if task is None else task * share


def _task_weight_per_token(
    task_of_token: torch.Tensor, spec: LossSpec, tasks: Sequence[str] | None
) -> torch.Tensor | None:
    """``spec.task_weights`` per token (float32), or ``None`` when none is set."""
    if not spec.task_weights:
        return None
    if tasks is not None:
        n_tasks = len(tasks)
    else:
        n_tasks = int(task_of_token.max().item()) + 1 if task_of_token.numel() else 0
    table = torch.ones(max(n_tasks, 1), dtype=torch.float32)
    for key, weight in spec.task_weights.items():
        if isinstance(key, int) or (isinstance(key, str) and key.isdigit()):
            index = int(key)
        elif tasks is not None and key in tasks:
            index = list(tasks).index(key)
        else:
            known = ", ".join(tasks) if tasks is not None else "(pass tasks= to use names)"
            raise ValueError(f"loss.task_weights: unknown task {key!r}; known: {known}")
        if index >= len(table):
            raise ValueError(f"loss.task_weights: task index {index} out of range ({len(table)} tasks)")
        table[index] = float(weight)
    return table.to(task_of_token.device)[task_of_token]


def weighted_mean(
    per_token: torch.Tensor,
    task_of_token: torch.Tensor,
    is_first_token: torch.Tensor | None,
    spec: LossSpec,
    tasks: Sequence[str] | None = None,
    example_of_token: torch.Tensor | None = None,
    n_examples: int = 0,
) -> torch.Tensor:
    """The scalar to back-propagate: ``Σ w_i l_i / Σ w_i`` (the plain mean when every weight is 1).

    A weighted *mean*, so the loss scale does not change with the weights; a task weight of 0 drops that task's
    tokens from the gradient. An empty batch (no supervised token, or every weight 0) gives 0 with a gradient path.
    """
    weights = token_weights(task_of_token, is_first_token, spec, tasks, example_of_token, n_examples)
    if weights is None:
        return per_token.mean() if per_token.numel() else per_token.sum()
    weights = weights.to(per_token.dtype)
    # No host sync: when every weight is 0 the numerator is 0 too, and the clamp keeps the result 0.
    return (per_token * weights).sum() / weights.sum().clamp_min(1e-12)
