"""Every trainable mode and loss through a real run of tests/data/micro.yaml (shrunk with --set overrides)."""

from __future__ import annotations

import json

import polars as pl
import pytest
import torch
import yaml
from safetensors.torch import load_file

from harness.config import apply_overrides, validate_data
from harness.core.store import read_metrics
from harness.runs.execution.runner import run_experiment
from tests.conftest import MICRO

SHRINK = [
    "model.pretrain.steps=6",
    "tracking.wandb.mode=disabled",
    "tracking.console=false",
    "eval.every=100",
    "stages[0].steps=3",
    "stages[1].steps=3",
    "stages[2].steps=3",
    "tasks.repeat.train=40",
    "tasks.yesno.train=40",
    "tasks.assistant_qa.train=40",
    "tasks.math.train=40",
    "tasks.identity.train=20",
    "tasks.repeat.eval=2",
    "tasks.yesno.eval=2",
    "tasks.assistant_qa.eval=2",
    "tasks.math.eval=2",
    "tasks.identity.eval=2",
]


def micro_run(tmp_path, *overrides: str):
    raw = apply_overrides(yaml.safe_load(MICRO.read_text()), [*SHRINK, *overrides])
    return run_experiment(validate_data(raw), tmp_path / "run")


@pytest.mark.parametrize("mode", ["full", "lora", "hira", "frozen_new_rows"])
def test_each_trainable_mode_runs_and_logs_its_share(tmp_path, mode):
    trainable = "{mode: frozen, new_token_rows: true}" if mode == "frozen_new_rows" else mode
    result = micro_run(tmp_path, f"train.trainable={trainable}")
    store = read_metrics(result.run_dir)
    shares = store.filter(pl.col("metric") == "trainable_share")["value"].to_list()
    assert len(shares) == 3
    if mode == "full":
        assert shares == [1.0, 1.0, 1.0]
    else:
        assert all(0 < s < 0.2 for s in shares), shares
    assert store.filter(pl.col("metric") == "loss", pl.col("task").is_null())["value"].is_finite().all()
    assert (result.run_dir / "checkpoints" / "assistant" / "model.safetensors").exists()
    if mode in ("lora", "hira"):
        meta = json.loads((result.run_dir / "checkpoints" / "assistant" / "meta.json").read_text())
        assert meta["adapter"]["type"] == mode
        assert (result.run_dir / "checkpoints" / "assistant" / "adapter" / "adapter_config.json").exists()


def test_frozen_new_token_rows_changes_only_the_new_rows(tmp_path):
    from transformers import AutoTokenizer

    result = micro_run(tmp_path, "train.trainable={mode: frozen, new_token_rows: true}", "train.optim.weight_decay=0.1")
    base = load_file(f"{result.summary['base']['cache_dir']}/model.safetensors")
    tuned = load_file(result.run_dir / "checkpoints" / "assistant" / "model.safetensors")
    tokenizer = AutoTokenizer.from_pretrained(result.run_dir / "checkpoints" / "assistant")
    new_ids = sorted(tokenizer.convert_tokens_to_ids(["<|pad|>", "<|im_start|>", "<|im_end|>"]))
    for name, before in base.items():
        after = tuned[name]
        if name == "model.embed_tokens.weight":  # tied with lm_head
            changed = (after != before).any(dim=1).nonzero().flatten().tolist()
            assert set(changed) <= set(new_ids) and changed, changed
            others = torch.ones(before.shape[0], dtype=torch.bool)
            others[new_ids] = False
            assert torch.equal(after[others], before[others]), "bitwise: every other row unchanged"
        else:
            assert torch.equal(after, before), name


def test_gem_loss_runs_and_plain_ce_is_still_logged(tmp_path):
    store = read_metrics(
        micro_run(
            tmp_path,
            "train.loss={name: gem, beta: 0.7, h: logsigmoid}",
            "stages[1].loss={name: ce, task_weights: {yesno: 2.0}, first_token_weight: 3}",
        ).run_dir
    )
    per_task = store.filter(pl.col("metric") == "loss", pl.col("split") == "train", pl.col("task").is_not_null())
    assert set(per_task["stage"]) == {"repeat_only", "short", "assistant"}
    assert per_task["value"].is_finite().all() and (per_task["value"] > 0).all()


def test_special_token_check_stops_a_stage_whose_new_rows_cannot_train(tmp_path, monkeypatch):
    """The seed's off-by-one: a row mask whose hook leaves the last added token (<|im_end|>, the EOS) frozen."""
    import harness.training.adapters as adapters

    real = adapters._frozen_rows

    def off_by_one(n_rows, rows, device):
        return real(n_rows, sorted(rows)[:-1], device)

    monkeypatch.setattr(adapters, "_frozen_rows", off_by_one)
    from harness.training.special_tokens import SpecialTokenGradientError

    with pytest.raises(SpecialTokenGradientError, match=r"<\|im_end\|>"):
        # stage_cache false: the patched code trains the stage, instead of replaying an entry the real code made
        micro_run(tmp_path, "train.trainable={mode: frozen, new_token_rows: true}", "train.stage_cache=false")
