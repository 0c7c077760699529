"""Per-item outcomes behind proportion metrics: components' item_values, EvalResult intervals and seesaw rows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from data_recipes import get_recipe
from harness.core.metrics import PROPORTION_METRICS
from harness.core.registry import EVALUATORS, PROBES
from harness.core.seesaw import change_tests
from harness.core.stats import wilson_interval
from harness.evaluation.components import EvalContext, ItemRecord
from harness.evaluation.result import EvalResult

GOLD = "R 9 1 ; A 1 9"


def record(pred, gold=GOLD, **facts):
    item = SimpleNamespace(task="math", split="heldout", index=0, prompt_text="", gold_text=gold, gold_ids=[4, 5])
    recipe = get_recipe("math_reversed")()
    return ItemRecord(item, pred=pred, correct=recipe.is_correct(pred, gold), mode_ok=recipe.mode_ok(pred), **facts)


def test_greedy_reports_answer_ok_beside_greedy_for_math():
    recipe = get_recipe("math_reversed")()
    records = [
        record(GOLD, truncated=False),
        record("R 0 0 ; A 1 9", truncated=False),
        record("garbage A 1 9 more", truncated=True),
    ]
    greedy = EVALUATORS.get("greedy")
    ctx = EvalContext(None, frozenset(), None)
    assert greedy.item_values(records, recipe, ctx) == {
        "greedy": [1.0, 0.0, 0.0],
        "answer_ok": [1.0, 1.0, 0.0],
        "truncated": [0.0, 0.0, 1.0],
    }
    assert greedy.metrics(records, recipe, ctx) == {
        "greedy": pytest.approx(1 / 3),
        "answer_ok": pytest.approx(2 / 3),
        "truncated": pytest.approx(1 / 3),
    }
    assert set(greedy.metric_names) >= {"greedy", "answer_ok"}
    identity = get_recipe("identity")()
    assert set(greedy.metrics(records, identity, ctx)) == {"greedy", "truncated"}  # no extra scores: no answer_ok


def test_first_token_reports_nonfinite_only_when_measured():
    probe = PROBES.get("first_token")
    ctx = EvalContext(None, frozenset({3}), None)
    measured = [
        record(GOLD, gold_first_rank=1, top1_id=3, first_nonfinite=False),
        record(GOLD, gold_first_rank=320, top1_id=0, first_nonfinite=True),
    ]
    values = probe.item_values(measured, None, ctx)
    assert values["ft_hijack"] == [1.0, 0.0] and values["ft_nonfinite"] == [0.0, 1.0]
    assert probe.metrics(measured, None, ctx)["ft_nonfinite"] == 0.5
    unmeasured = [record(GOLD, gold_first_rank=1, top1_id=3)]
    assert "ft_nonfinite" not in probe.metrics(unmeasured, None, ctx)


def test_every_proportion_metric_has_an_evaluator_that_emits_it():
    emitted = {m for registry in (EVALUATORS, PROBES) for n in registry.names() for m in registry.get(n).metric_names}
    assert PROPORTION_METRICS <= emitted


def test_eval_result_intervals_and_seesaw_rows():
    result = EvalResult(
        item_values={
            ("math", "heldout", "greedy"): [1.0, 0.0, 1.0, 1.0],
            ("math", "heldout", "ft_mrr"): [1.0, 0.5, 0.25, 1.0],
        }
    )
    assert result.interval("math", "heldout", "greedy") == wilson_interval(3, 4)
    assert result.interval("math", "heldout", "ft_mrr") is None  # not a proportion
    assert result.interval("math", "heldout", "mode_ok") is None  # not kept
    later = EvalResult(item_values={("math", "heldout", "greedy"): [0.0, 0.0, 0.0, 1.0]})
    rows = result.outcome_rows(0, "s") + later.outcome_rows(10, "s")
    (test,) = change_tests(rows, ["greedy"])
    assert (test["task"], test["n"], test["change"]) == ("math", 4, -0.5)


def test_loss_targets_per_item_values_reproduce_the_pooled_loss_and_weigh_items_by_length():
    """eval_loss's per-item values are the ratio estimator's linearisation: their mean is the token-weighted loss
    (not the mean of per-item losses, which weighs short answers more); gold_logprob's are −Σ CE per item."""
    tf = EVALUATORS.get("teacher_forced")
    ctx = EvalContext(None, frozenset(), None)
    records = [
        record(GOLD, tf_hits=[True], tf_nll=0.5),  # 1 token, 0.5 nats
        record(GOLD, tf_hits=[True, False, True], tf_nll=6.0),  # 3 tokens, 2 nats each
    ]
    values = tf.item_values(records, None, ctx)
    metrics = tf.metrics(records, None, ctx)
    assert metrics["eval_loss"] == pytest.approx(6.5 / 4)  # token-weighted, not (0.5 + 2) / 2
    assert sum(values["eval_loss"]) / 2 == pytest.approx(metrics["eval_loss"])
    assert values["gold_logprob"] == [-0.5, -6.0] and metrics["gold_logprob"] == pytest.approx(-3.25)
    assert values["eval_loss"][1] > values["eval_loss"][0]  # the worse item stays the worse one
    assert "gold_logprob" not in PROPORTION_METRICS and "eval_loss" not in PROPORTION_METRICS
    no_tokens = tf.item_values([record(GOLD, tf_hits=[], tf_nll=0.0)], None, ctx)
    assert "eval_loss" not in no_tokens and no_tokens["gold_logprob"] == [-0.0]
