"""The proof, on the model about to be trained, that packed batches (:mod:`harness.data.packed_batches`) train it as the
padded batches would: before a stage trains packed, a handful of its batches go through the model both ways and
the per-example losses and the gradients of a few parameters are compared.

Why a check and not trust: a packed row is only exact when the model restarts positions at every example and
confines attention (and any recurrent state) to it. Transformers' padding-free path derives both from the
restarting ``position_ids``; models that do not honour them train silently on something else — hybrid linear
attention (Gated DeltaNet, short convolutions: Qwen3.5, Qwen3-Next) carries its state across examples, learned
absolute positions fed the row's positions read the wrong embedding, and a forward that passes a cache or a 2-D
mask turns the detection off.

The tolerance is derived, not tuned. The same check measures the *layout noise*: the per-example losses and
gradients of the padded batch computed two more ways that cannot leak — its rows in reverse order with wider
padding (the reordering across rows), and one example per row through the packed batch's own forward path
(restarting positions, no mask, example-by-example attention or transformers' block-diagonal mask: the packed
kernels on rows where every example starts its row, so nothing precedes it to leak from). A correct packed forward
differs from the padded one by the same kind of float reordering, and nothing else. The second reference runs the
path under test, so it counts as noise only up to one kernel's rounding (the floor or ``u`` below), and its own
difference is held to the tolerance too: a defect of the packed path that does not depend on an example's place in
its row would otherwise set its own tolerance. Where the kernels give
bit-identical results for all three layouts (the noise is 0) two bounds stand in. The floor: the probabilistic
rounding-error bound of ``n_layers`` chained dot products of length ``hidden_size`` accumulated in fp32 (bf16
autocast accumulates in fp32 too), ``√hidden_size · n_layers · 2⁻²⁴`` (N. J. Higham and T. Mary, "A new approach
to probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019: relative error ∝ √n·u, not n·u).
The tolerance is ``SAFETY × max(noise, floor)``: ``SAFETY`` = 4 is the λ of that bound at which it holds with
probability 1 − 2·exp(−λ²/2)·… ≈ 0.9993 per quantity. And never less than one rounding of a stored result, the
unit roundoff ``u`` of the compute precision (2⁻²⁴ fp32, below the floor; 2⁻⁸ bf16): under autocast every
matmul's output is rounded to bf16, and a kernel that treats a packed row otherwise (an example's offset in its
row, which no layout free of leaks reproduces) can round it the other way; one rounding is bounded by ``u``
itself, so it takes no λ. (The bound with bf16's u in place of the fp32 accumulation's grows with the model's
size to far above any leak, and passed them all: docs/packing.md.)

When the difference is above tolerance the check says what leaked: it packs the same examples again with the first
example of every row replaced (its tokens rotated by one); if the *other* examples' losses move, they see their
row neighbours — ``attention`` leaked; if they do not, the examples see only themselves but at the wrong
positions — ``positions``. Those losses are held to their own measured noise and the floor, not to ``u``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from harness.config import LossSpec
from harness.data.batches import Batch, Layout, collate
from harness.data.encoding import IGNORE_INDEX, Encoded
from harness.data.packed_batches import examples_of, pack_like
from harness.data.segments import segment_plan
from harness.training.chunked_loss import AUTO, Chunking
from harness.training.loop import batch_loss

SAFETY = 4.0
CHECK_BATCHES = 3  # the first batches of the stage: "a handful"
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "bf16-autocast": 2.0**-8}  # of a stored result in the compute precision
ACCUMULATION_ROUNDOFF = 2.0**-24  # matmuls accumulate in fp32 under either precision

LossComparison = Callable[[torch.Tensor, torch.Tensor], float]  # (losses, reference losses) -> largest difference


class PackingError(ValueError):
    """``train.packing: true`` on a model that packed batches would train on something else (exit 2)."""


@dataclass
class PackingCheck:
    """The outcome: the largest relative difference packed vs padded, the layout noise, the tolerance derived
    from them, and (above tolerance) what leaked."""

    model_type: str
    max_rel_diff: float
    noise: float
    floor: float
    leaked: str | None = None  # "attention" | "positions" (None while exact)
    loss_noise: float = 0.0  # the part of ``noise`` measured on per-example losses (gradients left out)
    roundoff: float = 0.0  # one rounding of a stored result in the compute precision: the least tolerance

    @property
    def tolerance(self) -> float:
        return max(SAFETY * max(self.noise, self.floor), self.roundoff)

    @property
    def exact(self) -> bool:
        return self.max_rel_diff <= self.tolerance

    def why(self) -> str:
        """One line for the console or the error."""
        what = {
            "attention": "attention (or a recurrent state) crosses example boundaries",
            "positions": "positions do not restart at each example",
        }.get(self.leaked or "", "losses differ")
        return (
            f"packed batches are not exact on model type {self.model_type!r}: {what} (largest relative "
            f"difference {self.max_rel_diff:.2e} > tolerance {self.tolerance:.2e})"
        )


def _model_type(model) -> str:
    return str(getattr(getattr(model, "config", None), "model_type", type(model).__name__))


def rounding_floor(model, precision: str = "fp32") -> float:
    """``√hidden_size · n_layers · 2⁻²⁴``: the floor of the tolerance (module docstring), the fp32 accumulation's
    rounding bound in either precision (``precision`` is kept for callers; autocast accumulates in fp32)."""
    config = model.config
    config = getattr(config, "text_config", None) or config
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", 1)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", 1)
    return float(np.sqrt(hidden) * layers * ACCUMULATION_ROUNDOFF)


def relative_loss_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest relative difference of per-example losses, each against ``max(|its loss|, mean |loss| of the
    batch)``. Why not its own loss alone: an example the model already fits (loss near 0) carries the absolute
    rounding error of the logits its loss is computed from, not an error proportional to its tiny loss; dividing by
    it alone used several times more of the tolerance on fitted models than this does (measured with
    ``bench/packing_check_null.py``: docs/packing.md, "Proven exact on the model being trained")."""
    if not a.numel():
        return 0.0
    scale = torch.maximum(b.abs(), b.abs().mean()).clamp_min(1e-30)
    return float(((a - b).abs() / scale).max())


