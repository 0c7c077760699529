"""``harness inspect``: one row per module with parameters, trainability, output shape and dtype."""

from __future__ import annotations

import json

import pytest
import torch

from harness.checks.inspection import inspect_model
from harness.config import ModelSpec, TrainableSpec
from harness.models.builtin import build_builtin, builtin_added_token_ids
from harness.models.tokenizer import train_tokenizer
from harness.training.adapters import prepare_stage_model
from harness.training.checkpoint import save_stage_checkpoint
from tests.conftest import invoke, write_yaml

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer([f"user\nRepeat after me: word{i}" for i in range(50)], 400, 1)


def _rows(rows):
    return {r["name"]: r for r in rows}


def test_rows_for_a_frozen_model_with_new_rows(tok):
    model = build_builtin(ModelSpec(config=TINY), tok, seed=0)
    model = prepare_stage_model(
        model, TrainableSpec(mode="frozen", new_token_rows=True, unfreeze=["norm"]), builtin_added_token_ids(tok)
    )
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 0]])
    rows = _rows(inspect_model(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}))
    emb = rows["model.embed_tokens"]
    assert emb["params"] == len(tok) * 32 and emb["trainable"] == "rows"
    assert emb["shape"] == [2, 4, 32] and emb["dtype"] == "float32"
    assert rows["lm_head"]["params"] == 0 and "tied to model.embed_tokens.weight" in rows["lm_head"]["note"]
    assert rows["lm_head"]["shape"] == [2, 4, len(tok)]
    assert rows["model.layers.0.self_attn.q_proj"]["trainable"] == "no"
    assert rows["model.layers.0.self_attn.q_proj"]["params"] == 32 * 32 + 32
    assert rows["model.norm"]["trainable"] == "yes"
    assert rows["model.layers.0.self_attn"]["trainable"] == "-"
    total = sum(r["params"] for r in rows.values())
    assert total == sum(p.numel() for p in model.parameters())


def test_bf16_autocast_dtypes_and_adapters(tok):
    model = build_builtin(ModelSpec(config=TINY), tok, seed=0)
    model = prepare_stage_model(model, TrainableSpec(mode="lora", r=2), [])
    ids = torch.tensor([[5, 6, 7]])
    rows = _rows(inspect_model(model, {"input_ids": ids}, autocast_dtype=torch.bfloat16))
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    assert rows[q]["type"] == "Linear" and rows[q]["trainable"] == "-"  # the peft wrapper owns no parameter
    assert rows[q + ".base_layer"]["trainable"] == "no" and rows[q + ".lora_A.default"]["trainable"] == "yes"
    assert rows[q]["dtype"] == "bfloat16"


def test_cli_on_an_experiment_and_a_checkpoint(tiny, tmp_path, tok):
    # In process (typer's runner): the command's output and exit codes, without a subprocess's start-up each.
    tiny["stages"][0]["trainable"] = {"mode": "hira", "r": 2}
    path = write_yaml(tmp_path / "exp.yaml", tiny)
    result = invoke("inspect", str(path), "--json")
    assert result.exit_code == 0, result.stderr[-2000:]
    rows = _rows(json.loads(result.stdout))
    assert any(name.endswith("q_proj.hira_A") and r["trainable"] == "yes" for name, r in rows.items())
    assert rows["base_model.model.lm_head"]["shape"][-1] > 300

    model = build_builtin(ModelSpec(config=TINY), tok, seed=0)
    save_stage_checkpoint(model, tok, tmp_path / "ck", {})
    result = invoke("inspect", str(tmp_path / "ck"))
    assert result.exit_code == 0, result.stderr[-2000:]
    assert "model.layers.0.mlp.down_proj" in result.stdout and "Qwen2ForCausalLM" in result.stdout

    bad = invoke("inspect", str(tmp_path / "missing.yaml"))
    assert bad.exit_code == 2 and "no such file" in bad.stderr
