"""The measurement evidence wired into a run: n and Wilson intervals on every proportion row, baselines at run start,
the paired seesaw's events with p-values (and the untested rule on request), what the console and the report show,
and stores from before the interval columns."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import analysis as A
from analysis.evidence import stored_seesaw_events
from harness.config import EvalSpec
from harness.core.metrics import PROPORTION_METRICS
from harness.core.seesaw_sim import Schedule, simulate_outcomes
from harness.core.seesaw_sim import outcome_rows as simulated_rows
from harness.core.stats import wilson_interval
from harness.core.store import MetricsStore, Row, read_metrics
from harness.evaluation.evidence import outcome_rows, run_seesaw, seesaw_rows
from tests.conftest import run_cli, write_yaml


def test_micro_store_rows_carry_n_and_an_interval_holding_the_value(micro_run):
    store = read_metrics(micro_run)
    samples = [json.loads(line) for line in (micro_run / "samples.jsonl").read_text().splitlines()]
    first_step = samples[0]["step"]
    pool = Counter(
        (s["task"], s["split"]) for s in samples if s["step"] == first_step and s["stage"] == samples[0]["stage"]
    )
    proportions = store.filter(pl.col("metric").is_in(sorted(PROPORTION_METRICS)), pl.col("task").is_not_null())
    assert proportions.height and proportions["n"].null_count() == 0
    assert (proportions["ci_low"] <= proportions["value"] + 1e-12).all()
    assert (proportions["value"] <= proportions["ci_high"] + 1e-12).all()
    for r in proportions.iter_rows(named=True):
        assert r["n"] == pool[(r["task"], r["split"])]
    # the interval is the Wilson interval of value·n successes out of n
    r = proportions.row(-1, named=True)
    ci = wilson_interval(round(r["value"] * r["n"]), r["n"])
    assert (r["ci_low"], r["ci_high"]) == pytest.approx((ci.low, ci.high))
    others = store.filter(pl.col("metric").is_in(["eval_loss", "ft_rank_mean", "ft_top1"]))
    assert (
        others.height and others["n"].null_count() == others.height and others["ci_low"].null_count() == others.height
    )
    assert (
        "ft_nonfinite" in set(proportions["metric"])
        and proportions.filter(pl.col("metric") == "ft_nonfinite")["value"].max() == 0.0
    )


def test_micro_summary_has_baselines_intervals_and_the_seesaw_rule(micro_run):
    summary = json.loads((micro_run / "summary.json").read_text())
    identity = {(b["metric"], b["kind"]): b for b in summary["baselines"]["heldout"]["identity"]}
    assert identity[("greedy", "constant_answer")]["value"] == 1.0  # one gold answer: a constant scores 1.0
    yesno = {(b["metric"], b["kind"]): b["value"] for b in summary["baselines"]["heldout"]["yesno"]}
    assert yesno[("greedy", "chance")] == 0.5 and yesno[("greedy", "constant_answer")] >= 0.5
    ci = summary["stages"][-1]["intervals"]["heldout"]["yesno"]["greedy"]
    value = summary["stages"][-1]["metrics"]["heldout"]["yesno"]["greedy"]
    assert ci["ci_low"] <= value <= ci["ci_high"] and ci["n"] > 0
    assert summary["seesaw"]["test"] == "paired" and summary["seesaw"]["tests"] > 0
    store = read_metrics(micro_run)
    base = store.filter(pl.col("metric") == "baseline_greedy", pl.col("task") == "identity")
    assert base.height == 2 and set(base["value"]) == {1.0}  # heldout and heldout_template
    console = (micro_run / "console.txt").read_text()
    assert (
        re.search(r"^eval \w+@0 heldout \(greedy\): ", console, re.M) and "n=" in console and "paired tests" in console
    )


def _planted_outcomes(n: int = 80) -> list[dict]:
    """Two evaluations of two tasks on n items: task a goes 0→1 on every item, task b 1→0."""
    samples = []
    for step, (a, b) in ((0, (0, 1)), (10, (1, 0))):
        for i in range(n):
            samples += [
                {"stage": "s", "step": step, "task": "a", "split": "heldout", "index": i, "outcomes": {"greedy": a}},
                {"stage": "s", "step": step, "task": "b", "split": "heldout", "index": i, "outcomes": {"greedy": b}},
            ]
    return outcome_rows(samples)


def test_seesaw_rows_carry_p_value_and_the_analysis_reads_them_back(tmp_path):
    events, n_tests = run_seesaw(
        _planted_outcomes(), [], test="paired", delta=0.15, alpha=0.05, seed=0, metrics=["greedy"]
    )
    assert n_tests == 2 and len(events) == 1 and events[0]["p_value"] < 1e-10
    store = MetricsStore(tmp_path, "r")
    store.log(seesaw_rows(events, n_tests, EvalSpec(), "s", 10))
    store.flush()
    frame = read_metrics(tmp_path)
    row = frame.filter(pl.col("metric") == "seesaw").row(0, named=True)
    assert json.loads(row["text"])["p_value"] == events[0]["p_value"]
    found = A.seesaw_events(frame)
    assert found.height == 1 and found["p_value"][0] == pytest.approx(events[0]["p_value"])
    assert stored_seesaw_events(frame, ["mode_ok"], None) is None  # a metric the run did not test: recomputed


def test_paired_rule_finds_nothing_where_outcomes_only_reshuffle():
    rng = np.random.default_rng(0)
    samples = []
    for step in range(0, 60, 10):  # two tasks at 0.5 whose items flip at random: no real change
        for task in ("a", "b"):
            for i, v in enumerate(rng.integers(0, 2, 24)):
                samples.append(
                    {
                        "stage": "s",
                        "step": step,
                        "task": task,
                        "split": "heldout",
                        "index": i,
                        "outcomes": {"greedy": int(v)},
                    }
                )
    events, n_tests = run_seesaw(
        outcome_rows(samples), [], test="paired", delta=0.15, alpha=0.05, seed=0, metrics=["greedy"]
    )
    assert n_tests == 10 and events == []


def _benchmark_history(planted: bool, seed: int = 3) -> list[dict]:
    """A run with hundreds of paired tests: 6 tasks × 3 splits of 200 items over 12 evaluations (the simulated
    null: 20 % of items churn, accuracy stationary), and a 200-document benchmark at the first and last evaluation.
    ``planted``: over that span the benchmark loses 70 documents (gaining none) while task t0 (split s0) rises by
    0.6; otherwise the benchmark churns like the tasks and nothing changes."""
    rng = np.random.default_rng(seed)
    schedule = Schedule(items=200, accuracy=0.3)
    outcomes = simulate_outcomes(schedule, rng)
    bench = np.zeros((2, 200), dtype=bool)
    bench[0, :140] = True
    if planted:
        first = outcomes[0, 0, 0]
        wrong = np.flatnonzero(~first)[:120]
        outcomes[-1, 0, 0] = first
        outcomes[-1, 0, 0, wrong] = True  # t0/s0 at the last evaluation: its first outcomes, 120 more right
        bench[1, 70:140] = True  # 70 of the 140 right documents turn wrong, none the other way
    else:
        bench[1] = bench[0] ^ (rng.random(200) < 0.2)
    rows = simulated_rows(outcomes)
    last = rows[-1]["step"]
    for k, step in enumerate((0, last)):
        rows.append(
            {"step": step, "stage": "sim", "task": "bench:world_mc", "split": "bench", "metric": "acc",
             "outcomes": bench[k].astype(float).tolist()}
        )  # fmt: skip
    return rows


@pytest.mark.parametrize("planted", [True, False])
def test_a_benchmark_falling_while_a_task_rises_is_an_event_and_a_null_benchmark_is_not(planted):
    """The benchmark family's 0/1 per-document outcomes get the exact McNemar test, like any 0/1 outcomes: a
    resampled test's p-value cannot fall below ~1/resamples, which Benjamini–Hochberg over hundreds of tests never
    lets through."""
    events, n_tests = run_seesaw(_benchmark_history(planted), [], test="paired", delta=0.15, alpha=0.05, seed=0)
    bench = [e for e in events if e["metric"] == "bench_vs_greedy"]
    assert n_tests > 200
    if planted:
        assert [(e["rose"], e["fell"], e["test"]) for e in bench] == [("t0/s0", "bench:world_mc/acc", "mcnemar")]
        assert bench[0]["p_value"] < 1e-10 and bench[0]["fell_by"] == pytest.approx(0.35)
    else:
        assert bench == []


def test_run_with_untested_seesaw_rule(tiny, tmp_path):
    tiny["eval"]["seesaw_test"] = "none"
    out = tmp_path / "run"
    result = run_cli("run", str(write_yaml(tmp_path / "t.yaml", tiny)), "--out", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seesaw"] == {"test": "none", "alpha": 0.05, "delta": 0.15, "tests": 0}
    assert all("p_value" not in e for e in summary["seesaw_events"])
    marker = read_metrics(out).filter(pl.col("metric") == "seesaw_tests")
    assert json.loads(marker["text"][0])["test"] == "none"


def test_bad_seesaw_settings_are_config_errors(tiny, tmp_path):
    tiny["eval"]["seesaw_alpha"] = 1.5
    result = run_cli("validate", str(write_yaml(tmp_path / "t.yaml", tiny)))
    assert result.returncode != 0 and "seesaw_alpha" in result.stderr + result.stdout


def test_report_shows_intervals_and_baselines(micro_run, tmp_path):
    html = A.write_report(micro_run, tmp_path / "report").read_text()
    assert "Against baselines" in html and "best constant answer" in html
    assert "class='ci'" in html and "significantly above" in html
    assert "paired test" in html


def _old_store(run_dir: Path) -> None:
    """A store as written before n / ci_low / ci_high existed."""
    run_dir.mkdir()
    pl.DataFrame(
        {
            "run_id": ["old"] * 2,
            "stage": ["s"] * 2,
            "step": [0, 10],
            "task": ["yesno"] * 2,
            "split": ["heldout"] * 2,
            "metric": ["greedy"] * 2,
            "value": [0.5, 0.75],
            "time": [0.0, 1.0],
            "text": [None, None],
        }
    ).write_parquet(run_dir / "metrics.parquet")


def test_old_store_without_interval_columns_loads(tmp_path):
    run_dir = tmp_path / "old"
    _old_store(run_dir)
    for frame in (A.load_run(run_dir), A.load_runs([run_dir], config=False)):
        assert {"n", "ci_low", "ci_high"} <= set(frame.columns) and frame["n"].null_count() == 2
    assert A.stage_table(A.load_run(run_dir))["yesno"].to_list() == [0.75]
    assert A.baselines(A.load_run(run_dir)).is_empty()
    assert A.seesaw_events(A.load_run(run_dir))["test"].to_list() == []  # recomputed, untested: no 0.15 pair
    store = MetricsStore(run_dir, "old")  # a resumed run reads an old store too
    store.load_existing(lambda stage, step, metric: True)
    assert [r.n for r in store.rows()] == [None, None]
    store.log([Row("s", 20, "yesno", "heldout", "greedy", 1.0, n=4, ci_low=0.5, ci_high=1.0)])
    store.flush()
    assert read_metrics(run_dir)["n"].to_list() == [None, None, 4]
