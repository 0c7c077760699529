"""Sharded evaluation (data-parallel ranks share out the eval batches): gathered, the ranks' parts give exactly
what one process computes — samples in the same order, the same metrics — whatever the number of ranks."""

from __future__ import annotations

import pytest
import torch

from harness.config import EvalSpec
from harness.evaluation import run_evaluation
from harness.models.tokenizer import train_tokenizer
from tests.evaluation.test_evaluation import ExactRecipe, item, tiny_model


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(
        [
            f"is the cat {c}? yes it is. no it is not. the sun of {c} is {i}"
            for i in range(50)
            for c in ("red", "hot", "cold")
        ],
        vocab_size=320,
        min_frequency=1,
    )


class _Rank:
    """One simulated rank: its ``all_gather`` hands its part to ``sent`` and returns every part sent so far, own
    first (ranks ≥ 1 run before rank 0, whose result is the one compared)."""

    def __init__(self, rank: int, world: int, sent: dict):
        self.rank, self.world, self.sent = rank, world, sent

    def all_gather(self, obj):
        self.sent[self.rank] = obj
        return [self.sent[r] for r in sorted(self.sent)]


def _items(tok, n=23):
    gen = torch.Generator().manual_seed(5)
    out = []
    for i in range(n):
        prompt = torch.randint(4, len(tok), (int(torch.randint(2, 14, (1,), generator=gen)),), generator=gen).tolist()
        gold = torch.randint(4, len(tok), (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen).tolist()
        out.append(
            item(
                "r" if i % 3 else "s",
                "heldout" if i % 2 else "heldout_template",
                i,
                prompt,
                gold + [tok.eos_token_id],
                tok,
            )
        )
    return out


@pytest.mark.parametrize("evaluators", [["greedy", "mode_ok", "teacher_forced"], ["greedy"], []])
@pytest.mark.parametrize("world", [2, 3])
def test_gathered_shards_equal_one_process(tok, evaluators, world):
    model, items = tiny_model(tok, seed=4), _items(tok)
    recipes = {"r": ExactRecipe(), "s": ExactRecipe()}
    spec = EvalSpec(evaluators=evaluators, probes=["first_token"], batch_size=4, max_new_tokens=5)
    whole = run_evaluation(model, tok, items, recipes, spec)
    sent: dict = {}
    for rank in reversed(range(world)):
        sharded = run_evaluation(model, tok, items, recipes, spec, shard=_Rank(rank, world, sent))
    assert all(0 < len(part) < len(items) for part in sent.values()), "every rank computed a real share"
    assert sharded.samples == whole.samples  # same order, same predictions, ranks and probabilities
    assert sharded.metrics == whole.metrics
    assert sharded.item_values == whole.item_values and sharded.tables == whole.tables