#: Elements per float64 piece of a gradient comparison (8 MB): a vocabulary-sized gradient is compared in pieces,
#: never converted whole (at a 151,936 x 896 embedding a float64 copy is 1.1 GiB).
GRAD_CHUNK = 1 << 20


def _grads(watched: list[tuple[str, torch.nn.Parameter]]) -> dict[str, torch.Tensor]:
    """Copies of the ``watched`` parameters' gradients in their own dtype (compared in float64 by :func:`_grad_rel`,
    which converts exactly: one copy per parameter is kept, not a float64 one per layout)."""
    return {name: p.grad.detach().clone() for name, p in watched if p.grad is not None}


def _grad_rel(watched: list[tuple[str, torch.nn.Parameter]], base: dict[str, torch.Tensor]) -> float:
    """Largest norm-wise relative difference (element-wise would divide by gradients that are ~0) of the
    ``watched`` parameters' gradients now in ``.grad`` from ``base``'s, in float64, :data:`GRAD_CHUNK` elements at a
    time. A gradient missing now counts as zero."""
    grads = dict(watched)
    worst = 0.0
    for name, reference in base.items():
        now = grads[name].grad
        diff_sq = ref_sq = 0.0
        pieces = reference.detach().reshape(-1).split(GRAD_CHUNK)
        live = now.detach().reshape(-1).split(GRAD_CHUNK) if now is not None else [None] * len(pieces)
        for ref_piece, now_piece in zip(pieces, live):
            ref64 = ref_piece.double()
            delta = ref64 if now_piece is None else now_piece.double() - ref64
            diff_sq += float(delta.square().sum())
            ref_sq += float(ref64.square().sum())
        worst = max(worst, diff_sq**0.5 / max(ref_sq**0.5, 1e-30))
    return worst


