"""Builtin architectures (qwen2, llama, gpt2, qwen3_5 hybrid linear attention), bf16-autocast training of
qwen3_5-tiny, and ``model.hf`` on a locally saved tiny GPT-2 without a chat template."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from harness.config import ModelSpec, TrainableSpec, load_experiment
from harness.data.batches import collate
from harness.data.encoding import encode_examples
from harness.models.builtin import BUILTIN_MODELS, build_builtin
from harness.models.check import check_model_spec
from harness.models.hf import load_hf
from harness.models.tokenizer import CHAT_TEMPLATE, IM_END, IM_START, train_tokenizer
from harness.training.adapters import param_groups, prepare_stage_model, trainable_report
from harness.training.special_tokens import check_special_token_gradients, stage_special_tokens
from tests.conftest import ROOT, run_cli, write_yaml

WORDS = ["apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "piano", "amber", "frost"]
SMALL = {
    "qwen2-tiny": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    },
    "llama-tiny": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    },
    "gpt2-tiny": {"hidden_size": 32, "n_inner": 64, "n_layer": 1, "n_head": 2},  # hidden_size: alias of n_embd
    "qwen3_5-tiny": {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
    },
}


def _example(i: int):
    word = WORDS[i % len(WORDS)]
    return SimpleNamespace(
        task="repeat",
        messages=[
            {"role": "user", "content": f"Repeat after me: {word} {i}"},
            {"role": "assistant", "content": f"{word} {i}"},
        ],
    )


@pytest.fixture(scope="module")
def tok():
    texts = [f"{m['role']}\n{m['content']}" for i in range(40) for m in _example(i).messages]
    return train_tokenizer(texts, 400, 1)


@pytest.fixture(scope="module")
def batches(tok):
    encoded = encode_examples(tok, [_example(i) for i in range(32)])
    return [collate(encoded[i : i + 8], tok.pad_token_id) for i in range(0, 32, 8)]


def test_every_builtin_is_registered_and_valid():
    assert {"qwen2-tiny", "llama-tiny", "gpt2-tiny", "qwen3_5-tiny"} <= set(BUILTIN_MODELS.names())
    for name in BUILTIN_MODELS.names():
        assert check_model_spec(ModelSpec(builtin=name)) == [], name
    errors = check_model_spec(ModelSpec(builtin="gpt2-tiny", config={"n_embed": 64}))
    assert errors and "n_embd" in errors[0][1]


@pytest.mark.parametrize("name", list(SMALL))
def test_builtin_builds_and_backpropagates(tok, batches, name):
    spec = ModelSpec(builtin=name, config=SMALL[name])
    assert check_model_spec(spec) == []
    model = build_builtin(spec, tok, seed=0)
    assert model.config.vocab_size == len(tok) and model.config.hidden_size == 32
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    batch = batches[0]
    hidden = model.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    logits = model.get_output_embeddings()(hidden)
    full = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    assert torch.allclose(logits, full, atol=1e-5)  # the loop's head-only projection is exact for every builtin
    selected = batch.labels != -100
    torch.nn.functional.cross_entropy(logits[selected], batch.labels[selected]).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_qwen3_5_tiny_is_the_hybrid_text_model(tok):
    model = build_builtin(ModelSpec(builtin="qwen3_5-tiny"), tok, seed=0)
    assert type(model).__name__ == "Qwen3_5ForCausalLM" and model.config.model_type == "qwen3_5_text"
    assert model.config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    kinds = [
        type(layer.linear_attn if hasattr(layer, "linear_attn") else layer.self_attn).__name__
        for layer in model.model.layers
    ]
    assert kinds == ["Qwen3_5GatedDeltaNet"] * 3 + ["Qwen3_5Attention"]
    two = build_builtin(ModelSpec(builtin="qwen3_5-tiny", config={"num_hidden_layers": 2}), tok, seed=0)
    assert two.config.layer_types == ["linear_attention", "full_attention"]


def _train_bf16(model, batches, steps: int) -> list[float]:
    """fp32 master weights and AdamW state; forward under CPU bf16 autocast; loss in fp32."""
    opt = torch.optim.AdamW(param_groups(model, 0.0), lr=3e-3)
    model.train()
    losses = []
    for i in range(steps):
        batch = batches[i % len(batches)]
        selected = batch.labels != -100
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = model.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
            logits = model.get_output_embeddings()(hidden[selected])
        loss = torch.nn.functional.cross_entropy(logits.float(), batch.labels[selected])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert all(p.dtype == torch.float32 for p in model.parameters())
    return losses


def test_qwen3_5_tiny_bf16_autocast_10_steps(tok, batches):
    model = build_builtin(ModelSpec(builtin="qwen3_5-tiny", config=SMALL["qwen3_5-tiny"]), tok, seed=0)
    losses = _train_bf16(model, batches, 10)
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]


@pytest.mark.slow
def test_qwen3_5_tiny_bf16_autocast_100_steps(tok, batches):
    model = build_builtin(ModelSpec(builtin="qwen3_5-tiny"), tok, seed=0)  # the documented default size
    losses = _train_bf16(model, batches, 100)
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10


# ----------------------------------------------------------------------------------------------------------------
# model.hf: a local tiny GPT-2 with its own tokenizer and no chat template
# ----------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_gpt2(tmp_path_factory):
    """A GPT-2 (tokenizer trained here, ``<|endoftext|>`` as its last token like GPT-2's 50256; no chat template)
    saved with ``save_pretrained`` — nothing is downloaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    texts = [f"{m['role']}\n{m['content']}" for i in range(40) for m in _example(i).messages]
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    raw.train_from_iterator(texts, trainer)
    raw.add_special_tokens(["<|endoftext|>"])
    tokenizer = GPT2TokenizerFast(
        tokenizer_object=raw, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    assert tokenizer.chat_template is None
    eot = tokenizer.eos_token_id
    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=len(tokenizer),
            n_embd=32,
            n_layer=1,
            n_head=2,
            n_positions=256,
            bos_token_id=eot,
            eos_token_id=eot,
        )
    )
    directory = tmp_path_factory.mktemp("gpt2-local")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory, len(tokenizer)


