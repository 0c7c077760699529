"""The loss pool (``eval.loss_items``): a bigger held-out draw per task, scored teacher-forced only at the end of every
stage, as split ``loss_<split>``, without touching the run's training pool or greedy eval pool."""

from __future__ import annotations

import json

import polars as pl
import pytest

from data_recipes.split_check import prompt_digest
from harness.config import load_experiment
from harness.core.store import read_metrics
from harness.runs.execution.runner import run_experiment
from harness.runs.planning.prepare import build_task_data
from tests.conftest import write_yaml


def test_the_loss_pool_is_a_bigger_held_out_draw_that_leaves_the_run_s_pools_alone(tiny, tmp_path):
    plain = load_experiment(write_yaml(tmp_path / "plain.yaml", tiny))
    tiny["eval"]["loss_items"] = 24
    pooled = load_experiment(write_yaml(tmp_path / "pooled.yaml", tiny))
    a, b = build_task_data(plain), build_task_data(pooled)
    assert a.splits == b.splits and not a.loss_splits  # training and greedy pools are the ones they were
    for task, pools in b.loss_splits.items():
        assert set(pools) == {"loss_heldout"}  # tiny evaluates heldout only
        assert len(pools["loss_heldout"]) + b.loss_dropped.get(task, 0) == 24
        trained = {prompt_digest(ex) for ex in b.splits[task]["train"]}
        assert not trained & {prompt_digest(ex) for ex in pools["loss_heldout"]}


@pytest.mark.slow  # a tiny two-stage run: ~14 s on 2 cores
def test_a_run_records_the_loss_targets_of_the_pool_at_each_stage_end(tiny, tmp_path):
    tiny["eval"]["loss_items"] = 24
    tiny["train"]["stage_cache"] = False
    exp = load_experiment(write_yaml(tmp_path / "x.yaml", tiny))
    sent: list[tuple[str, int, str]] = []
    result = run_experiment(
        exp, tmp_path / "run", on_evaluation=lambda stage, step, rows: sent.extend((stage, step, r.split) for r in rows)
    )
    assert ("b", 8, "loss_heldout") in sent  # a sweep's trial table gets the last stage's loss targets too
    rows = read_metrics(tmp_path / "run").filter(pl.col("split") == "loss_heldout")
    assert set(rows["metric"]) == {"eval_loss", "gold_logprob"}  # teacher-forced targets only, no decoding
    assert sorted(set(zip(rows["stage"], rows["step"]))) == [("a", 4), ("b", 4), ("b", 8)]  # b's start repeats a's
    end = result.summary["stages"][-1]["metrics"]
    assert set(end["loss_heldout"]) == {"repeat", "yesno", "math"} and set(end["heldout"]["repeat"]) > {"greedy"}
    assert end["loss_heldout"]["repeat"]["eval_loss"] > 0 > end["loss_heldout"]["repeat"]["gold_logprob"]
    samples = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    pool = [s for s in samples if s["split"] == "loss_heldout" and s["stage"] == "b" and s["step"] == 8]
    assert pool and all(s["pred"] is None and set(s["outcomes"]) >= {"eval_loss", "gold_logprob"} for s in pool)
    mean = sum(s["outcomes"]["eval_loss"] for s in pool if s["task"] == "repeat") / 24
    assert abs(mean - end["loss_heldout"]["repeat"]["eval_loss"]) < 1e-6  # per-item values reproduce the row
