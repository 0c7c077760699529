"""Seed groups: ``--seeds`` / ``seeds:`` validation, a 2-seed group run and its report (across-seed intervals,
events that recur across seeds)."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest

from analysis.group import _across, final_scores, is_group_dir, recurring_events
from analysis.loading import load_samples
from analysis.report import write_report
from harness.config import ConfigError, validate_data
from harness.core.metrics import GROUP_FILE
from harness.core.stats import wilson_interval
from harness.studies.replicates import SeedsError, parse_seeds, replicate
from tests.conftest import invoke, run_cli, write_yaml


def test_parse_seeds_accepts_a_list_and_names_what_is_wrong():
    assert parse_seeds("0, 1,2") == [0, 1, 2]
    with pytest.raises(SeedsError, match=r"'x' is not a non-negative integer"):
        parse_seeds("0,x")
    with pytest.raises(SeedsError, match=r"'-1' is not a non-negative integer"):
        parse_seeds("-1,2")
    with pytest.raises(SeedsError, match=r"seed\(s\) 1 given more than once"):
        parse_seeds("1,2,1")


def test_seeds_in_the_file_are_validated(tiny):
    tiny["seeds"] = [3, 3]
    with pytest.raises(ConfigError, match=r"seeds.*given more than once"):
        validate_data(tiny)
    tiny["seeds"] = []
    with pytest.raises(ConfigError, match=r"seeds"):
        validate_data(tiny)


def test_a_replicate_changes_the_seed_and_pins_the_task_data(tiny):
    tiny["seeds"] = [5, 6]
    exp = validate_data(tiny)
    rep = replicate(exp, 6)
    assert (rep.seed, rep.seeds, rep.data_seed) == (6, None, tiny["seed"])


def test_cli_rejects_bad_seeds_and_seeds_with_resume(tiny, tmp_path):
    path = write_yaml(tmp_path / "t.yaml", tiny)
    # In process (typer's runner): refused before any work, so no subprocess start-up is needed for the exit code.
    bad = invoke("run", str(path), "--seeds", "0,zero", "--out", str(tmp_path / "g"))
    assert bad.exit_code == 2 and "'zero' is not a non-negative integer" in bad.stderr
    resumed = invoke("run", str(path), "--seeds", "0,1", "--resume", str(tmp_path / "g"))
    assert resumed.exit_code == 2 and "--resume continues one run" in resumed.stderr
    assert not (tmp_path / "g").exists()


def test_two_seed_group_runs_and_reports_across_seed_intervals(tiny, tmp_path):
    tiny["stages"] = [
        {"name": "a", "steps": 4, "mixture": {"repeat": 1.0}},
        {"name": "b", "steps": 4, "mixture": {"repeat": 0.5, "yesno": 0.5}},
    ]
    group = tmp_path / "group"
    result = run_cli(
        "run", str(write_yaml(tmp_path / "t.yaml", tiny)), "--seeds", "1,2", "--jobs", "2", "--out", str(group)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert is_group_dir(group)
    marker = json.loads((group / GROUP_FILE).read_text())
    assert marker["seeds"] == [1, 2] and marker["status"] == {"1": "done", "2": "done"}
    configs = [(group / f"seed-{s}" / "config.resolved.yaml").read_text() for s in (1, 2)]
    assert "seed: 1\n" in configs[0] and "seed: 2\n" in configs[1]
    assert all(f"data_seed: {tiny['seed']}\n" in c for c in configs)
    # same eval items in both replicates (the task data is pinned), different models (the seed is not)
    samples = [load_samples(group / f"seed-{s}") for s in (1, 2)]
    assert samples[0]["prompt"].to_list() == samples[1]["prompt"].to_list()
    assert samples[0]["top5"].to_list() != samples[1]["top5"].to_list()

    scores = final_scores(group, "tf_first")
    assert set(scores["task"]) == {"repeat", "yesno", "math"} and (scores["seeds"] == 2).all()
    assert (scores["n"] == 4).all()
    for r in scores.iter_rows(named=True):
        a, b = (float(v.split(": ")[1]) for v in r["values"].split(", "))
        assert r["mean"] == pytest.approx((a + b) / 2, abs=1e-3)
        assert r["across"] == "seeds × items", "tf_first's per-item outcomes are in samples.jsonl"
        assert 0.0 <= r["across_low"] <= r["mean"] <= r["across_high"] <= 1.0
        assert r["across_high"] > r["across_low"], "never zero-width (the items vary, or Wilson's when none do)"
        assert r["within_low"] <= r["mean"] <= r["within_high"]
    # each score next to its eval pool's baseline, and the seeds significantly above it counted
    summary = json.loads((group / "seed-1" / "summary.json").read_text())
    for r in scores.iter_rows(named=True):
        stored = [b["value"] for b in summary["baselines"][r["split"]][r["task"]] if b["metric"] == "tf_first"]
        assert r["baseline"] == pytest.approx(max(stored))
        k, total = map(int, r["above_in"].split("/"))
        values = [float(v.split(": ")[1]) for v in r["values"].split(", ")]
        assert total == 2 and k <= sum(v > r["baseline"] for v in values)
    html = write_report(group, metric="tf_first").read_text()
    assert "95% across seeds" in html and "95% one run (Wilson)" in html and "recurs_in" in html
    assert "above baseline in" in html


def test_across_seed_intervals_one_seed_agreeing_seeds_and_rates_only():
    """One seed: no interval (it was [0, 1]: NaN clipped); seeds agreeing on 0/n: the items' Wilson interval (it
    was [0, 0]); rates outside [0, 1] never; runs without per-item outcomes: from the rates."""
    one, how = _across("greedy", {0: 0.25}, {0: {0: 1.0, 1: 0.0, 2: 0.0, 3: 0.0}}, 4)
    assert how == "none: one seed" and math.isnan(one.low) and math.isnan(one.high)
    zeros = {s: {i: 0.0 for i in range(64)} for s in range(3)}
    agree, how = _across("greedy", {0: 0.0, 1: 0.0, 2: 0.0}, zeros, 64)
    assert how == "seeds × items" and (agree.low, agree.high) == pytest.approx(wilson_interval(0, 64)[1:3])
    spread, how = _across("greedy", {0: 0.05, 1: 0.5, 2: 0.95}, {}, 20)
    assert how == "seeds × items (from rates)" and 0.0 <= spread.low < spread.high <= 1.0
    ranks, how = _across("ft_rank_mean", {0: 2.0, 1: 4.0}, {}, 20)
    assert how == "t over seeds" and ranks.low < 3.0 < ranks.high


def test_a_loss_target_with_per_item_values_gets_an_uncut_seeds_by_items_interval():
    """eval_loss is declared continuous: its stored per-item values give a crossed interval on their own scale
    (nats, not cut at [0, 1]) that counts the items' draw too, which a t over the seeds' values leaves out."""
    rng = np.random.default_rng(0)
    difficulty = rng.normal(2.0, 0.8, 64)  # every seed scores the same items
    items = {s: {i: float(difficulty[i] + 0.02 * s + rng.normal(0, 0.05)) for i in range(64)} for s in range(3)}
    values = {s: sum(v.values()) / 64 for s, v in items.items()}
    loss, how = _across("eval_loss", values, items, 64)
    assert how == "seeds × items (real values)" and loss.n == 64 and loss.high > 1.0  # not cut at 1
    assert loss.low < sum(values.values()) / 3 < loss.high
    t_only, how = _across("eval_loss", values, {}, 64)  # no per-item values: t over the seeds only
    assert how == "t over seeds" and loss.high - loss.low > 1.5 * (t_only.high - t_only.low)


def _fake_group(tmp_path, events_per_seed):
    group = tmp_path / "fake"
    (group).mkdir()
    seeds = list(range(len(events_per_seed)))
    (group / GROUP_FILE).write_text(
        json.dumps(
            {
                "kind": "seeds",
                "experiment": "x",
                "seeds": seeds,
                "data_seed": 0,
                "replicates": {str(s): f"seed-{s}" for s in seeds},
                "status": {str(s): "done" for s in seeds},
            }
        )
    )
    for s, events in zip(seeds, events_per_seed):
        (group / f"seed-{s}").mkdir()
        (group / f"seed-{s}" / "summary.json").write_text(json.dumps({"stages": [], "seesaw_events": events}))
    return group


def _event(rose, fell, stage_from="a", stage_to="b", split="heldout", metric="greedy", p=None):
    return {
        "metric": metric,
        "split": split,
        "stage_from": stage_from,
        "stage_to": stage_to,
        "rose": rose,
        "fell": fell,
        "rose_by": 0.3,
        "fell_by": 0.2,
        **({"p_value": p} if p is not None else {}),
    }


def test_events_recurring_across_seeds_are_counted(tmp_path):
    group = _fake_group(
        tmp_path,
        [
            [_event("yesno", "qa", p=0.01), _event("math", "repeat")],
            [_event("yesno", "qa", metric="tf_first", p=0.03)],
            [_event("yesno", "qa", stage_from="b", stage_to="b"), _event("qa", "yesno")],
        ],
    )
    events = recurring_events(group)
    first = events.row(0, named=True)
    assert (first["rose"], first["fell"], first["stages"], first["recurs_in"]) == ("yesno", "qa", "a→b", "2/3")
    assert first["seeds"] == "0, 1" and first["metrics"] == "greedy, tf_first" and first["max_p_value"] == 0.03
    assert sorted(events.filter(pl.col("k") == 1)["recurs_in"].to_list()) == ["1/3"] * 3
    assert events.filter((pl.col("rose") == "yesno") & (pl.col("stages") == "b"))["recurs_in"].item() == "1/3"
