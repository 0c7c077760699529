"""Encoding reuse (harness.data.task_encoding.encode_tasks): a process asking again for the same encoding (a sweep
worker's next trial) gets the previous one without tokenising again — equal to a fresh encoding, its arrays read-only —
and anything the encoding reads (data, tokenizer, settings) encodes afresh."""

from __future__ import annotations

import copy

import pytest

from harness.config import Experiment
from harness.data import task_encoding
from harness.models.tokenizer import train_tokenizer
from harness.runs.planning.prepare import build_task_data, encode_task_data


@pytest.fixture(autouse=True)
def no_previous_encoding(monkeypatch):
    monkeypatch.setattr(task_encoding, "_last_encoding", {})


def _tokenizer(data, vocab_size: int = 300):
    texts = [m["content"] for splits in data.splits.values() for ex in splits["train"] for m in ex.messages]
    return train_tokenizer(texts, vocab_size=vocab_size, min_frequency=1)


def _plain(encoded) -> tuple:
    """Everything an encoding holds, as plain values (arrays as lists)."""
    train = {t: [(e.task, e.input_ids.tolist(), e.labels.tolist()) for e in pool] for t, pool in encoded.train.items()}
    return train, [vars(item) for item in encoded.eval_items], encoded.empty_splits, encoded.too_long


def _count_calls(monkeypatch) -> list[int]:
    calls = [0]
    compute = task_encoding._encoded

    def counted(*args, **kwargs):
        calls[0] += 1
        return compute(*args, **kwargs)

    monkeypatch.setattr(task_encoding, "_encoded", counted)
    return calls


def test_the_same_encoding_again_is_reused_and_equals_a_fresh_one(tiny, monkeypatch):
    exp = Experiment.model_validate(tiny)
    calls = _count_calls(monkeypatch)
    first_data = build_task_data(exp)
    tokenizer = _tokenizer(first_data)
    first = encode_task_data(exp, first_data, tokenizer)
    again_data = build_task_data(exp)  # the next trial: its own data objects, the same content
    again = encode_task_data(exp, again_data, tokenizer)
    assert calls[0] == 1, "the second trial tokenised again"
    task_encoding._last_encoding.clear()
    fresh = encode_task_data(exp, build_task_data(exp), tokenizer)
    assert _plain(again) == _plain(fresh) == _plain(first)
    assert again.train is not first.train and again.eval_items is not first.eval_items  # lists of its own
    with pytest.raises(ValueError, match="read-only"):
        again.train["repeat"][0].input_ids[0] = 7  # shared with the other trials: never written


@pytest.mark.parametrize(
    "change",
    [
        lambda spec: spec["eval"].update(splits=["heldout", "train"]),
        lambda spec: spec["tasks"]["repeat"].update(eval=3),
        lambda spec: spec["train"].update(max_length=24),
        lambda spec: spec.update(seed=spec["seed"] + 1),
    ],
)
def test_a_changed_setting_encodes_afresh(tiny, monkeypatch, change):
    calls = _count_calls(monkeypatch)
    base = Experiment.model_validate(tiny)
    tokenizer = _tokenizer(build_task_data(base))
    encode_task_data(base, build_task_data(base), tokenizer)
    changed = copy.deepcopy(tiny)
    change(changed)
    exp = Experiment.model_validate(changed)
    encode_task_data(exp, build_task_data(exp), tokenizer)
    assert calls[0] == 2


def test_another_tokenizer_or_changed_data_encodes_afresh(tiny, monkeypatch):
    calls = _count_calls(monkeypatch)
    exp = Experiment.model_validate(tiny)
    data = build_task_data(exp)
    tokenizer = _tokenizer(data)
    encode_task_data(exp, data, tokenizer)
    encode_task_data(exp, build_task_data(exp), _tokenizer(data, vocab_size=280))
    assert calls[0] == 2
    edited = build_task_data(exp)
    first = edited.splits["repeat"]["train"][0]
    edited.splits["repeat"]["train"][0] = type(first).single("repeat", "Repeat after me: zz", "zz")
    encoded = encode_task_data(exp, edited, tokenizer)
    assert calls[0] == 3
    assert "Repeat after me: zz" in tokenizer.decode(encoded.train["repeat"][0].input_ids.tolist())
