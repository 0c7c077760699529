"""Seesaw events on synthetic metric series with known answers."""

from __future__ import annotations

import pytest

from harness.evaluation.seesaw import format_events, seesaw_events


def rows(series, metric="greedy", split="heldout"):
    """``series``: [(step, stage, {task: value})] → long rows."""
    return [{"step": step, "stage": stage, "task": task, "split": split, "metric": metric, "value": value}
            for step, stage, values in series for task, value in values.items()]


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
        ("a", "c"), ("a", "d"), ("b", "c"), ("b", "d")}


def test_only_greedy_and_hijack_by_default_and_splits_separately():
    up_down = [(0, "s", {"a": 0.0, "b": 1.0}), (10, "s", {"a": 1.0, "b": 0.0})]
    data = (rows(up_down, "greedy", "heldout") + rows(up_down, "ft_hijack", "heldout_template")
            + rows(up_down, "tf_first", "heldout")
            + rows([(0, "s", {"a": 0.0, "b": 1.0}), (10, "s", {"a": 0.0, "b": 1.0})], "greedy", "heldout_template"))
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
        (10, "a", 10, "b", "y", "x")]


def test_missing_and_nan_values_are_skipped():
    series = [(0, "s", {"a": 0.0, "b": 1.0, "c": 0.0}), (10, "s", {"a": float("nan"), "b": 0.0, "c": 1.0})]
    data = rows(series) + [{"step": 10, "stage": "s", "task": "d", "split": "heldout", "metric": "greedy",
                            "value": 1.0}]
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
