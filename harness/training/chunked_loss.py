"""The training loss at the supervised positions without the whole ``[N, V]`` logits: the hidden states ``[N, H]``
go through the model's own head module a chunk of rows at a time, and each chunk's loss *and its gradient* are
computed before the next chunk's logits exist, so the step holds one chunk's logits, their log-softmax and their
gradient instead of all N rows' (``train.loss_chunking``; docs/performance.md).

How: :class:`_ChunkedHeadLoss`, a ``torch.autograd.Function``, runs in its forward, per chunk, the same operations
as the unchunked path — ``head(hidden_chunk)`` (autocast as the caller set it; a peft LoRA / HiRA head, tied or
untied weights, all as the module computes them), then
:func:`harness.training.losses.token_losses_and_ce` — and back-propagates the chunk's share of the weighted mean
at once (``torch.autograd.grad``) into the chunk's hidden rows and the head's trainable parameters; its backward
only scales those stored gradients by the incoming one. This is the fused linear cross-entropy of Liger-Kernel
(Hsu et al. 2024, arXiv 2410.10989) done with torch ops, for any head module and any of the harness's losses: no
logits are recomputed in backward (which checkpointing each chunk would do: one more head matmul per step). The
loss is the weighted mean of :func:`harness.training.losses.weighted_mean` with the weights normalised up front
(``w_i / Σ w``), so the chunks' terms add up to it; only the summation order differs from the unchunked path.

The chunk: ``train.loss_chunk_tokens`` supervised rows, or by default the rows whose fp32 logits take
:data:`CHUNK_LOGITS_BYTES`. ``train.loss_chunking: auto`` chunks exactly when the unchunked logits would be larger
than one chunk's, i.e. when ``N · V`` exceeds ``CHUNK_LOGITS_BYTES / 4`` (2²⁶ logits): below it chunking cannot
save memory. Chunking needs the head as a module of its own (the model types whose logits are the head on the last
hidden state: :func:`harness.training.forward.supervised_hidden`) and one process (a DDP or FSDP step goes through
the wrapped module's own forward); elsewhere the unchunked path runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from harness.training.losses import token_losses_and_ce

if TYPE_CHECKING:  # pragma: no cover
    from harness.config import LossSpec, TrainSpec

# One chunk's fp32 logits. Why 256 MiB: a chunk holds about three such [rows, V] tensors (logits, log-softmax,
# gradient), so at most 768 MiB whatever N; at V = 151,936 that is 441 rows. Much smaller chunks starve the head's
# matmuls on a CPU (a few rows against all of V: docs/performance.md measured 110 rows slower per row than 512).
CHUNK_LOGITS_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Chunking:
    """``train.loss_chunking`` (``auto`` | true | false) and ``train.loss_chunk_tokens`` (None: derived)."""

    mode: bool | str = "auto"
    tokens: int | None = None

    @classmethod
    def of(cls, train: TrainSpec) -> Chunking:
        return cls(train.loss_chunking, train.loss_chunk_tokens)

    def rows(self, vocab: int) -> int:
        """Supervised rows per chunk."""
        return self.tokens or max(1, CHUNK_LOGITS_BYTES // (4 * max(vocab, 1)))

    def chunk_rows(self, n_supervised: int, vocab: int) -> int | None:
        """The rows per chunk when this step chunks; None when it runs unchunked (``false``; ``auto`` below the
        threshold; or one chunk would hold every row, where both paths are the same computation)."""
        if self.mode is False:
            return None
        rows = self.rows(vocab)
        return rows if n_supervised > rows else None


AUTO = Chunking()


def head_rows(head: torch.nn.Module) -> int:
    """The vocabulary size of an output head (a ``Linear``, or a peft layer wrapping one)."""
    rows = getattr(head, "out_features", None)
    return int(rows) if rows else int(head.weight.shape[0])


class _ChunkedHeadLoss(torch.autograd.Function):
    """``(weighted mean loss, per-token training loss, per-token CE)`` of ``head(hidden)``, chunk by chunk (module
    docstring); the last two carry no gradient."""

    @staticmethod
    def forward(ctx, hidden, scale, targets, head, spec, rows, *params):
        n = hidden.shape[0]
        wants_hidden = ctx.needs_input_grad[0]
        wanted = [p for p, needed in zip(params, ctx.needs_input_grad[6:]) if needed]
        grad_hidden = torch.zeros_like(hidden) if wants_hidden else None
        grads: list[torch.Tensor | None] = [None] * len(wanted)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        losses = torch.empty(n, dtype=torch.float32, device=hidden.device)
        ce = torch.empty(n, dtype=torch.float32, device=hidden.device)
        device_type = hidden.device.type
        # An fp32 Linear head (not a peft layer, not under autocast): its gradients accumulate in place.
        plain = type(head) is torch.nn.Linear and not torch.is_autocast_enabled(device_type)
        for start in range(0, n, rows):
            end = min(start + rows, n)
            part = hidden[start:end].detach().requires_grad_(wants_hidden)
            with torch.enable_grad():
                logits = head(part)
                # The loss outside autocast, as the unchunked path computes it from the head's output.
                with torch.autocast(device_type, enabled=False):
                    chunk_losses, chunk_ce = token_losses_and_ce(logits, targets[start:end], spec)
                    term = (chunk_losses * scale[start:end]).sum()
            losses[start:end], ce[start:end] = chunk_losses.detach(), chunk_ce
            total += term.detach()
            if not term.requires_grad:
                del logits, term
                continue
            if plain:
                _linear_gradients(term, logits, part, head, wanted, grads, grad_hidden, start)
            else:
                _module_gradients(term, part, wanted, grads, grad_hidden, start)
            del logits, term  # before the next chunk's logits exist
        ctx.mark_non_differentiable(losses, ce)
        ctx.grad_hidden, ctx.grads = grad_hidden, grads
        ctx.wanted_mask = [bool(x) for x in ctx.needs_input_grad[6:]]
        return total, losses, ce

    @staticmethod
    def backward(ctx, grad_total, _losses, _ce):
        grad_hidden, grads = ctx.grad_hidden, iter(ctx.grads)
        ctx.grad_hidden, ctx.grads = None, []

        def scaled(g):  # in place, and no host sync: the loop's backward brings 1, which leaves them exact
            return None if g is None else g.mul_(grad_total.to(g.dtype))

        out_params = [scaled(next(grads)) if wanted else None for wanted in ctx.wanted_mask]
        return (scaled(grad_hidden), None, None, None, None, None, *out_params)


def _module_gradients(term, part, wanted, grads, grad_hidden, start) -> None:
    """Back-propagate a chunk's ``term`` through the head module's own graph into the chunk's hidden rows and the
    ``wanted`` parameters, adding each parameter's into ``grads``. Outside autocast, as the unchunked path's
    ``loss.backward()`` runs."""
    inputs = ([part] if grad_hidden is not None else []) + wanted
    with torch.autocast(part.device.type, enabled=False):
        got = list(torch.autograd.grad(term, inputs, allow_unused=True))
    if grad_hidden is not None:
        grad_hidden[start : start + part.shape[0]] = got.pop(0)
    for i, g in enumerate(got):
        if g is not None:
            grads[i] = g if grads[i] is None else grads[i].add_(g)


def _linear_gradients(term, logits, part, head, wanted, grads, grad_hidden, start) -> None:
    """:func:`_module_gradients` for an fp32 ``Linear`` head, with the linear layer's backward written out (the
    matmuls autograd would run) so the weight's gradient accumulates in place: without a ``[V, H]`` temporary per
    chunk, which would add that much to the step's peak."""
    (d_logits,) = torch.autograd.grad(term, logits)
    if grad_hidden is not None:
        torch.mm(d_logits, head.weight, out=grad_hidden[start : start + part.shape[0]])
    part = part.detach()
    for i, param in enumerate(wanted):
        if param is head.weight:
            grads[i] = torch.mm(d_logits.t(), part) if grads[i] is None else grads[i].addmm_(d_logits.t(), part)
        elif param is head.bias:
            bias = d_logits.sum(0)
            grads[i] = bias if grads[i] is None else grads[i].add_(bias)


def normalised_weights(weights: torch.Tensor | None, n: int, device) -> torch.Tensor:
    """``w_i / Σ w`` (float32), the plain mean's ``1 / N`` when ``weights`` is None (every weight 1)."""
    if weights is None:
        return torch.full((n,), 1.0 / max(n, 1), dtype=torch.float32, device=device)
    weights = weights.float()
    return weights / weights.sum().clamp_min(1e-12)


def chunked_head_loss(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    targets: torch.Tensor,
    weights: torch.Tensor | None,
    spec: LossSpec,
    rows: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss to back-propagate, per-token training loss, per-token plain CE)`` of ``head`` on ``hidden`` ``[N, H]``
    against ``targets`` ``[N]``, ``rows`` supervised rows at a time; ``weights``: the per-token weights of
    :func:`harness.training.losses.token_weights` (None: all 1). The loss equals
    :func:`harness.training.losses.weighted_mean` of the unchunked path's per-token losses up to summation order."""
    scale = normalised_weights(weights, hidden.shape[0], hidden.device)
    params = [p for p in head.parameters() if p.requires_grad]
    return _ChunkedHeadLoss.apply(hidden, scale, targets, head, spec, rows, *params)
