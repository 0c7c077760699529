"""Seesaw events on synthetic metric series with known answers: the untested threshold rule and the paired rule."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binomtest, false_discovery_control

from harness.core.seesaw import change_tests, format_events, paired_seesaw_events, seesaw_events


def rows(series, metric="greedy", split="heldout"):
    """``series``: [(step, stage, {task: value})] → long rows."""
    return [
        {"step": step, "stage": stage, "task": task, "split": split, "metric": metric, "value": value}
        for step, stage, values in series
        for task, value in values.items()
    ]


def pairs(events):
    return [(e["step_from"], e["step_to"], e["rose"], e["fell"]) for e in events]


def test_rise_and_fall_exactly_at_delta_count_and_below_do_not():
    series = [
        (0, "s", {"a": 0.10, "b": 0.80, "c": 0.50}),
        (10, "s", {"a": 0.25, "b": 0.65, "c": 0.50}),  # a +0.15, b -0.15 (exactly δ in float arithmetic)
        (20, "s", {"a": 0.39, "b": 0.52, "c": 0.64}),  # a +0.14, b -0.13, c +0.14: all below δ
        (30, "s", {"a": 0.20, "b": 0.80, "c": 0.90}),  # a -0.19, b +0.28, c +0.26
    ]
    events = seesaw_events(rows(series), 0.15)
    assert pairs(events) == [(0, 10, "a", "b"), (20, 30, "b", "a"), (20, 30, "c", "a")]
    first = events[0]
    assert first["metric"] == "greedy" and first["split"] == "heldout"
    assert first["stage_from"] == first["stage_to"] == "s"
    assert first["rose_by"] == pytest.approx(0.15) and first["fell_by"] == pytest.approx(0.15)


def test_every_ordered_pair_is_an_event():
    series = [(0, "s", {"a": 0.0, "b": 0.0, "c": 1.0, "d": 1.0}), (5, "s", {"a": 0.5, "b": 0.5, "c": 0.5, "d": 0.5})]
    assert {(e["rose"], e["fell"]) for e in seesaw_events(rows(series), 0.2)} == {
        ("a", "c"),
        ("a", "d"),
        ("b", "c"),
        ("b", "d"),
    }


def test_only_greedy_and_hijack_by_default_and_splits_separately():
    up_down = [(0, "s", {"a": 0.0, "b": 1.0}), (10, "s", {"a": 1.0, "b": 0.0})]
    data = (
        rows(up_down, "greedy", "heldout")
        + rows(up_down, "ft_hijack", "heldout_template")
        + rows(up_down, "tf_first", "heldout")
        + rows([(0, "s", {"a": 0.0, "b": 1.0}), (10, "s", {"a": 0.0, "b": 1.0})], "greedy", "heldout_template")
    )
    events = seesaw_events(data, 0.15)
    assert [(e["metric"], e["split"]) for e in events] == [("greedy", "heldout"), ("ft_hijack", "heldout_template")]
    assert [(e["metric"]) for e in seesaw_events(data, 0.15, metrics=["tf_first"])] == ["tf_first"]


def test_across_a_stage_boundary_with_a_repeated_evaluation():
    # stage b starts from a's weights: the runner records a's last evaluation again under b at the same step
    series = [
        (0, "a", {"x": 0.5, "y": 0.5}),
        (10, "a", {"x": 0.6, "y": 0.4}),
        (20, "a", {"x": 0.8, "y": 0.2}),
        (20, "b", {"x": 0.8, "y": 0.2}),
        (30, "b", {"x": 0.3, "y": 0.7}),
    ]
    events = seesaw_events(rows(series), 0.15)
    assert [(e["step_from"], e["stage_from"], e["step_to"], e["stage_to"], e["rose"], e["fell"]) for e in events] == [
        (10, "a", 20, "b", "x", "y"),  # the duplicate counts once, under the later stage
        (20, "b", 30, "b", "y", "x"),
    ]


def test_a_stage_that_restarts_from_other_weights_shows_the_jump():
    series = [
        (0, "a", {"x": 0.1, "y": 0.1}),
        (10, "a", {"x": 0.9, "y": 0.1}),
        (10, "b", {"x": 0.1, "y": 0.9}),  # b starts from the base model
        (20, "b", {"x": 0.1, "y": 0.9}),
    ]
    events = seesaw_events(list(reversed(rows(series))), 0.15)  # row order does not matter
    assert [(e["step_from"], e["stage_from"], e["step_to"], e["stage_to"], e["rose"], e["fell"]) for e in events] == [
        (10, "a", 10, "b", "y", "x")
    ]


def test_missing_and_nan_values_are_skipped():
    series = [(0, "s", {"a": 0.0, "b": 1.0, "c": 0.0}), (10, "s", {"a": float("nan"), "b": 0.0, "c": 1.0})]
    data = rows(series) + [
        {"step": 10, "stage": "s", "task": "d", "split": "heldout", "metric": "greedy", "value": 1.0}
    ]
    assert pairs(seesaw_events(data, 0.15)) == [(0, 10, "c", "b")]


def test_accepts_a_polars_frame():
    pl = pytest.importorskip("polars")
    series = [(0, "s", {"a": 0.0, "b": 1.0}), (10, "s", {"a": 1.0, "b": 0.0})]
    assert pairs(seesaw_events(pl.DataFrame(rows(series)), 0.5)) == [(0, 10, "a", "b")]


def test_format_events():
    series = [(0, "a", {"yesno": 0.5, "qa": 0.5}), (10, "b", {"yesno": 0.75, "qa": 0.25})]
    text = format_events(seesaw_events(rows(series), 0.15))
    assert text == "greedy/heldout  step 0→10 (a→b)  yesno ↑0.250  qa ↓0.250"
    assert format_events([]) == "no seesaw events"


# ---------------------------------------------------------------------------------------------------------------
# The paired rule: per-item outcomes, exact McNemar / paired permutation, one BH family per run
# ---------------------------------------------------------------------------------------------------------------


def item_rows(series, metric="greedy", split="heldout"):
    """``series``: [(step, stage, {task: [outcome per item]})] → rows with per-item ``outcomes``."""
    return [
        {"step": step, "stage": stage, "task": task, "split": split, "metric": metric, "outcomes": outcomes}
        for step, stage, values in series
        for task, outcomes in values.items()
    ]


def flips(n_items, ones_before, gained, lost):
    """(before, after) outcome lists: ``ones_before`` right items first; ``gained`` turn wrong → right, ``lost``
    right → wrong."""
    before = [1] * ones_before + [0] * (n_items - ones_before)
    after = list(before)
    for i in range(lost):
        after[i] = 0
    for i in range(gained):
        after[ones_before + i] = 1
    return before, after


def test_paired_event_carries_the_larger_adjusted_p_value():
    up_before, up_after = flips(40, 8, gained=16, lost=0)  # 0.2 → 0.6
    down_before, down_after = flips(40, 30, gained=1, lost=14)  # 0.75 → 0.425
    same = [1] * 20 + [0] * 20
    series = [
        (0, "s", {"a": up_before, "b": down_before, "c": same}),
        (10, "s", {"a": up_after, "b": down_after, "c": same}),
    ]
    tests = change_tests(item_rows(series))
    assert [(t["task"], t["n"], t["test"]) for t in tests] == [
        ("a", 40, "mcnemar"),
        ("b", 40, "mcnemar"),
        ("c", 40, "mcnemar"),
    ]
    raw = [binomtest(16, 16).pvalue, binomtest(1, 15).pvalue, 1.0]
    assert [t["p_raw"] for t in tests] == pytest.approx(raw)
    adjusted = false_discovery_control(raw, method="bh")
    events = paired_seesaw_events(item_rows(series), 0.15)
    assert [(e["rose"], e["fell"]) for e in events] == [("a", "b")]
    assert events[0]["rose_by"] == pytest.approx(0.4) and events[0]["fell_by"] == pytest.approx(0.325)
    assert events[0]["p_value"] == pytest.approx(max(adjusted[0], adjusted[1])) and events[0]["test"] == "mcnemar"
    assert format_events(events).endswith(f"p={events[0]['p_value']:.2g}")


def test_a_large_but_insignificant_swing_is_no_event_while_the_untested_rule_fires():
    series = [
        (0, "s", {"a": [1, 0, 0, 0, 0, 0, 0, 0], "b": [1, 1, 1, 0, 0, 0, 0, 0]}),
        (10, "s", {"a": [1, 1, 1, 0, 0, 0, 0, 0], "b": [1, 0, 0, 0, 0, 0, 0, 0]}),
    ]  # ±0.25 on 8 items
    data = item_rows(series)
    for row in data:
        row["value"] = sum(row["outcomes"]) / len(row["outcomes"])
    assert pairs(seesaw_events(data, 0.15)) == [(0, 10, "a", "b")]
    assert paired_seesaw_events(data, 0.15) == []


def test_every_test_of_the_run_is_one_false_discovery_family():
    up_before, up_after = flips(30, 5, gained=9, lost=0)  # p = 2 / 2^9 ≈ 0.0039
    down_before, down_after = flips(30, 25, gained=0, lost=9)
    series = [(0, "s", {"a": up_before, "b": down_before}), (10, "s", {"a": up_after, "b": down_after})]
    assert len(paired_seesaw_events(item_rows(series), 0.15)) == 1
    # the same swing among 42 more tests that found nothing: BH multiplies its p-value by 44 / 2, to ≈ 0.086
    quiet = [1] * 15 + [0] * 15
    crowded = [(step, stage, {**values, **{f"q{i}": quiet for i in range(20)}}) for step, stage, values in series]
    crowded.append((20, "s", {**{"a": up_after, "b": down_after}, **{f"q{i}": quiet for i in range(20)}}))
    assert len(change_tests(item_rows(crowded))) == 44
    assert paired_seesaw_events(item_rows(crowded), 0.15) == []
    assert len(paired_seesaw_events(item_rows(crowded), 0.15, alpha=0.1)) == 1


def test_significant_changes_below_delta_are_no_event():
    up_before, up_after = flips(400, 100, gained=40, lost=0)  # +0.10, p ≈ 1e-12
    down_before, down_after = flips(400, 300, gained=0, lost=40)
    series = [(0, "s", {"a": up_before, "b": down_before}), (10, "s", {"a": up_after, "b": down_after})]
    assert all(t["p_raw"] < 1e-6 for t in change_tests(item_rows(series)))
    assert paired_seesaw_events(item_rows(series), 0.15) == []
    assert len(paired_seesaw_events(item_rows(series), 0.1)) == 1


def test_items_pair_by_key_and_missing_items_are_left_out():
    before = {f"i{k}": 0.0 for k in range(20)}
    after = {f"i{k}": 1.0 for k in range(20) if k % 2 == 0}  # only the even items were evaluated again
    after["new"] = 1.0
    before["i0"] = float("nan")
    series = [(0, "s", {"a": before}), (10, "s", {"a": after})]
    (test,) = change_tests(item_rows(series))
    assert test["n"] == 9 and test["change"] == pytest.approx(1.0)
    assert test["p_raw"] == pytest.approx(binomtest(9, 9).pvalue)


def test_non_proportion_metrics_use_the_paired_permutation_test():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.1, 0.5, size=40)
    series = [
        (0, "s", {"a": base.tolist(), "b": (base + 0.5).tolist()}),
        (10, "s", {"a": (base + 0.4).tolist(), "b": (base + 0.1).tolist()}),
    ]
    tests = change_tests(item_rows(series, metric="ft_mrr"), ["ft_mrr"])
    assert [t["test"] for t in tests] == ["permutation", "permutation"]
    assert tests == change_tests(item_rows(series, metric="ft_mrr"), ["ft_mrr"])  # seeded
    events = paired_seesaw_events(item_rows(series, metric="ft_mrr"), 0.15, ["ft_mrr"])
    assert [(e["rose"], e["fell"], e["test"]) for e in events] == [("a", "b", "permutation")]


def test_paired_rule_merges_a_repeated_evaluation_at_a_stage_boundary():
    low, high = [0] * 30 + [1] * 10, [1] * 30 + [0] * 10
    series = [
        (0, "a", {"x": low, "y": high}),
        (10, "a", {"x": high, "y": low}),
        (10, "b", {"x": high, "y": low}),
        (20, "b", {"x": low, "y": high}),
    ]
    events = paired_seesaw_events(item_rows(series), 0.15)
    assert [(e["step_from"], e["stage_from"], e["step_to"], e["stage_to"], e["rose"]) for e in events] == [
        (0, "a", 10, "b", "x"),
        (10, "b", 20, "b", "y"),
    ]


def test_rows_without_outcomes_are_an_error_for_the_paired_rule():
    with pytest.raises(ValueError, match="outcomes"):
        paired_seesaw_events(rows([(0, "s", {"a": 0.5}), (10, "s", {"a": 0.9})]), 0.15)
