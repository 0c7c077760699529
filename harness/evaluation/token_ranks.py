"""Facts about the first answer position's logits: the gold token's rank (ties and broken rows counted against it),
the top-1 and top-5 tokens, and which rows had non-finite logits.

Used by :mod:`harness.evaluation.passes`. The rank it replaced counted only strictly greater logits: all-equal or
all-NaN logits — a collapsed or diverged model — gave the gold token rank 1 (MRR 1.0). Here a rank is what the
gold token is *guaranteed*: rank = 1 + number of other tokens with a logit ≥ the gold logit, so a tie is resolved
against it, and a row with any NaN or ±inf logit gets the worst rank (the vocabulary size) and is flagged (metric
``ft_nonfinite``): its ordering means nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

TOP_K_SAMPLES = 5


def gold_ranks(logits: torch.Tensor, gold_ids: Sequence[int | None]) -> tuple[list[int | None], list[bool]]:
    """``(ranks, nonfinite)`` for float logits ``[batch, vocab]``: each gold id's rank among all tokens (None
    without gold) with ties counted against it, and whether the row had any non-finite logit (then rank = vocab)."""
    logits = logits.float()
    vocab = logits.shape[1]
    gold = torch.tensor([g if g is not None else 0 for g in gold_ids], dtype=torch.long, device=logits.device)
    gold_logit = logits.gather(1, gold[:, None])
    # (logits >= gold_logit) counts the gold token itself once, so the sum is already 1 + the others at or above it
    ranks = (logits >= gold_logit).sum(dim=1)
    nonfinite = ~torch.isfinite(logits).all(dim=1)
    ranks = torch.where(nonfinite, torch.full_like(ranks, vocab), ranks)
    return (
        [int(r) if g is not None else None for r, g in zip(ranks.tolist(), gold_ids)],
        [bool(x) for x in nonfinite.tolist()],
    )


def first_token_facts(logits: torch.Tensor, gold_ids: Sequence[int | None]) -> dict[str, list]:
    """From float logits ``[batch, vocab]`` at the first answer position: ``rank`` of each gold id (see
    :func:`gold_ranks`; None without gold), ``nonfinite`` per row, ``top1`` ids (argmax, as greedy picks) and
    ``top5`` ``(ids, probs)`` (softmax over the whole vocabulary; on a non-finite row these are whatever torch makes
    of NaN — the ``nonfinite`` flag says not to read them)."""
    logits = logits.float()
    ranks, nonfinite = gold_ranks(logits, gold_ids)
    k = min(TOP_K_SAMPLES, logits.shape[1])
    probs, top_ids = logits.softmax(dim=-1).topk(k, dim=-1)
    return {
        "rank": ranks,
        "nonfinite": nonfinite,
        "top1": logits.argmax(dim=1).tolist(),
        "top5": list(zip(top_ids.tolist(), probs.tolist())),
    }
