"""When training goes wrong: the non-finite guard, skip_step, sanity checks, exact resume, bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import polars as pl
import pytest

from harness.config import validate_data
from harness.core.store import read_metrics
from harness.data.task_data import DataError
from harness.runs.execution.runner import run_experiment
from tests.conftest import ROOT, invoke, run_cli, write_yaml


def test_forward_nan_is_caught_at_its_step_naming_the_module(tiny, tmp_path):
    tiny["train"]["checkpoint_every"] = 2
    tiny["debug"] = {"inject_nonfinite": {"step": 5, "where": "forward", "module": r"layers\.0\.mlp$"}}
    out = tmp_path / "run"
    result = run_cli("run", str(write_yaml(tmp_path / "x.yaml", tiny)), "--out", str(out))
    assert result.returncode == 3, result.stderr[-2000:]
    assert "step 5" in result.stderr and "model.layers.0.mlp" in result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads((out / "nonfinite.json").read_text())
    assert report["step"] == 5 and report["stage"] == "b" and report["what"] == "loss"
    assert report["first_module"] == "model.layers.0.mlp", "the first module in execution order"
    assert report["tasks"] and sum(report["tasks"].values()) == tiny["train"]["batch_size"]
    # the last good checkpoint is intact and loadable
    last = sorted((out / "checkpoints" / "resume").glob("step-*"))[-1]
    assert last.name == "step-00000004"
    from safetensors.torch import load_file

    assert load_file(last / "model.safetensors")
    store = read_metrics(out)
    assert store["step"].max() <= 4, "nothing from the failed step is stored"


def test_grad_nan_names_the_parameter(tiny, tmp_path):
    tiny["debug"] = {"inject_nonfinite": {"step": 2, "where": "grad", "module": r"layers\.0\.self_attn\.q_proj"}}
    with pytest.raises(Exception) as info:
        run_experiment(validate_data(tiny), tmp_path / "run")
    report = info.value.report
    assert report["what"] == "gradient" and report["step"] == 2
    assert report["first_module"] is None, "the forward pass was finite"
    assert report["nonfinite_grads"] == ["model.layers.0.self_attn.q_proj.weight"]
    assert (tmp_path / "run" / "nonfinite.json").exists()


def test_skip_step_counts_and_continues(tiny, tmp_path):
    tiny["train"]["nonfinite"] = "skip_step"
    tiny["debug"] = {"inject_nonfinite": {"step": 3, "repeat": 2, "where": "forward", "module": r"layers\.0\.mlp$"}}
    run_dir = run_experiment(validate_data(tiny), tmp_path / "run").run_dir
    store = read_metrics(run_dir)
    skips = store.filter(pl.col("metric") == "nonfinite_skip")
    assert skips["step"].to_list() == [3, 4]
    assert store.filter(pl.col("metric") == "skipped_steps")["value"].sum() == 2
    assert store.filter(pl.col("metric") == "loss", pl.col("task").is_null())["value"].is_finite().all()


def test_skip_step_stops_after_k_in_a_row(tiny, tmp_path):
    tiny["train"]["nonfinite"] = {"action": "skip_step", "max_consecutive": 2}
    tiny["debug"] = {"inject_nonfinite": {"step": 3, "repeat": 3, "where": "forward", "module": r"layers\.0\.mlp$"}}
    with pytest.raises(Exception) as info:
        run_experiment(validate_data(tiny), tmp_path / "run")
    assert info.value.report["step"] == 4 and info.value.report["consecutive_skips"] == 2


def test_health_metrics_per_module_group(tiny, tmp_path):
    store = read_metrics(run_experiment(validate_data(tiny), tmp_path / "run").run_dir)
    diag = set(store.filter(pl.col("metric").str.starts_with("diag/"))["metric"])
    for group in ("embed", "layers.0.attn", "layers.0.mlp", "norms"):
        assert f"diag/{group}/grad_norm" in diag and f"diag/{group}/update_ratio" in diag
    ratios = store.filter(pl.col("metric") == "update_ratio")["value"]
    assert (ratios > 0).all() and (ratios < 1).all()


# -- exact resume --------------------------------------------------------------------------------------------


def _resume_experiment(tiny):
    tiny["stages"] = [
        {"name": "a", "steps": 12, "mixture": {"repeat": 1.0}},
        {"name": "b", "steps": 24, "mixture": {"repeat": 0.5, "yesno": 0.3, "math": 0.2}},
    ]
    tiny["train"]["checkpoint_every"] = 3
    tiny["train"]["log_every"] = 4  # not a multiple of checkpoint_every: the window must resume mid-way
    tiny["eval"]["every"] = 5
    tiny["train"]["stage_cache"] = False  # the killed run must train its stages, not replay the reference's
    return tiny


def _comparable(frame: pl.DataFrame) -> pl.DataFrame:
    return (
        frame.filter(~pl.col("metric").is_in(["tokens_per_s"]))
        .select("stage", "step", "task", "split", "metric", "value", "text")
        .sort("step", "stage", "task", "split", "metric", nulls_last=True)
    )


def test_killed_run_resumes_to_identical_metrics(tiny, tmp_path):
    exp_file = write_yaml(tmp_path / "resume.yaml", _resume_experiment(tiny))
    reference = tmp_path / "reference"
    assert run_cli("run", str(exp_file), "--out", str(reference)).returncode == 0

    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(exp_file), "--out", str(killed)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ.copy(),
    )
    deadline = time.time() + 300
    target = killed / "checkpoints" / "resume" / "step-00000018"  # mid-way through stage b
    while not target.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert target.exists(), "the run never reached the checkpoint"
    assert not (killed / "summary.json").exists(), "killed before the end"

    resumed = run_cli("run", str(exp_file), "--resume", str(killed))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = _comparable(read_metrics(reference)), _comparable(read_metrics(killed))
    assert a.height == b.height, "no duplicated or missing rows"
    assert a.equals(b)
    keys = ["stage", "step", "task", "split", "metric"]
    assert b.filter(pl.struct(keys).is_duplicated()).height == 0

    def samples(d):
        rows = [json.loads(line) for line in (d / "samples.jsonl").read_text().splitlines()]
        return sorted((r["stage"], r["step"], r["task"], r["split"], r["prompt"], r["pred"]) for r in rows)

    assert samples(reference) == samples(killed)
    assert json.loads((killed / "summary.json").read_text())["resumed_from"].startswith("step-")


def test_resume_refuses_a_changed_experiment(tiny, tmp_path):
    """In process (the command, without a subprocess's start-up): neither run tests the process."""
    exp_file = write_yaml(tmp_path / "x.yaml", tiny)
    out = tmp_path / "run"
    finished = invoke("run", str(exp_file), "--out", str(out))
    assert finished.exit_code == 0, finished.output[-2000:]
    result = invoke("run", str(exp_file), "--resume", str(out), "--set", "train.optim.lr=0.1")
    assert result.exit_code == 2 and "differs from the run being resumed" in result.stderr


def _checked(exact: bool, calls: list):
    """A stand-in for the packing check that decides ``exact`` (and counts its calls)."""
    from harness.training.packing_check import PackingCheck

    def check(*args, **kwargs):
        calls.append(exact)
        return PackingCheck("qwen2", 0.0 if exact else 1.0, 1e-7, 1e-7, None if exact else "attention")

    return check


def _train_rows(run_dir, after: int) -> list:
    frame = read_metrics(run_dir).filter(
        (pl.col("step") > after) & pl.col("metric").is_in(["loss", "pad_fraction"]) & (pl.col("split") == "train")
    )
    return frame.select("step", "task", "metric", "value").sort("step", "task", "metric", nulls_last=True).rows()


def test_a_resumed_stage_trains_the_layout_it_began_with_without_checking_again(tiny, tmp_path, monkeypatch):
    """The packed/padded decision is in the resume point: resumed, the stage trains the layout it began with, where
    the check on the partly trained model would now decide the other way, and the check does not run again."""
    from harness.runs.execution import packing_decision

    tiny["stages"] = [{"name": "a", "steps": 6, "mixture": {"repeat": 0.5, "math": 0.5}}]
    tiny["train"].update(checkpoint_every=2, keep_checkpoints=5, log_every=1, stage_cache=False, packing="auto")
    tiny["eval"]["every"] = 6
    exp, calls = validate_data(tiny), []
    monkeypatch.setattr(packing_decision, "check_packing", _checked(True, calls))
    run_dir = run_experiment(exp, tmp_path / "run").run_dir
    uninterrupted = _train_rows(run_dir, after=4)
    assert any(metric == "pad_fraction" and value == 0.0 for _, _, metric, value in uninterrupted)  # packed
    *kept, end = sorted((run_dir / "checkpoints" / "resume").glob("step-*"))
    assert kept[-1].name == "step-00000004"
    shutil.rmtree(end)  # the run as killed after step 4's resume point
    (run_dir / "summary.json").unlink()

    monkeypatch.setattr(packing_decision, "check_packing", _checked(False, calls))  # asked now, it would pad
    run_experiment(exp, run_dir, resume=True)
    assert _train_rows(run_dir, after=4) == uninterrupted, "the resumed part trained another layout"
    assert calls == [True], "the check ran again on the partly trained model"
    assert json.loads((kept[-1] / "state.json").read_text())["packing"] == {
        "packed": True,
        "varlen": True,
        "factor": None,
    }


# -- sanity ---------------------------------------------------------------------------------------------------


@pytest.fixture
def sanity_experiment(tiny):
    tiny["model"]["config"] = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    return validate_data(tiny)


def test_overfit_check_passes_on_a_healthy_pipeline_and_fails_on_a_broken_one(sanity_experiment):
    from harness.checks.sanity import overfit_check

    healthy, *_ = overfit_check(sanity_experiment, n=8, threshold=0.9, max_steps=300, eval_every=20)
    assert healthy.passed, healthy.line()
    broken, *_ = overfit_check(sanity_experiment, n=8, threshold=0.9, max_steps=60, eval_every=30, corrupt_labels=True)
    assert not broken.passed and broken.value < 0.5


def test_inputs_matter_check_fails_when_the_prompt_is_cut_off(sanity_experiment):
    import torch

    from harness.checks.sanity import inputs_matter_check, overfit_check

    _, model, tokenizer, examples, recipes = overfit_check(
        sanity_experiment, n=8, threshold=0.9, max_steps=300, eval_every=20
    )
    assert inputs_matter_check(model, tokenizer, examples, recipes).passed

    # The same model, but its inputs lose the prompt: every token before "<|im_start|>assistant\n" is padding.
    start_id = tokenizer.convert_tokens_to_ids("<|im_start|>")
    pad_id = tokenizer.pad_token_id
    original_forward = model.forward

    def cut_forward(input_ids=None, attention_mask=None, **kwargs):
        if input_ids is not None and input_ids.shape[1] > 1:
            input_ids = input_ids.clone()
            for row in input_ids:
                starts = (row == start_id).nonzero()
                if len(starts):
                    row[: int(starts[-1])] = pad_id
        return original_forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    model.forward = cut_forward
    with torch.no_grad():
        cut = inputs_matter_check(model, tokenizer, examples, recipes)
    assert not cut.passed, cut.line()


# -- bad input ------------------------------------------------------------------------------------------------


def test_too_long_examples_are_dropped_and_counted_or_rejected(tiny, tmp_path):
    tiny["train"]["max_length"] = 32
    summary = run_experiment(validate_data(tiny), tmp_path / "run").summary
    dropped = {t: c["dropped_too_long"] for s in summary["stages"] for t, c in s["composition"].items()}
    assert dropped["yesno"] > 0
    tiny["data"] = {"too_long": "error"}
    with pytest.raises(DataError, match="longer than max_length=32"):
        run_experiment(validate_data(tiny), tmp_path / "run2")


def test_a_pool_emptied_by_max_length_is_an_error_naming_the_task(tiny, tmp_path):
    tiny["train"]["max_length"] = 8
    result = invoke("run", str(write_yaml(tmp_path / "x.yaml", tiny)), "--out", str(tmp_path / "run"))  # refused
    assert result.exit_code == 2
    assert "task 'repeat'" in result.stderr and "pool is empty" in result.stderr


@pytest.mark.parametrize(
    "content,expected",
    [
        (None, "not found"),
        ('{"question": "hi", "reply": "yo"}\n', "no column 'q'"),
        ('{"q": "hi", "a": ""}\n', "empty"),
    ],
)
def test_bad_dataset_files_name_the_task_and_file(tiny, tmp_path, content, expected):
    data = tmp_path / "data.jsonl"
    if content is not None:
        data.write_text(content * 30)
    tiny["tasks"] = {
        "mine": {"recipe": "jsonl", "train": 10, "eval": 2, "params": {"path": str(data), "prompt": "q", "answer": "a"}}
    }
    tiny["stages"] = [{"name": "a", "steps": 2, "mixture": {"mine": 1.0}}]
    result = invoke("run", str(write_yaml(tmp_path / "x.yaml", tiny)), "--out", str(tmp_path / "run"))  # refused
    assert result.exit_code == 2, result.output[-2000:]
    assert "tasks.mine" in result.stderr and "data.jsonl" in result.stderr and expected in result.stderr
    assert "Traceback" not in result.stderr
