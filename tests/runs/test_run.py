"""End-to-end runs: the micro config as written, stage init chains, determinism, the pretraining cache."""

from __future__ import annotations

import json

import polars as pl
import pytest
import yaml

from harness.config import validate_data
from harness.core.store import read_metrics
from harness.runs.execution.runner import run_experiment


def test_micro_run_writes_resolved_config_and_store(micro_run):
    resolved = yaml.safe_load((micro_run / "config.resolved.yaml").read_text())
    assert resolved["name"] == "micro" and len(resolved["stages"]) == 3
    assert resolved["stages"][2]["optim"]["lr"] == 1e-3
    store = read_metrics(micro_run)
    assert list(store.columns)[:8] == ["run_id", "stage", "step", "task", "split", "metric", "value", "time"]
    exp = validate_data(resolved)
    for stage in exp.resolved_stages():
        losses = store.filter(
            (pl.col("stage") == stage.name)
            & (pl.col("metric") == "loss")
            & (pl.col("split") == "train")
            & pl.col("task").is_not_null()
        )
        assert set(losses["task"].unique()) == set(stage.mixture.tasks), stage.name
        assert losses["value"].is_finite().all()
    run_level = store.filter(pl.col("task").is_null() & (pl.col("split") == "train"))
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "pad_fraction", "update_ratio", "batch_task_share_max"} <= set(
        run_level["metric"]
    )
    # Batches are random by default (train.length_grouping: 1), so they pad (low padding with grouping on is
    # asserted in test_speed_structure); a batch's largest task share is at least 1/(its tasks) and at most 1.
    assert run_level.filter(pl.col("metric") == "pad_fraction")["value"].is_between(0.0, 0.5).all()
    shares = store.filter(pl.col("metric") == "batch_task_share_max")
    for stage in exp.resolved_stages():
        values = shares.filter(pl.col("stage") == stage.name)["value"]
        assert values.is_between(1 / len(stage.mixture.tasks), 1.0).all(), stage.name


