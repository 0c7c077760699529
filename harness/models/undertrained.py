"""Under-trained token detection for special and chat-template tokens (after Land & Bartolo 2024, "Fishing for
Magikarp: Automatically Detecting Under-trained Tokens in Large Language Models").

A token that never occurred in pretraining keeps a row that is not like the trained ones: zeros, its random init,
the mean of the other rows (transformers' mean-resizing), or — in a tied model, where the softmax pushes every
absent token's output row the same way — a copy of one shared "unused" direction. SFT on a chat template whose
``<|im_end|>`` row is like that fails quietly (the seed's three lost days). Per row of the input embedding (and of
the output embedding when it is not tied) this module computes three indicators against the whole vocabulary:

- ``norm_z``: robust z-score of the row's L2 norm (median / MAD); far below the vocabulary (< -``norm_z``) means
  zeros, init-scale noise, or a mean row. High norms are reported, not flagged: trained attention-sink tokens
  (BOS) are legitimately large;
- ``mean_cos_z``: robust z-score of the cosine to the vocabulary's mean row; a mean-resized row points along it;
- ``unused_score``: Magikarp's indicator — the cosine of the centred row to the mean centred row of *known-unused*
  tokens (rows past the tokenizer's vocabulary, ``reserved``/``unused`` tokens, or ids the caller knows never
  occurred, e.g. absent from the builtin's pretraining corpus). A row is flagged when its score sits nearer the
  unused rows' median score than the other rows' median (a nearest-centroid rule on the score, so it works
  whatever share of the vocabulary is unused).

The statistics are hand-written on torch tensors (a median/MAD and cosines: no library computes these
indicators); the confidence interval of rates comes from :mod:`harness.core.stats`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from harness.core.stats import wilson_interval

NORM_Z = 3.0  # a robust z below -3 is far outside the trained rows (≈ 1 in 740 one-sided for a normal distribution)
MEAN_COS_Z = 3.5
_RESERVED = re.compile(r"reserved|unused", re.IGNORECASE)


@dataclass(frozen=True)
class RowIndicators:
    """The indicators of one row of one embedding matrix."""

    norm: float
    norm_z: float
    mean_cos: float
    mean_cos_z: float
    unused_score: float | None  # None without known-unused reference rows
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class TokenReport:
    """One special / chat-template token: its rows' indicators, and whether (and why) it looks under-trained."""

    token: str
    id: int
    input: RowIndicators
    output: RowIndicators | None  # None when the output embedding is tied to the input embedding
    flagged: bool
    why: str

    def as_dict(self) -> dict:
        return asdict(self)


def candidate_token_ids(tokenizer) -> list[int]:
    """The tokens whose rows matter for chat SFT: the special tokens and every added token. Chat-template markers
    (ChatML's ``<|im_start|>``/``<|im_end|>``, Llama-3's ``<|start_header_id|>``, Gemma's ``<start_of_turn>``) are
    added tokens in every common template, so this covers them. Tokens named ``reserved`` / ``unused`` (Llama-3's
    250 ``<|reserved_special_token_N|>``) are left out: no template uses them, and they are the known-unused
    reference rows instead (:func:`reference_unused_ids`)."""
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    ids = set(getattr(tokenizer, "all_special_ids", []) or []) | set(decoder)
    reserved = {i for i, t in decoder.items() if _RESERVED.search(getattr(t, "content", str(t)))}
    return sorted(i for i in ids if i is not None and i >= 0 and i not in reserved)


def reference_unused_ids(tokenizer, n_rows: int, extra: Iterable[int] = ()) -> list[int]:
    """Rows known never to have trained: rows past the tokenizer's vocabulary (embedding matrices padded to a
    multiple, e.g. Qwen2's 151,936 rows for 151,665 tokens), added tokens named ``reserved`` / ``unused``, and
    ``extra`` (ids the caller knows never occurred in pretraining)."""
    ids = set(range(len(tokenizer), n_rows)) | {int(i) for i in extra if 0 <= int(i) < n_rows}
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).items():
        if _RESERVED.search(getattr(added, "content", str(added))) and token_id < n_rows:
            ids.add(token_id)
    return sorted(ids)


def _robust_z(values, reference):
    import torch

    median = reference.median()
    mad = (reference - median).abs().median().clamp_min(torch.finfo(reference.dtype).eps)
    return (values - median) / (1.4826 * mad)  # 1.4826 · MAD estimates the standard deviation of a normal sample


