"""The chunked loss (``train.loss_chunking``, harness/training/chunked_loss.py) against today's unchunked path: the
same loss, per-token CE and gradients — CE and GEM, per-task / first-token / per-example weights, tied and untied
heads, a LoRA adapter on the head, fp32 and bf16 autocast, at 1 and 2 threads — and the same training run.

The tolerance is derived, not tuned: the unchunked path is computed a second time with its supervised positions in
two pieces (the body and head run per piece, so every sum over tokens — the loss mean, the head's and the body's
weight gradients — is taken in another order and, under bf16, rounded per piece), and the chunked result must lie
within ``SAFETY`` (4, harness/training/packing_check.py's λ of the probabilistic rounding bound) times that reordering's
difference, and never less than one rounding of a stored result in the compute precision (``UNIT_ROUNDOFF``):
the chunked path differs from the unchunked one by summation order and rounding, nothing else.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from harness.config import LossSpec, OptimSpec, TrainableSpec, TrainSpec
from harness.data.batches import collate
from harness.data.encoding import IGNORE_INDEX, Encoded
from harness.training.adapters import prepare_stage_model, unwrap
from harness.training.chunked_loss import CHUNK_LOGITS_BYTES, Chunking
from harness.training.forward import supervised_logits
from harness.training.loop import StageLoop, batch_loss, train_stage
from harness.training.losses import first_answer_tokens, token_losses_and_ce, weighted_mean
from harness.training.packing_check import SAFETY, UNIT_ROUNDOFF

TASKS = ["a", "b"]
LOSSES = {
    "ce": LossSpec(),
    "ce-weighted": LossSpec(task_weights={"a": 3.0}, first_token_weight=2.0),
    "gem-weighted-example": LossSpec(name="gem", h="logsigmoid", task_weights={"b": 0.5}, reduction="example"),
}


def _model(tied: bool, vocab: int = 257):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tied,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def _examples(n: int = 6, seed: int = 0, vocab: int = 257) -> list[Encoded]:
    """Examples of 8-20 tokens whose second half or so is supervised (a few answers of one token)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(8, 21))
        ids = rng.integers(1, vocab, size=length).astype(np.int64)
        labels = np.full(length, IGNORE_INDEX, dtype=np.int64)
        answer = 1 if i % 3 == 0 else int(rng.integers(2, length // 2 + 2))
        labels[length - answer - 1 : length - 1] = ids[length - answer :]
        out.append(Encoded(TASKS[i % 2], ids, labels))
    return out


def _task_ids(batch) -> torch.Tensor:
    return torch.tensor([TASKS.index(t) for t in batch.tasks])


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _chunked(model, batch, spec, precision, rows):
    model.zero_grad(set_to_none=True)
    loss, ce, _ = batch_loss(model, batch, spec, _task_ids(batch), TASKS, precision, chunking=Chunking(True, rows))
    loss.backward()
    return loss.detach(), ce, _grads(model)


def _unchunked_in_pieces(model, batch, spec, precision, pieces: int):
    """Today's path (head on the selected positions, then :func:`token_losses_and_ce` and :func:`weighted_mean`),
    the supervised positions in ``pieces`` parts, each through its own forward; ``pieces=1`` is the loop's call."""
    model.zero_grad(set_to_none=True)
    selected = batch.supervised
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-autocast")
    with autocast:
        parts = [
            supervised_logits(unwrap(model), batch.input_ids, batch.attention_mask, part)
            for part in torch.tensor_split(selected, pieces)
        ]
    logits = torch.cat(parts)
    losses, ce = token_losses_and_ce(logits, batch.labels.flatten()[selected], spec)
    task_of_token = _task_ids(batch)[batch.example_of_token]
    first = first_answer_tokens(batch.labels).flatten()[selected]
    by_example = batch.example_of_token if spec.reduction == "example" else None
    loss = weighted_mean(losses, task_of_token, first, spec, TASKS, by_example, len(batch.tasks))
    loss.backward()
    return loss.detach(), ce, _grads(model)


def _difference(a, b) -> float:
    """Largest relative difference of the loss, the per-token CE and every gradient (each against its largest
    magnitude in ``b``)."""
    (loss_a, ce_a, grads_a), (loss_b, ce_b, grads_b) = a, b
    assert grads_a.keys() == grads_b.keys()
    diffs = [float((loss_a - loss_b).abs() / loss_b.abs().clamp_min(1e-30))]
    diffs.append(float((ce_a - ce_b).abs().max() / ce_b.abs().max()))
    for name, grad in grads_b.items():
        diffs.append(float((grads_a[name] - grad).abs().max() / grad.abs().max().clamp_min(1e-30)))
    return max(diffs)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _assert_exact(model, spec, precision, rows=5):
    batch = collate(_examples(), pad_id=0)
    assert batch.supervised.numel() > 3 * rows, "the batch must make several chunks"
    reference = _unchunked_in_pieces(model, batch, spec, precision, 1)
    reordered = _unchunked_in_pieces(model, batch, spec, precision, 2)
    chunked = _chunked(model, batch, spec, precision, rows)
    tolerance = max(SAFETY * _difference(reordered, reference), UNIT_ROUNDOFF[precision])
    assert _difference(chunked, reference) <= tolerance, (_difference(chunked, reference), tolerance)


@pytest.mark.parametrize("precision", ["fp32", "bf16-autocast"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("loss", list(LOSSES))
def test_chunked_loss_and_gradients_match_the_unchunked_path(loss, tied, precision):
    _assert_exact(_model(tied), LOSSES[loss], precision)


@pytest.mark.parametrize("precision", ["fp32", "bf16-autocast"])
def test_chunked_loss_matches_at_two_threads(precision, two_threads):
    """At the suite's thread count (``OMP_NUM_THREADS=1`` or 2 runs the whole matrix above at either) and here at
    2 whatever it is: another thread count splits the matmuls' sums otherwise."""
    _assert_exact(_model(tied=True), LOSSES["gem-weighted-example"], precision)


@pytest.mark.parametrize("precision", ["fp32", "bf16-autocast"])
@pytest.mark.parametrize("mode", ["lora", "hira"])
def test_chunked_loss_with_an_adapter_on_the_head(mode, precision):
    """peft wraps ``lm_head``: the chunked path calls that wrapped module per chunk, so the adapter's own
    parameters get the unchunked path's gradients."""
    spec = TrainableSpec(mode=mode, r=4, target_modules=["lm_head", "q_proj"])
    model = prepare_stage_model(_model(tied=False), spec, [])
    with torch.no_grad():  # peft starts B at 0 (LoRA): move it, so the adapter changes the logits
        for name, param in model.named_parameters():
            if "lora_B" in name or "hira_B" in name:
                param.normal_(0, 0.1)
    assert any("lm_head" in n and p.requires_grad for n, p in model.named_parameters())
    _assert_exact(model, LOSSES["ce-weighted"], precision)


def test_chunked_loss_sees_a_planted_difference():
    """The comparison is not vacuous: a head whose weights moved by one bf16 rounding's worth fails it."""
    model = _model(tied=False)
    batch = collate(_examples(), pad_id=0)
    reference = _unchunked_in_pieces(model, batch, LossSpec(), "fp32", 1)
    reordered = _unchunked_in_pieces(model, batch, LossSpec(), "fp32", 2)
    with torch.no_grad():
        model.lm_head.weight.mul_(1 + 2**-8)
    moved = _chunked(model, batch, LossSpec(), "fp32", 5)
    tolerance = max(SAFETY * _difference(reordered, reference), UNIT_ROUNDOFF["fp32"])
    assert _difference(moved, reference) > tolerance


def test_auto_chunks_only_when_the_logits_exceed_one_chunk():
    vocab = 151_936
    rows = CHUNK_LOGITS_BYTES // (4 * vocab)
    assert Chunking().chunk_rows(rows, vocab) is None  # one chunk would hold them all: unchunked
    assert Chunking().chunk_rows(rows + 1, vocab) == rows
    assert Chunking().chunk_rows(10_000, 400) is None  # the tiny builtin's vocabulary never chunks under auto
    assert Chunking(False).chunk_rows(10**6, vocab) is None
    assert Chunking(True, 7).chunk_rows(8, 400) == 7


def test_the_settings_leave_existing_resolved_configs_unchanged():
    """Added fields are dumped only when set, so cache keys and finished runs' configs made before them still
    match the same experiment."""
    assert "loss_chunking" not in TrainSpec().model_dump()
    assert TrainSpec(loss_chunking=False).model_dump()["loss_chunking"] is False
    assert TrainSpec(loss_chunk_tokens=64).model_dump()["loss_chunk_tokens"] == 64


def _train(model, batches, **settings):
    rows = []
    loop = StageLoop("s", 0, TASKS, lambda r, step: rows.extend(r), lambda step: None, log_every=1, **settings)
    train_stage(model, batches, loop)
    return {(r.step, r.task, r.metric): r.value for r in rows if r.metric == "loss"}, model


@pytest.mark.parametrize("precision", ["fp32", "bf16-autocast"])
def test_a_run_trains_alike_with_chunking_forced_on_and_off(precision):
    """Four steps of the loop, GEM with weights: the logged per-task losses and the final weights of the chunked
    run lie within the tolerance the same run with every batch's rows reversed sets (a reordering)."""
    examples = _examples(24, seed=1)
    batches = [collate(examples[i : i + 6], pad_id=0) for i in range(0, 24, 6)]
    reversed_rows = [collate(examples[i : i + 6][::-1], pad_id=0) for i in range(0, 24, 6)]
    spec = LossSpec(name="gem", task_weights={"a": 2.0}, first_token_weight=1.5)
    common = dict(loss=spec, precision=precision, optim=OptimSpec(lr=1e-3, warmup=1), diagnostics=False)
    base = _model(tied=True)
    off, off_model = _train(copy.deepcopy(base), batches, loss_chunking=False, **common)
    on, on_model = _train(copy.deepcopy(base), batches, loss_chunking=True, loss_chunk_tokens=5, **common)
    rev, rev_model = _train(copy.deepcopy(base), reversed_rows, loss_chunking=False, **common)
    assert off.keys() == on.keys() == rev.keys() and len(off) >= 8

    def rel(a, b):
        return max(abs(a[k] - b[k]) / abs(b[k]) for k in b)

    def param_rel(a, b):
        return max(float((p - q).detach().abs().max() / q.abs().max()) for p, q in zip(a.parameters(), b.parameters()))

    floor = UNIT_ROUNDOFF[precision]
    assert rel(on, off) <= max(SAFETY * rel(rev, off), floor)
    if precision == "fp32":
        # Not under bf16: a gradient entry near 0 whose bf16 rounding differs takes AdamW's full-size step the
        # other way, so the weights of two bf16 runs that differ in rounding only drift apart by ~lr per step.
        assert param_rel(on_model, off_model) <= max(SAFETY * param_rel(rev_model, off_model), floor)
