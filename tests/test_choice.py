"""analysis.binary_choice_auc: the yes/no ranking beside greedy accuracy — its false-alarm rate on a null where the
probabilities ignore the gold answer, and a planted effect that greedy misses (every answer "No")."""

from __future__ import annotations

import json
import random

import polars as pl
import pytest

from analysis import binary_choice_auc, load_samples
from analysis.choice import positive_share


def _item(gold_yes: bool, p_yes: float, step: int = 10, split: str = "heldout_template") -> dict:
    pred = "Yes." if p_yes > 0.5 else "No."
    return {"task": "yesno", "step": step, "split": split, "gold": "Yes." if gold_yes else "No.", "pred": pred,
            "correct": pred[:2] == ("Ye" if gold_yes else "No"),
            "top5": [{"token": "Yes", "prob": p_yes}, {"token": "No", "prob": 1 - p_yes}]}


def test_a_no_biased_model_that_ranks_right_is_found_though_greedy_is_at_chance():
    rng = random.Random(0)
    # planted: true statements get P(Yes) 0.35-0.48, false ones 0.20-0.40 — always below 0.5, so greedy says "No"
    items = [_item(True, rng.uniform(0.35, 0.48)) for _ in range(50)] + \
            [_item(False, rng.uniform(0.20, 0.40)) for _ in range(50)]
    row = binary_choice_auc(pl.DataFrame(items), "yesno").row(0, named=True)
    assert row["greedy"] == 0.5 and row["predicted_positive"] == 0.0
    assert row["greedy_low"] < 0.5 < row["greedy_high"]  # n = 100: chance inside greedy's interval
    assert row["predicted_positive_low"] == 0.0 < row["predicted_positive_high"] < 0.05
    assert row["auc"] > 0.8 and row["p_value"] < 1e-6
    assert (row["n"], row["n_positive"]) == (100, 50)


def test_false_alarm_rate_on_a_null_is_near_alpha():
    rng = random.Random(1)
    alarms, trials = 0, 400
    for _ in range(trials):
        items = [_item(rng.random() < 0.5, rng.random()) for _ in range(60)]
        alarms += binary_choice_auc(pl.DataFrame(items), "yesno")["p_value"][0] < 0.05
    assert 0.02 <= alarms / trials <= 0.09, alarms / trials


def test_rows_per_step_and_split_and_one_class_pools_left_out(tmp_path):
    items = [_item(True, 0.9, step=5), _item(False, 0.1, step=5), _item(True, 0.2, step=5, split="heldout"),
             _item(True, 0.6, step=9), _item(False, 0.7, step=9)]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
    table = binary_choice_auc(load_samples(tmp_path), "yesno")
    assert table.select("step", "split").rows() == [(5, "heldout_template"), (9, "heldout_template")]
    assert table["auc"].to_list() == [1.0, 0.0]
    assert positive_share([{"token": "Yes", "prob": 0.3}], "Yes", "No") == 1.0
    assert positive_share([{"token": "maybe", "prob": 0.9}], "Yes", "No") == 0.5
    assert positive_share([{"token": "Yes", "prob": 0.2}, {"token": "No", "prob": 0.6}], "Yes", "No") == \
        pytest.approx(0.25)