def row_indicators(
    weight, ids: Sequence[int], unused_ids: Sequence[int] = (), norm_z: float = NORM_Z, mean_cos_z: float = MEAN_COS_Z
) -> list[RowIndicators]:
    """The indicators of rows ``ids`` of ``weight`` [V, d] against all its rows (see the module docstring)."""
    import torch
    import torch.nn.functional as F

    rows = weight.detach().float().cpu()
    index = torch.as_tensor(list(ids), dtype=torch.long)
    # The reference is the presumed-trained rows: neither candidates (so a few bad rows cannot hide each other)
    # nor known-unused rows (in a small vocabulary they can be a large share and would shift every statistic).
    reference = torch.ones(len(rows), dtype=torch.bool)
    reference[index] = False
    unused = torch.as_tensor([i for i in unused_ids if i < len(rows)], dtype=torch.long)
    reference[unused] = False
    norms = rows.norm(dim=1)
    mean_row = rows[reference].mean(dim=0)
    mean_cos = F.cosine_similarity(rows, mean_row[None], dim=1)
    z_norm = _robust_z(norms[index], norms[reference])
    z_cos = _robust_z(mean_cos[index], mean_cos[reference])
    unused_score, unused_cut = _unused_scores(rows, mean_row, index, unused, reference)
    out = []
    for k in range(len(index)):
        reasons = []
        if z_norm[k] < -norm_z:
            reasons.append(f"norm {norms[index[k]]:.3g} far below the vocabulary's (robust z {z_norm[k]:.1f})")
        if z_cos[k] > mean_cos_z:
            reasons.append(f"points along the mean row (cos {mean_cos[index[k]]:.2f}, robust z {z_cos[k]:.1f})")
        score = None if unused_score is None else float(unused_score[k])
        if score is not None and score > unused_cut:
            reasons.append(f"looks like the never-trained rows (score {score:.2f} > cut {unused_cut:.2f})")
        out.append(
            RowIndicators(
                float(norms[index[k]]),
                float(z_norm[k]),
                float(mean_cos[index[k]]),
                float(z_cos[k]),
                score,
                tuple(reasons),
            )
        )
    return out


def _unused_scores(rows, mean_row, index, unused, reference):
    """(scores of the candidate rows, cut) for Magikarp's unused-direction indicator, or (None, inf) without at
    least two reference rows. Rows are centred on the trained rows' mean; the score is the cosine to the mean
    centred unused row, and the cut is the midpoint between the unused rows' median score and the trained rows'."""
    import torch.nn.functional as F

    if len(unused) < 2 or not reference.any():
        return None, float("inf")
    centred = rows - mean_row
    direction = centred[unused].mean(dim=0)
    scores = F.cosine_similarity(centred, direction[None], dim=1)
    cut = float((scores[unused].median() + scores[reference].median()) / 2)
    return scores[index], cut


def detect_undertrained(
    model,
    tokenizer,
    token_ids: Sequence[int] | None = None,
    unused_ids: Sequence[int] | None = None,
    norm_z: float = NORM_Z,
    mean_cos_z: float = MEAN_COS_Z,
) -> list[TokenReport]:
    """A report per candidate token (default :func:`candidate_token_ids`) of ``model``'s input and, when untied,
    output embedding rows. ``unused_ids`` defaults to :func:`reference_unused_ids` (rows past the vocabulary and
    reserved tokens); pass more known-unused ids when you have them."""
    inputs = model.get_input_embeddings().weight
    output_layer = model.get_output_embeddings()
    outputs = None if output_layer is None or output_layer.weight is inputs else output_layer.weight
    ids = candidate_token_ids(tokenizer) if token_ids is None else list(token_ids)
    ids = [i for i in ids if i < inputs.shape[0]]
    if unused_ids is None:
        unused_ids = reference_unused_ids(tokenizer, inputs.shape[0])
    unused = [i for i in unused_ids if i not in set(ids)]
    in_rows = row_indicators(inputs, ids, unused, norm_z, mean_cos_z)
    out_rows = row_indicators(outputs, ids, unused, norm_z, mean_cos_z) if outputs is not None else [None] * len(ids)
    reports = []
    for token_id, row_in, row_out in zip(ids, in_rows, out_rows):
        why = [f"input: {r}" for r in row_in.reasons] + [f"output: {r}" for r in (row_out.reasons if row_out else ())]
        token = tokenizer.convert_ids_to_tokens(token_id) if token_id < len(tokenizer) else f"<row {token_id}>"
        reports.append(TokenReport(str(token), int(token_id), row_in, row_out, bool(why), "; ".join(why)))
    return reports