def _relaid(batch: Batch) -> tuple[Batch, list[int]]:
    """The padded batch with its rows in reverse order and 8 more columns of padding, and the example order."""
    examples = examples_of(batch)
    order = list(reversed(range(len(examples))))
    # the pad id is never attended in a padded batch: any id will do
    wide = collate([Encoded(batch.tasks[i], examples[i][0], examples[i][1]) for i in order], pad_id=0)
    pad = torch.zeros(wide.input_ids.shape[0], 8, dtype=wide.input_ids.dtype)
    relaid = Batch(
        torch.cat([wide.input_ids, pad], 1),
        torch.cat([wide.attention_mask, pad], 1),
        torch.cat([wide.labels, torch.full_like(pad, IGNORE_INDEX)], 1),
        wide.tasks,
        wide.n_real_tokens,
        wide.n_padded_tokens + pad.numel(),
    )
    return relaid, order


def _one_per_row(batch: Batch, like: Batch) -> Batch:
    """Padded ``batch`` through the forward of packed batch ``like``: restarting positions, no mask, ``like``'s
    attention (example by example or the block-diagonal mask), one example per row at the row's start, its padding
    a segment of its own after it. Exact on any model the padded batch is: nothing precedes an example in its row,
    so neither a state nor attention nor a row position can carry anything into it."""
    lengths = batch.attention_mask.sum(dim=1).tolist()
    width = batch.input_ids.shape[1]
    device = batch.input_ids.device
    positions = torch.stack(
        [torch.cat([torch.arange(n, device=device), torch.arange(width - n, device=device)]) for n in lengths]
    )
    spans = tuple((row, 0, n) for row, n in enumerate(lengths))
    layout = Layout(spans, like.layout.pad_id, like.layout.factor, like.layout.varlen)
    return replace(
        batch, position_ids=positions, layout=layout, segments=segment_plan(positions) if layout.varlen else None
    )


def _rotated_first(batch: Batch) -> tuple[Batch, list[int]]:
    """The packed batch with the first example of every row rotated by one token (same layout), and the examples
    that share a row with such a first example (whose losses must not move)."""
    examples = examples_of(batch)
    firsts = {i for i, (_, start, _) in enumerate(batch.layout.spans) if start == 0}
    rows_with_more = {batch.layout.spans[i][0] for i, (_, start, _) in enumerate(batch.layout.spans) if start > 0}
    changed = [
        (np.roll(ids, 1), labels) if i in firsts and batch.layout.spans[i][0] in rows_with_more else (ids, labels)
        for i, (ids, labels) in enumerate(examples)
    ]
    others = [i for i, (_, start, _) in enumerate(batch.layout.spans) if start > 0]
    return pack_like(batch, changed, batch.tasks), others


def _outcome(
    model, batch: Batch, spec: LossSpec, tasks: list[str], precision: str, chunking: Chunking = AUTO
) -> torch.Tensor:
    """Per-example mean CE (float64, sampler order) of a forward and backward pass of ``batch`` through the loss
    path the stage trains with (``chunking``: ``train.loss_chunking``), from cleared gradients; the gradients stay
    in ``.grad`` for the caller (:func:`_grads`, :func:`_grad_rel`)."""
    device = next(model.parameters()).device
    batch = batch.to(device)
    index = {t: i for i, t in enumerate(tasks)}
    task_ids = torch.tensor([index[t] for t in batch.tasks], device=device)
    model.zero_grad(set_to_none=True)
    loss, ce, _ = batch_loss(model, batch, spec, task_ids, tasks, precision, chunking=chunking)
    loss.backward()
    n = len(batch.tasks)
    sums = torch.zeros(n, dtype=torch.float64, device=device).index_add_(0, batch.example_of_token, ce.double())
    counts = torch.zeros(n, dtype=torch.float64, device=device).index_add_(
        0, batch.example_of_token, torch.ones_like(ce, dtype=torch.float64)
    )
    return (sums / counts.clamp_min(1)).cpu()