def test_micro_run_logs_effective_composition_and_checkpoints(micro_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    summary = json.loads((micro_run / "summary.json").read_text())
    short = next(s for s in summary["stages"] if s["name"] == "short")
    comp = short["composition"]
    assert set(comp) == {"repeat", "identity", "yesno", "math"}
    assert sum(c["examples"] for c in comp.values()) == 40 * 16
    assert abs(comp["yesno"]["share"] - 0.4) < 0.1
    for stage in ("repeat_only", "short", "assistant"):
        ckpt = micro_run / "checkpoints" / stage
        assert (ckpt / "model.safetensors").exists()
        tok = AutoTokenizer.from_pretrained(ckpt)
        text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
        assert text.endswith("<|im_start|>assistant\n")
    AutoModelForCausalLM.from_pretrained(micro_run / "checkpoints" / "assistant")


def _run(tiny, tmp_path, name="run"):
    exp = validate_data(tiny)
    return run_experiment(exp, tmp_path / name)


def _eval_rows(run_dir, stage, step):
    store = read_metrics(run_dir)
    rows = store.filter(
        (pl.col("stage") == stage)
        & (pl.col("step") == step)
        & (pl.col("split") == "heldout")
        & (pl.col("metric").is_in(["tf_first", "eval_loss", "ft_rank_mean"]))
    )
    return {(r["task"], r["metric"]): r["value"] for r in rows.iter_rows(named=True)}


def test_stage_init_chain(tiny, tmp_path):
    tiny["stages"] = [
        {"name": "a", "steps": 4, "mixture": {"repeat": 1.0}},
        {"name": "b", "steps": 4, "init": "previous", "mixture": {"yesno": 1.0}},
        {"name": "c", "steps": 4, "init": "a", "mixture": {"math": 1.0}},
        {"name": "d", "steps": 4, "init": "base", "mixture": {"math": 1.0}},
    ]
    tiny["eval"]["every"] = 100
    run_dir = _run(tiny, tmp_path).run_dir
    start_a, end_a, end_b = _eval_rows(run_dir, "a", 0), _eval_rows(run_dir, "a", 4), _eval_rows(run_dir, "b", 8)
    assert start_a and end_a != start_a
    assert _eval_rows(run_dir, "b", 4) == end_a, "previous: b starts where a ended"
    assert _eval_rows(run_dir, "c", 8) == end_a != end_b, "c starts from a's end, not b's"
    assert _eval_rows(run_dir, "d", 12) == start_a, "base: d starts from the base model"


def test_same_config_and_seed_give_same_metrics(tiny, tmp_path):
    a = read_metrics(_run(tiny, tmp_path, "a").run_dir)
    b = read_metrics(_run(tiny, tmp_path, "b").run_dir)
    cols = ["stage", "step", "task", "split", "metric", "value"]
    volatile = ["tokens_per_s"]
    a, b = (f.filter(~pl.col("metric").is_in(volatile)).select(cols) for f in (a, b))
    assert a.equals(b)


def test_pretraining_cache_hit_on_second_run(tiny, tmp_path):
    tiny["model"]["pretrain"]["steps"] = 6  # a base no other test pretrains
    first = _run(tiny, tmp_path, "first").summary["base"]
    second = _run(tiny, tmp_path, "second").summary["base"]
    assert first["cache_hit"] is False and second["cache_hit"] is True
    assert first["cache_dir"] == second["cache_dir"]
    assert second["pretrain_final_loss"] == pytest.approx(first["pretrain_final_loss"])
    tiny["model"]["pretrain"]["lr"] = 1e-3  # anything that shapes the base changes the key
    assert _run(tiny, tmp_path, "third").summary["base"]["cache_hit"] is False


CONTRACT = [
    "greedy",
    "mode_ok",
    "tf_first",
    "tf_exact",
    "eval_loss",
    "ft_rank_mean",
    "ft_rank_median",
    "ft_mrr",
    "ft_hijack",
    "ft_top1",
]


def test_micro_store_has_every_contract_metric_at_every_evaluation(micro_run):
    store = read_metrics(micro_run)
    evals = store.filter(pl.col("metric").is_in(CONTRACT))
    steps = sorted(evals["step"].unique())
    # every eval.every (20) steps and both edges of every stage (0, 40, 80, 140)
    assert steps == [0, 20, 40, 60, 80, 100, 120, 140]
    tasks = {"repeat", "identity", "yesno", "assistant_qa", "math"}
    for step in steps:
        at = evals.filter(pl.col("step") == step)
        got = {(r["task"], r["split"], r["metric"]) for r in at.iter_rows(named=True)}
        want = {(t, s, m) for t in tasks for s in ("heldout", "heldout_template") for m in CONTRACT}
        assert got == want, f"step {step}: missing {sorted(want - got)[:5]}"
    top1 = evals.filter(pl.col("metric") == "ft_top1")["text"].to_list()
    assert all(json.loads(t) for t in top1), "ft_top1 carries its table as JSON"
    ranks = evals.filter(pl.col("metric") == "ft_rank_mean")["value"]
    assert (ranks >= 1).all()


def test_micro_wandb_offline_run_holds_the_store_values(micro_run):
    from harness.runs.execution.tracking import wandb_key
    from tests.wandb_records import history

    logged: dict[tuple[int, str], float] = {}
    for record in history(micro_run):
        for key, value in record.items():
            if not key.startswith("_") and isinstance(value, (int, float)):
                logged[(record["_step"], key)] = value
    store = read_metrics(micro_run)
    compared = 0
    for r in store.iter_rows(named=True):
        if r["metric"] == "seesaw":
            continue
        key = (r["step"], wandb_key(r["metric"], r["split"], r["task"]))
        assert key in logged, f"{key} not in the wandb run"
        assert logged[key] == r["value"], key
        compared += 1
    assert compared > 1000


def test_micro_samples_summary_and_console(micro_run):
    samples = [json.loads(line) for line in (micro_run / "samples.jsonl").read_text().splitlines()]
    assert {
        "stage",
        "step",
        "task",
        "split",
        "prompt",
        "gold",
        "pred",
        "correct",
        "gold_first_id",
        "gold_first_rank",
        "top5",
    } <= set(samples[0])
    assert samples[0]["prompt"].startswith("<|im_start|>user\n") and samples[0]["prompt"].endswith("assistant\n")
    assert len(samples[0]["top5"]) == 5
    summary = json.loads((micro_run / "summary.json").read_text())
    final = summary["stages"][-1]["metrics"]["heldout"]
    assert set(final) == {"repeat", "identity", "yesno", "assistant_qa", "math"}
    assert set(CONTRACT) <= set(final["yesno"])
    assert "seesaw_events" in summary
    console = (micro_run / "console.txt").read_text()
    assert "stage-end metrics (heldout)" in console and ("seesaw events" in console or "no seesaw events" in console)


def test_eval_command_reproduces_the_stage_end_metrics(micro_run, tmp_path):
    from tests.conftest import MICRO, run_cli

    out = tmp_path / "eval"
    result = run_cli(
        "eval",
        str(micro_run / "checkpoints" / "assistant"),
        "--experiment",
        str(MICRO),
        "--out",
        str(out),
        "--set",
        "tracking.wandb.mode=disabled",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    again = read_metrics(out).filter(pl.col("metric").is_in(CONTRACT))
    original = read_metrics(micro_run).filter(pl.col("metric").is_in(CONTRACT), pl.col("step") == 140)
    cols = ["task", "split", "metric", "value"]
    assert again.select(cols).sort(cols[:3]).equals(original.select(cols).sort(cols[:3]))
    assert (out / "samples.jsonl").exists() and (out / "summary.json").exists()
