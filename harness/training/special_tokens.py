"""The special-token gradient check: before a stage's first update, every special token the stage's batches use
must get a gradient on its trainable embedding / output row (a row mask that misses one leaves it untrained).
"""

from __future__ import annotations

from typing import Any

import torch

from harness.data.encoding import IGNORE_INDEX
from harness.models.image_text import IMAGE_TOKEN
from harness.training.adapters import masked_rows, vocab_parameters
from harness.training.health import gathered


class SpecialTokenGradientError(RuntimeError):
    """A special token's row of a trainable embedding / output matrix got no gradient on the stage's first step."""

    def __init__(self, failures: list[tuple[str, int, str]]):
        self.failures = failures
        lines = [f"  token {tok!r} (id {tid}): zero gradient on its row of {where}" for tok, tid, where in failures]
        super().__init__(
            f"{len(failures)} special-token row{'s' if len(failures) != 1 else ''} would never train:\n"
            + "\n".join(lines)
            + "\nThe matrix is trainable, so something zeroes these rows' gradient — typically a row mask that "
            "misses them (the seed's grad[:32000] vs grad[:31999] off-by-one kept <|endoftext|> untrained for "
            "three days)."
        )

    def __reduce__(self):  # pickles with its constructor's arguments (harness repro --jobs sends it back)
        return type(self), (self.failures,)


def stage_special_tokens(tokenizer, batches) -> dict[str, int]:
    """The special tokens (``tokenizer.all_special_ids`` and added tokens flagged special) that occur in the
    stage's supervised labels or attended input ids — what :func:`check_special_token_gradients` must see move."""
    special = set(tokenizer.all_special_ids)
    special |= {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if getattr(t, "special", False)}
    found: set[int] = set()
    for b in batches:
        found |= set(b.labels[b.labels != IGNORE_INDEX].unique().tolist()) & special
        found |= set(b.input_ids[b.attention_mask.bool()].unique().tolist()) & special
    # The image placeholder's positions take image features: its embedding row never gets a gradient.
    found.discard(tokenizer.convert_tokens_to_ids(IMAGE_TOKEN) if IMAGE_TOKEN in tokenizer.get_vocab() else None)
    return {tokenizer.convert_ids_to_tokens(i): i for i in sorted(found)}


def _read_token_ids(batch) -> set[int]:
    """Ids the batch reads at attended positions at or before a supervised position of their row (those whose
    input-embedding row gets a gradient)."""
    supervised = batch.labels != IGNORE_INDEX
    # position t is read by a supervised position s >= t  ⇔  any supervised position at or after t
    later = supervised.int().flip(1).cummax(1).values.flip(1).bool()
    if getattr(batch, "layout", None) is not None:  # packed: only positions of the same example read t
        later = torch.zeros_like(later)
        for row, start, n in batch.layout.spans:
            span = supervised[row, start : start + n]
            later[row, start : start + n] = span.int().flip(0).cummax(0).values.flip(0).bool()
    read = later & batch.attention_mask.bool()
    return set(batch.input_ids[read].unique().tolist())


def check_special_token_gradients(model, token_ids: dict[str, int], batch=None) -> dict[str, Any]:
    """Call after the first ``backward()`` of a stage, before the optimiser step (``.grad`` is then post-hook, i.e.
    masked). Every listed token must have a non-zero gradient on its row of every *trainable* matrix holding
    vocabulary rows; raises :class:`SpecialTokenGradientError` naming each token and id that does not.

    The output head (or the tied matrix) is checked for every listed token: the vocabulary projection gives every
    row a gradient. An untied input embedding is checked for the tokens the batch reads before a supervised
    position (all listed tokens when ``batch`` is None). Frozen matrices are not checked (nothing trains there), nor
    the rows a row-masked matrix leaves frozen on purpose (``new_token_rows: auto`` trains only the flagged and
    added rows; the check holds the hook to the rows it was meant to keep).
    Returns ``{"checked": [(token, id, matrix), …]}``.
    """
    read = _read_token_ids(batch) if batch is not None else None
    failures: list[tuple[str, int, str]] = []
    checked: list[tuple[str, int, str]] = []
    items = sorted(token_ids.items(), key=lambda kv: kv[1])
    for where, w, is_output in vocab_parameters(model):
        if not w.requires_grad:
            continue
        # A sharded (FSDP) gradient, gathered whole before ``todo`` (this rank's slice): every rank joins.
        grad = gathered(w.grad.detach()) if w.grad is not None else None
        meant = masked_rows(w)
        todo = [(t, i) for t, i in items if (is_output or read is None or i in read) and (meant is None or i in meant)]
        if not todo:
            continue
        ids = torch.tensor([i for _, i in todo], dtype=torch.long)
        if grad is None:
            moving = [False] * len(todo)
        else:
            moving = grad[ids.to(grad.device)].ne(0).flatten(1).any(1).tolist()
        for (tok, tid), ok in zip(todo, moving):
            checked.append((tok, tid, where))
            if not ok:
                failures.append((tok, tid, where))
    if failures:
        raise SpecialTokenGradientError(failures)
    return {"checked": checked}