def _watched(model) -> list[tuple[str, torch.nn.Parameter]]:
    """A few trainable parameters: the first, one in the middle and the last."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not trainable:
        return []
    picks = sorted({0, len(trainable) // 2, len(trainable) - 1})
    return [trainable[i] for i in picks]


def check_packing(
    model,
    padded: Sequence[Batch],
    packed: Sequence[Batch],
    spec: LossSpec,
    tasks: list[str],
    precision: str = "fp32",
    compare: LossComparison = relative_loss_diff,
    chunking: Chunking = AUTO,
) -> PackingCheck:
    """Compare the first :data:`CHECK_BATCHES` batches packed and padded on ``model`` (left as it was: eval mode
    for the check, gradients cleared, no RNG drawn), against the layout noise measured on the same batches (the
    padded rows reversed and wider, and one example per row through the packed forward: module docstring).
    ``compare`` measures per-example losses against the padded batch's (default :func:`relative_loss_diff`;
    ``bench/packing_check_null.py`` passes the comparison it replaced). ``chunking``: the stage's
    ``train.loss_chunking``, so the check sees the losses and gradients of the path that trains."""
    was_training = model.training
    model.eval()  # no dropout: the two layouts must see the same function
    watched = _watched(model)
    diff = noise = loss_noise = 0.0
    roundoff = UNIT_ROUNDOFF.get(precision, UNIT_ROUNDOFF["fp32"])
    cap = max(rounding_floor(model), roundoff)  # the most a correct kernel's rounding may differ by
    try:
        for pad_batch, pack_batch in list(zip(padded, packed))[:CHECK_BATCHES]:
            base_losses = _outcome(model, pad_batch, spec, tasks, precision, chunking)
            base_grads = _grads(watched)
            relaid, order = _relaid(pad_batch)
            losses = _outcome(model, relaid, spec, tasks, precision, chunking)
            relaid_grads = _grad_rel(watched, base_grads)
            restored = torch.empty_like(losses)
            restored[torch.tensor(order)] = losses
            alone = _outcome(model, _one_per_row(pad_batch, pack_batch), spec, tasks, precision, chunking)
            alone_all = _grad_rel(watched, base_grads)
            # The packed path on rows that cannot leak is noise only up to what a kernel's own rounding can be
            # (``cap``): beyond it, a defect of the packed path that does not depend on an example's place in its
            # row (a kernel that is not causal, a wrong scale) would raise the tolerance to its own size. So the
            # reference adds at most ``cap`` to the noise, and its own difference is held to the tolerance as the
            # packed rows' is.
            alone_losses = compare(alone, base_losses)
            loss_noise = max(loss_noise, compare(restored, base_losses), min(alone_losses, cap))
            noise = max(noise, loss_noise, relaid_grads, min(alone_all, cap))
            losses = _outcome(model, pack_batch, spec, tasks, precision, chunking)
            diff = max(diff, compare(losses, base_losses), _grad_rel(watched, base_grads), alone_losses, alone_all)
            del base_grads
        result = PackingCheck(_model_type(model), diff, noise, rounding_floor(model), None, loss_noise, roundoff)
        if not result.exact:
            # Only the other examples' losses are compared there, which a layout free of leaks leaves as they were
            # up to the losses' own noise: the stored-result roundoff (which the gradients need) does not apply.
            losses_tolerance = SAFETY * max(loss_noise, result.floor)
            result.leaked = _what_leaked(
                model, packed[:CHECK_BATCHES], spec, tasks, precision, losses_tolerance, compare, chunking
            )
        return result
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)


def _what_leaked(
    model,
    packed: Sequence[Batch],
    spec: LossSpec,
    tasks: list[str],
    precision: str,
    tolerance: float,
    compare: LossComparison = relative_loss_diff,
    chunking: Chunking = AUTO,
) -> str:
    """``attention`` when an example's loss depends on the content of another example in its row, else
    ``positions``."""
    for batch in packed:
        rotated, others = _rotated_first(batch)
        if not others:
            continue
        before = _outcome(model, batch, spec, tasks, precision, chunking)
        after = _outcome(model, rotated, spec, tasks, precision, chunking)
        if compare(after[others], before[others]) > tolerance:
            return "attention"
    return "positions"
