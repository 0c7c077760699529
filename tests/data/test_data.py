"""Encoding with completion-only labels, mixture semantics, and length-grouped batching."""

from __future__ import annotations

import numpy as np
import pytest

from data_recipes.base import Example
from harness.config import parse_mixture
from harness.data.batches import collate, length_grouped_batches
from harness.data.encoding import IGNORE_INDEX, Encoded, encode_examples, eval_items
from harness.data.stream import mixture_stream
from harness.models.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    text = ["user\nRepeat after me: habayp", "assistant\nhabayp", "Mara was born in Osvik in 1972. yes no"] * 50
    return train_tokenizer(text, vocab_size=400, min_frequency=1)


def supervised_text(tokenizer, enc: Encoded) -> list[str]:
    """The supervised tokens decoded, one string per contiguous supervised run (labels are pre-shifted)."""
    runs, current = [], []
    for label in enc.labels.tolist():
        if label == IGNORE_INDEX:
            if current:
                runs.append(tokenizer.decode(current))
                current = []
        else:
            current.append(label)
    if current:
        runs.append(tokenizer.decode(current))
    return runs


def test_single_turn_labels_cover_exactly_the_answer_and_end_token(tokenizer):
    ex = Example.single("repeat", "Repeat after me: habayp", "habayp")
    (enc,) = encode_examples(tokenizer, [ex])
    assert supervised_text(tokenizer, enc) == ["habayp<|im_end|>"]
    # labels are shifted by one: position t is trained to predict token t+1
    sup = np.nonzero(enc.labels != IGNORE_INDEX)[0]
    assert (enc.labels[sup] == enc.input_ids[sup + 1]).all()
    # golden: the prompt (template, role tokens, user content) is never supervised
    prompt = tokenizer.apply_chat_template(list(ex.messages[:1]), tokenize=False, add_generation_prompt=True)
    n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert sup.min() == n_prompt - 1


def test_multi_turn_supervises_every_assistant_turn(tokenizer):
    ex = Example(
        "qa",
        (
            {"role": "user", "content": "Where was Mara born?"},
            {"role": "assistant", "content": "Mara was born in Osvik."},
            {"role": "user", "content": "And when?"},
            {"role": "assistant", "content": "In 1972."},
        ),
    )
    (enc,) = encode_examples(tokenizer, [ex])
    assert supervised_text(tokenizer, enc) == ["Mara was born in Osvik.<|im_end|>", "In 1972.<|im_end|>"]


def test_eval_item_prompt_is_the_conversation_prefix(tokenizer):
    ex = Example(
        "qa",
        (
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yes"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "no"},
        ),
    )
    (item,) = eval_items(tokenizer, [ex], "heldout")
    assert item.prompt_text.endswith("<|im_start|>assistant\n")
    assert "yes<|im_end|>" in item.prompt_text, "earlier turns are part of the prompt"
    assert tokenizer.decode(item.gold_ids) == "no<|im_end|>"
    assert item.gold_text == "no"


def test_eval_items_of_a_batch_equal_each_item_rendered_and_tokenised_alone(tokenizer):
    # eval_items reuses encode's renders and tokenises the prompts in one call: each item must still be exactly the
    # template's render of the conversation before its last turn, tokenised alone
    examples = [Example.single("repeat", "Repeat after me: " + "habayp " * k, "habayp " * k) for k in (1, 4, 2)]
    examples.insert(
        1,
        Example(
            "qa",
            (
                {"role": "user", "content": "Where was Mara born?"},
                {"role": "assistant", "content": "Osvik"},
                {"role": "user", "content": "And when?"},
                {"role": "assistant", "content": "1972"},
            ),
        ),
    )
    for ex, item in zip(examples, eval_items(tokenizer, examples, "heldout"), strict=True):
        alone = tokenizer.apply_chat_template(list(ex.messages[:-1]), tokenize=False, add_generation_prompt=True)
        assert item.prompt_text == alone
        assert item.prompt_ids == tokenizer(alone, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(item.gold_ids) == ex.messages[-1]["content"] + "<|im_end|>"


def _shares(draws, tasks):
    counts = {t: 0 for t in tasks}
    for t, _ in draws:
        counts[t] += 1
    return {t: c / len(draws) for t, c in counts.items()}


def test_weights_mixture_proportions_within_tolerance():
    mixture = parse_mixture({"a": 0.6, "b": 0.3, "c": 0.1, "d": 0.0}, "m", ["a", "b", "c", "d"], [])
    n = 20000
    draws = mixture_stream(mixture, {"a": 50, "b": 500, "c": 7, "d": 10}, n, np.random.default_rng(0))
    shares = _shares(draws, ["a", "b", "c", "d"])
    for task, p in {"a": 0.6, "b": 0.3, "c": 0.1}.items():
        assert abs(shares[task] - p) < 4 * np.sqrt(p * (1 - p) / n), (task, shares[task])
    assert shares["d"] == 0, "weight 0 means never drawn"
    # within a task, no example repeats before its whole pool has been used
    first_c = [i for t, i in draws if t == "c"][:7]
    assert sorted(first_c) == list(range(7))


def test_natural_mixture_share_is_pool_size():
    mixture = parse_mixture("natural", "m", ["a", "b"], [])
    draws = mixture_stream(mixture, {"a": 300, "b": 100}, 400, np.random.default_rng(1))
    assert _shares(draws, ["a", "b"]) == {"a": 0.75, "b": 0.25}, "one pass sees every example exactly once"
    assert len(set(draws)) == 400
    longer = mixture_stream(mixture, {"a": 300, "b": 100}, 1000, np.random.default_rng(1))
    assert abs(_shares(longer, ["a", "b"])["a"] - 0.75) < 0.03


def test_counts_mixture_is_exact_and_without_replacement():
    mixture = parse_mixture({"counts": {"a": 30, "b": 5}}, "m", ["a", "b"], [])
    draws = mixture_stream(mixture, {"a": 30, "b": 100}, 35, np.random.default_rng(2))
    assert _shares(draws, ["a", "b"]) == {"a": 30 / 35, "b": 5 / 35}
    assert len(set(draws)) == 35, "without replacement"
    with_replacement = parse_mixture({"counts": {"a": 60}, "replace": True}, "m", ["a"], [])
    assert len(mixture_stream(with_replacement, {"a": 30}, 60, np.random.default_rng(2))) == 60


def test_length_grouping_cuts_padding():
    rng = np.random.default_rng(0)
    examples = [
        Encoded("t", np.ones(n, dtype=np.int64), np.ones(n, dtype=np.int64)) for n in rng.integers(10, 80, size=512)
    ]

    def pad_fraction(batches):
        cs = [collate(b, 0) for b in batches]
        return 1 - sum(c.n_real_tokens for c in cs) / sum(c.n_padded_tokens for c in cs)

    grouped = length_grouped_batches(examples, 16, 32, np.random.default_rng(1))
    plain = length_grouped_batches(examples, 16, 1, np.random.default_rng(1))
    assert sorted(id(e) for b in grouped for e in b) == sorted(id(e) for e in examples), "nothing lost"
    assert pad_fraction(grouped) < 0.05 < pad_fraction(plain)
