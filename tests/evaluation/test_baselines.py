"""Baselines of eval pools, on the real recipes: constant answer, majority first token, chance."""

from __future__ import annotations

from collections import Counter

import pytest

import data_recipes as dr
from data_recipes import get_recipe
from harness.evaluation.baselines import (
    CHANCE,
    CONSTANT,
    MAJORITY_FIRST_TOKEN,
    constant_answer_baseline,
    majority_first_token_baseline,
    strongest_baselines,
    task_baselines,
)

N_EVAL = 40


@pytest.fixture(scope="module")
def world():
    return dr.build_world(120, 0)


def pool(name, world, **params):
    cls = get_recipe(name)
    recipe = cls(cls.Params(**params), world=world if cls.needs_world else None)
    return recipe, [e.answer for e in recipe.build(name, 300, N_EVAL, 0)["heldout"]]


def by_kind(baselines):
    return {(b.metric, b.kind): b for b in baselines}


def test_identity_constant_answer_is_perfect(world):
    recipe, golds = pool("identity", world)
    found = by_kind(task_baselines(golds, [7] * len(golds), recipe))
    assert found[("greedy", CONSTANT)].value == 1.0 and found[("greedy", CONSTANT)].answer == golds[0]
    assert found[("mode_ok", CONSTANT)].value == 1.0
    assert found[("tf_first", MAJORITY_FIRST_TOKEN)].value == 1.0  # every answer starts with "I"
    assert ("greedy", CHANCE) not in found


def test_yesno_constant_is_the_majority_class_and_chance_is_a_half(world):
    recipe, golds = pool("yesno", world)
    share_yes = sum(g == "Yes." for g in golds) / len(golds)
    found = by_kind(task_baselines(golds, [], recipe))
    assert found[("greedy", CONSTANT)].value == pytest.approx(max(share_yes, 1 - share_yes))
    assert found[("greedy", CHANCE)].value == 0.5 and found[("greedy", CHANCE)].n == len(golds)
    assert found[("mode_ok", CONSTANT)].value == 1.0
    # the constant beats or ties chance; strongest keeps the constant
    assert strongest_baselines(task_baselines(golds, [], recipe))["greedy"].kind == CONSTANT
    # on a pool that is all "No." the constant "No." scores 1.0
    assert by_kind(task_baselines(["No."] * 5, [], recipe))[("greedy", CONSTANT)].answer == "No."


def test_short_qa_constant_is_the_most_common_normalised_answer(world):
    recipe, golds = pool("short_qa", world)
    counts = Counter(recipe.normalise(g) for g in golds)
    found = by_kind(task_baselines(golds, [], recipe))
    best = found[("greedy", CONSTANT)]
    assert best.value == pytest.approx(max(counts.values()) / len(golds))
    assert counts[recipe.normalise(best.answer)] == max(counts.values())
    assert 0 < best.value < 1 and found[("mode_ok", CONSTANT)].value == 1.0


def test_math_constant_scores_greedy_and_answer_ok(world):
    recipe, golds = pool("math_reversed", world)
    found = by_kind(task_baselines(golds, [], recipe))
    best = found[("greedy", CONSTANT)]
    results = Counter(g.split(" ; A ")[1] for g in golds)
    assert found[("answer_ok", CONSTANT)].value == pytest.approx(results[best.answer.split(" ; A ")[1]] / len(golds))
    assert found[("answer_ok", CONSTANT)].value >= best.value


def test_majority_first_token_ties_and_missing_gold():
    (b,) = majority_first_token_baseline([5, 3, 5, 3, None, 9])
    assert (b.answer, b.value, b.n) == (3, 0.4, 5)  # a tie between 3 and 5 goes to the smaller id
    assert majority_first_token_baseline([None, None]) == []
    assert task_baselines([], [], get_recipe("identity")()) == []


@pytest.mark.parametrize(
    "name, params",
    [
        ("repeat", {}),
        ("identity", {}),
        ("yesno", {}),
        ("short_qa", {}),
        ("assistant_qa", {}),
        ("math_reversed", {}),
        ("spell", {}),
        ("count", {}),
    ],
)
def test_constant_answer_scores_equal_every_candidate_judged_against_every_gold(world, name, params):
    # counted per distinct gold or normal form, the scores must be the brute-force ones (ties broken alike)
    recipe, golds = pool(name, world, **params)
    golds = golds + golds[:7] + [g.upper() + "." for g in golds[:3]]  # repeats and other spellings of one answer
    candidates = list(dict.fromkeys([*recipe.answer_classes(), *golds]))
    scored = [(sum(bool(recipe.is_correct(c, g)) for g in golds) / len(golds), c) for c in candidates]
    best = max(score for score, _ in scored)
    greedy = constant_answer_baseline(golds, recipe)[0]
    assert (greedy.value, greedy.answer) == (best, next(c for score, c in scored if score == best))
