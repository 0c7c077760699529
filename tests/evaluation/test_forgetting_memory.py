"""The forgetting probe's memory at a large vocabulary: one [batch, seq, vocab] tensor (the model's logits), not two,
and the same per-document losses as the batched cross-entropy it replaced."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import torch
import torch.nn.functional as F

from harness.evaluation.forgetting import document_losses
from tests.conftest import ROOT

PAD = 0


def _model(vocab: int, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        pad_token_id=PAD,
    )
    return Qwen2ForCausalLM(config).eval()


def _batched_reference(model, sequences: list[list[int]], batch_size: int) -> np.ndarray:
    """The probe's formula before the fix: one cross-entropy over the whole [batch, vocab, seq] logits."""
    out: list[float] = []
    with torch.no_grad():
        for start in range(0, len(sequences), batch_size):
            batch = sequences[start : start + batch_size]
            width = max(len(s) for s in batch)
            ids = torch.full((len(batch), width), PAD, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, seq in enumerate(batch):
                ids[row, : len(seq)] = torch.as_tensor(seq)
                mask[row, : len(seq)] = 1
            logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
            labels = ids[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
            nll = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
            counts = (labels != -100).sum(dim=1).clamp(min=1)
            out.extend((nll.sum(dim=1) / counts).tolist())
    return np.asarray(out)


def test_per_document_losses_are_bit_identical_to_the_batched_cross_entropy():
    model = _model(vocab=500)
    rng = np.random.default_rng(1)
    sequences = [rng.integers(1, 500, size=int(n)).tolist() for n in rng.integers(3, 40, size=11)]
    got = document_losses(model, sequences, PAD, batch_size=4)
    assert np.array_equal(got, _batched_reference(model, sequences, batch_size=4))


_PEAK = textwrap.dedent(
    """
    import resource, sys
    import torch
    sys.path.insert(0, {root!r})
    from tests.evaluation.test_forgetting_memory import _model
    from harness.evaluation.forgetting import document_losses
    vocab, batch, seq = {vocab}, {batch}, {seq}
    model = _model(vocab)
    seqs = [[1 + (i * 7 + j) % (vocab - 1) for j in range(seq)] for i in range(batch)]
    document_losses(model, [s[:4] for s in seqs], 0, batch_size=batch)  # warm up at a negligible size
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    document_losses(model, seqs, 0, batch_size=batch)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024)
    """
)


def test_the_probe_holds_one_batch_by_vocabulary_tensor_not_two():
    """Peak resident memory of one probe batch, in a fresh process: the logits [batch, seq, vocab] and one document's
    log-softmax [seq, vocab] (1 + 1/batch of the logits); the batched cross-entropy held a second [batch, seq, vocab]
    tensor (2x). Large tensors are mmap'd and returned to the system when freed, so the high-water mark is the live
    peak."""
    vocab, batch, seq = 16_000, 8, 128
    logits_bytes = 4 * vocab * batch * seq  # 65 MB
    script = _PEAK.format(root=str(ROOT), vocab=vocab, batch=batch, seq=seq)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    grown = int(done.stdout.strip().splitlines()[-1])
    assert grown < 1.5 * logits_bytes, f"peak grew {grown / logits_bytes:.2f}x the logits"
