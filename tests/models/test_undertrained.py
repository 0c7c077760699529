"""Under-trained special-token rows: flagged on a planted fault (and on the builtin's natural one), not on a null."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from harness.models.undertrained import (
    candidate_token_ids,
    detect_undertrained,
    rate_with_interval,
    reference_unused_ids,
)

SPECIAL = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def pretrained():
    """A builtin qwen2-tiny pretrained on the world corpus (tied embeddings), its tokenizer, and the ids of the
    tokens that never occur in that corpus (the known-unused reference rows)."""
    from data_recipes import build_world, corpus
    from harness.config import ModelSpec
    from harness.runs.planning.pretrain import builtin_base

    docs = corpus(build_world(60, 0), 0)
    spec = ModelSpec(
        builtin="qwen2-tiny",
        config=dict(
            hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
        ),
        tokenizer=dict(vocab_size=600),
        pretrain=dict(steps=120, batch_size=8, seq_len=64),
    )
    model, tokenizer, _ = builtin_base(spec, docs, [], 0)
    counts = Counter(i for d in docs for i in tokenizer(d)["input_ids"])
    special = tokenizer.convert_tokens_to_ids(SPECIAL)
    absent = [i for i in range(len(tokenizer)) if counts[i] == 0 and i not in special]
    frequent = sorted(i for i, k in counts.items() if k >= 20 and i not in special)
    return model, tokenizer, absent, frequent


def _flags(model, tokenizer, absent):
    return {r.token: r for r in detect_undertrained(model, tokenizer, unused_ids=absent)}


def test_candidates_are_the_special_tokens(pretrained):
    _, tokenizer, _, _ = pretrained
    assert candidate_token_ids(tokenizer) == sorted(tokenizer.convert_tokens_to_ids(SPECIAL))


def test_builtin_chat_tokens_never_in_pretraining_are_flagged(pretrained):
    """The seed's fault, as it occurs: ChatML tokens never appear in the corpus, <|endoftext|> separates documents."""
    model, tokenizer, absent, _ = pretrained
    reports = _flags(model, tokenizer, absent)
    assert {t for t, r in reports.items() if r.flagged} == {"<|pad|>", "<|im_start|>", "<|im_end|>"}
    assert "never-trained" in reports["<|im_end|>"].why and reports["<|im_end|>"].output is None  # tied


@pytest.mark.parametrize("plant", ["zeros", "mean"])
def test_planted_im_end_row_flagged_and_trained_rows_not(pretrained, plant):
    model, tokenizer, absent, frequent = pretrained
    weight = model.get_input_embeddings().weight
    original = weight.detach().clone()
    special = tokenizer.convert_tokens_to_ids(SPECIAL)
    try:
        with torch.no_grad():  # the null first: every special row a copy of a trained row
            for k, i in enumerate(special):
                weight[i] = original[frequent[10 * k]]
        assert not any(r.flagged for r in _flags(model, tokenizer, absent).values())
        with torch.no_grad():
            im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
            weight[im_end] = 0 if plant == "zeros" else original.mean(dim=0)
        reports = _flags(model, tokenizer, absent)
        assert [t for t, r in reports.items() if r.flagged] == ["<|im_end|>"]
    finally:
        with torch.no_grad():
            weight.copy_(original)


def _rate(model, absent, frequent, plant, seed=0):
    """Flag rate over every frequent (trained) token, planting into 4 rows at a time (the size of a real candidate
    set) so the reference statistics stay those of the trained vocabulary."""
    weight = model.get_input_embeddings().weight
    original = weight.detach().clone()
    generator = torch.Generator().manual_seed(seed)
    flags = []
    try:
        for start in range(0, len(frequent), 4):
            chunk = frequent[start : start + 4]
            with torch.no_grad():
                weight.copy_(original)
                for i in chunk:
                    if plant == "zeros":
                        weight[i] = 0
                    elif plant == "init":
                        weight[i] = torch.randn(weight.shape[1], generator=generator) * model.config.initializer_range
            reports = detect_undertrained(model, _Tok(), token_ids=chunk, unused_ids=absent)
            flags.extend(r.flagged for r in reports)
    finally:
        with torch.no_grad():
            weight.copy_(original)
    return rate_with_interval(flags)


class _Tok:
    """Enough of a tokenizer for detect_undertrained with explicit ids."""

    def __len__(self):
        return 10**9

    def convert_ids_to_tokens(self, i):
        return f"id{i}"


def test_false_flag_rate_on_trained_rows_and_detection_rate_on_planted_rows(pretrained):
    model, _, absent, frequent = pretrained
    null_rate, n, (low, high) = _rate(model, absent, frequent, "none")
    zeros_rate, _, (zeros_low, _) = _rate(model, absent, frequent, "zeros")
    init_rate, _, (init_low, init_high) = _rate(model, absent, frequent, "init")
    print(
        f"\nfalse-flag rate on trained rows: {null_rate:.3f} (n={n}, 95% CI {low:.3f}–{high:.3f}); "
        f"zeros detected {zeros_rate:.3f}; init-distribution rows detected {init_rate:.3f} "
        f"(95% CI {init_low:.3f}–{init_high:.3f})"
    )
    assert n >= 100
    assert high < 0.05  # at most a few percent of trained rows flagged
    assert zeros_low > 0.95
    assert init_rate > null_rate  # init-scale rows are weaker evidence in a 64-wide model, but still separated


def test_untied_output_row_checked_separately():
    from harness.config import ModelSpec
    from harness.models.builtin import build_builtin
    from harness.models.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["the cat sat on the mat", "a dog ran"] * 20, vocab_size=300, min_frequency=1)
    spec = ModelSpec(
        builtin="llama-tiny",
        config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=False,
        ),
    )
    model = build_builtin(spec, tokenizer, seed=0)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        model.get_output_embeddings().weight[im_end] = 0
    reports = {r.token: r for r in detect_undertrained(model, tokenizer)}
    assert reports["<|im_end|>"].flagged and reports["<|im_end|>"].why.startswith("output: norm")
    # The pad row is zero at init in transformers' embeddings (padding_idx): untrained, and rightly flagged.
    assert {t for t, r in reports.items() if r.flagged} == {"<|im_end|>", "<|pad|>"}
    assert reports["<|pad|>"].why.startswith("input: norm")
    assert reference_unused_ids(tokenizer, len(tokenizer) + 3) == [len(tokenizer) + k for k in range(3)]


def test_row_fate_says_what_each_setting_does_with_the_flagged_rows():
    from harness.config.schema import TrainableSpec
    from harness.models.undertrained import row_fate

    def lora(**fields):
        return TrainableSpec(mode="lora", **fields)

    own, added = [3], [5]  # id 3: the base model's own token; id 5: one the harness added
    assert "stay frozen in stage(s) s (new_token_rows: true)" in row_fate(
        [("s", lora(new_token_rows=True))], own, added
    ), "true trains added rows only"
    assert row_fate([("s", lora(new_token_rows=True))], added, added).startswith("every stage trains their rows")
    assert "stay frozen in stage(s) s (new_token_rows: false)" in row_fate(
        [("s", lora(new_token_rows=False))], own, added
    )
    unfrozen = lora(new_token_rows=False, unfreeze=["embed_tokens"])
    assert row_fate([("s", unfrozen)], own, added).startswith("every stage trains their rows")
    assert row_fate([("s", lora())], own, added).startswith("every stage trains their rows")  # auto
    assert row_fate([("a", TrainableSpec(mode="full"))], own, added) == (
        "every stage trains the whole model, their rows included"
    )
