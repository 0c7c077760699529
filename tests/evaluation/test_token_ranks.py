"""Gold first-token ranks with ties and non-finite logits counted against the gold token."""

from __future__ import annotations

import math

import pytest
import torch

from harness.evaluation.token_ranks import first_token_facts, gold_ranks

VOCAB = 7


def test_distinct_logits_rank_like_a_sort():
    logits = torch.tensor([[0.1, 2.0, -1.0, 0.5, 3.0, 0.0, -2.0]])
    order = sorted(range(VOCAB), key=lambda i: -logits[0, i].item())
    for gold in range(VOCAB):
        ranks, nonfinite = gold_ranks(logits, [gold])
        assert ranks == [order.index(gold) + 1] and nonfinite == [False]


def test_ties_count_against_the_gold_token():
    logits = torch.tensor(
        [[1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0] * VOCAB]
    )  # a collapsed model: every token equally likely
    ranks, nonfinite = gold_ranks(logits, [0, 3])
    assert ranks == [2, VOCAB] and nonfinite == [False, False]


def test_non_finite_rows_get_the_worst_rank_and_are_flagged():
    logits = torch.tensor(
        [
            [math.nan] * VOCAB,
            [5.0, math.nan, 0.0, 0.0, 0.0, 0.0, 0.0],  # the gold logit itself is the highest finite
            [math.inf, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        ]
    )
    facts = first_token_facts(logits, [0, 0, 0, 0])
    assert facts["rank"] == [VOCAB, VOCAB, VOCAB, 1]
    assert facts["nonfinite"] == [True, True, True, False]


def test_no_gold_gives_no_rank_and_top_tokens_are_reported():
    logits = torch.tensor([[0.0, 4.0, 1.0, 3.0, 2.0, -1.0, -2.0]])
    facts = first_token_facts(logits, [None])
    assert facts["rank"] == [None] and facts["top1"] == [1]
    ids, probs = facts["top5"][0]
    assert ids == [1, 3, 4, 2, 0]
    assert probs == pytest.approx(torch.softmax(logits[0], 0)[ids].tolist())