def rate_with_interval(flags: Sequence[bool]) -> tuple[float, int, tuple[float, float]]:
    """(rate, n, Wilson 95 % interval) of a list of yes/no outcomes (:func:`harness.core.stats.wilson_interval`)."""
    ci = wilson_interval(int(sum(bool(f) for f in flags)), len(flags))
    return ci.estimate, ci.n, (ci.low, ci.high)


def flagged_summary(reports: Sequence[TokenReport]) -> list[dict]:
    """The flagged tokens as ``summary.json`` records them: token, id, row norms (output ``None`` when tied), why."""
    return [
        {
            "token": r.token,
            "id": r.id,
            "input_norm": r.input.norm,
            "output_norm": r.output.norm if r.output is not None else None,
            "why": r.why,
        }
        for r in reports
        if r.flagged
    ]


def warning_line(reports: Sequence[TokenReport], added: Iterable[int], fate: str) -> str | None:
    """One console line naming the flagged tokens (``None`` when none is), and ``fate``: what this run does with
    their rows (:func:`row_fate`). A ``warning`` when a flagged token is the base model's own (a chat template whose
    ``<|im_end|>`` never trained); a ``note`` when every flagged token is one the harness added (new rows: untrained
    by construction)."""
    flagged = [r for r in reports if r.flagged]
    if not flagged:
        return None
    own = [r for r in flagged if r.id not in set(added)]
    names = ", ".join(f"{r.token} (id {r.id})" for r in flagged[:12])
    more = f" and {len(flagged) - 12} more" if len(flagged) > 12 else ""
    return (
        f"{'warning' if own else 'note'}: {len(flagged)} special token(s) with under-trained embedding rows: "
        f"{names}{more} — {fate}; harness inspect --tokens says why"
    )


_VOCAB_MATRICES = ("model.embed_tokens.weight", "lm_head.weight")  # what an unfreeze regex must hit to train rows


def row_fate(stages: Sequence[tuple[str, Any]], flagged_ids: Iterable[int], added: Iterable[int]) -> str:
    """What a run does with the flagged rows, from its stages' ``(name, trainable spec)``: a stage trains them
    when its mode is ``full``, an ``unfreeze`` regex hits the embedding or head, ``new_token_rows`` is ``auto``, or
    it is ``true`` and every flagged token is one the harness added (``true`` trains added rows only)."""
    own = set(flagged_ids) - set(added)
    frozen = []
    for name, trainable in stages:
        rows = trainable.new_token_rows
        unfrozen = any(re.search(p, m) for p in trainable.unfreeze for m in _VOCAB_MATRICES)
        if trainable.mode == "full" or unfrozen or rows == "auto" or (rows is True and not own):
            continue
        frozen.append(f"{name} (new_token_rows: {str(rows).lower()})")
    if frozen:
        return f"their rows stay frozen in stage(s) {', '.join(frozen)}; new_token_rows: auto would train them"
    if all(trainable.mode == "full" for _, trainable in stages):
        return "every stage trains the whole model, their rows included"
    return "every stage trains their rows (full mode, unfreeze or trainable.new_token_rows)"


def undertrained_tokens(spec, corpus: Sequence[str], model, tokenizer) -> list[TokenReport] | None:
    """The under-trained check of a base model's special-token rows (:func:`detect_undertrained`), one report per
    special / chat-template token; ``None`` for a builtin without ``pretrain`` (every row is at its initialisation:
    nothing to tell apart). ``spec``: the run's :class:`~harness.config.ModelSpec`; ``corpus``: the builtin's
    pretraining corpus, whose absent ids are its known-unused reference rows (a hub / local model's are the rows
    past its vocabulary and its reserved tokens)."""
    from harness.models.builtin import builtin_unused_token_ids

    if not spec.hf and spec.pretrain is None:
        return None
    unused = None
    if not spec.hf:
        rows = model.get_input_embeddings().weight.shape[0]
        unused = reference_unused_ids(tokenizer, rows, builtin_unused_token_ids(tokenizer, corpus))
    return detect_undertrained(model, tokenizer, unused_ids=unused)


def special_token_note(
    reports: Sequence[TokenReport] | None, stages: Sequence[tuple[str, Any]], added: Iterable[int]
) -> tuple[str | None, list[dict] | None]:
    """``(console line or None, summary.json's flagged tokens)`` of :func:`undertrained_tokens`' reports, the line
    saying what the run's ``stages`` (``(name, trainable spec)``) do with their rows; ``(None, None)`` unchecked."""
    if reports is None:
        return None, None
    fate = row_fate(stages, [r.id for r in reports if r.flagged], added)
    return warning_line(reports, added, fate), flagged_summary(reports)