def test_model_hf_local_gets_chat_tokens_and_new_row_training(local_gpt2):
    directory, old_vocab = local_gpt2
    model, tokenizer, added = load_hf(ModelSpec(hf=str(directory)), return_added=True)
    assert tokenizer.chat_template == CHAT_TEMPLATE
    assert added == [old_vocab, old_vocab + 1]
    assert tokenizer.convert_ids_to_tokens(added) == [IM_START, IM_END]
    assert tokenizer.eos_token == IM_END and model.config.eos_token_id == added[1]
    assert model.get_input_embeddings().weight.shape[0] == old_vocab + 2
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight  # GPT-2 ties them

    encoded = encode_examples(tokenizer, [_example(i) for i in range(8)])
    batches = [collate(encoded[i : i + 4], tokenizer.pad_token_id) for i in (0, 4)]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model = prepare_stage_model(model, TrainableSpec(mode="frozen", new_token_rows=True), added)
    assert trainable_report(model)["trainable"] == 2 * 32
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-2)
    special = stage_special_tokens(tokenizer, batches)
    assert special == {IM_START: added[0], IM_END: added[1]}
    for step in range(3):
        batch = batches[step % 2]
        selected = batch.labels != -100
        hidden = model.base_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        loss = torch.nn.functional.cross_entropy(
            model.get_output_embeddings()(hidden[selected]), batch.labels[selected]
        )
        loss.backward()
        if step == 0:
            check_special_token_gradients(model, special, batch=batch)
        opt.step()
        opt.zero_grad(set_to_none=True)
    after = model.state_dict()
    key = "transformer.wte.weight"
    for k, v in before.items():
        if k not in (key, "lm_head.weight"):
            assert torch.equal(v, after[k]), k
    assert torch.equal(after[key][:old_vocab], before[key][:old_vocab])
    assert not torch.equal(after[key][old_vocab:], before[key][old_vocab:])


def test_model_hf_local_runs_end_to_end(local_gpt2, tiny, tmp_path):
    directory, _ = local_gpt2
    tiny["model"] = {"hf": str(directory)}
    tiny["tasks"] = {"repeat": {"recipe": "repeat", "train": 24, "eval": 3}}
    tiny["stages"] = [
        {"name": "a", "steps": 2, "mixture": {"repeat": 1.0}},
        {"name": "b", "steps": 2, "mixture": {"repeat": 1.0}},
    ]
    path = write_yaml(tmp_path / "hf.yaml", tiny)
    load_experiment(path)
    out = tmp_path / "run"
    result = run_cli("run", str(path), "--out", str(out), cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [s["name"] for s in summary["stages"]] == ["a", "b"]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = AutoTokenizer.from_pretrained(out / "checkpoints" / "b")
    assert saved.chat_template == CHAT_TEMPLATE and IM_END in saved.get_vocab()
    assert AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "b").config.vocab_size == len(saved)
