"""What trains per stage: every trainable mode on a tiny qwen2 with AdamW (weight decay on), new-token rows bitwise,
LoRA / HiRA checkpoints through peft and AutoModelForCausalLM, adapter merge / continue, and the special-token
gradient check catching the seed's off-by-one."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from harness.config import ModelSpec, TrainableSpec
from harness.data.batches import collate
from harness.data.encoding import encode_examples
from harness.models.builtin import build_builtin, builtin_added_token_ids
from harness.models.tokenizer import IM_END, IM_START, train_tokenizer
from harness.training.adapters import (
    param_groups,
    prepare_stage_model,
    resolve_target_modules,
    trainable_report,
    unwrap,
)
from harness.training.checkpoint import save_stage_checkpoint
from harness.training.special_tokens import (
    SpecialTokenGradientError,
    check_special_token_gradients,
    stage_special_tokens,
)

TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
WORDS = ["apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "piano", "amber", "frost"]


def _example(i: int):
    word = WORDS[i % len(WORDS)]
    return SimpleNamespace(
        task="repeat" if i % 2 else "yesno",
        messages=[
            {"role": "user", "content": f"Repeat after me: {word} {i}"},
            {"role": "assistant", "content": f"{word} {i}" if i % 2 else "Yes."},
        ],
    )


@pytest.fixture(scope="module")
def tok():
    texts = [f"{m['role']}\n{m['content']}" for i in range(40) for m in _example(i).messages]
    texts += ["The river runs past the stone under a cloud of frost."] * 5
    return train_tokenizer(texts, 400, 1)


@pytest.fixture(scope="module")
def batches(tok):
    encoded = encode_examples(tok, [_example(i) for i in range(16)])
    return [collate(encoded[i : i + 4], tok.pad_token_id) for i in range(0, 16, 4)]


def _model(tok, arch: str = "qwen2-tiny", **overrides):
    return build_builtin(ModelSpec(builtin=arch, config={**TINY, **overrides}), tok, seed=0)


def _loss(model, batch):
    out = unwrap(model)(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    selected = batch.labels != -100
    return torch.nn.functional.cross_entropy(out.logits[selected], batch.labels[selected])


def _train(model, batches, steps: int = 3, weight_decay: float = 0.1, lr: float = 1e-2) -> list[float]:
    opt = torch.optim.AdamW(param_groups(model, weight_decay), lr=lr)
    model.train()
    losses = []
    for i in range(steps):
        loss = _loss(model, batches[i % len(batches)])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in unwrap(model).state_dict().items()}


def _changed(before: dict, model) -> set[str]:
    """Base weights that moved (adapter layers' ``base_layer`` mapped back to the plain names)."""
    after = {k.replace(".base_layer", ""): v for k, v in unwrap(model).state_dict().items()}
    assert set(before) <= set(after)
    return {k for k, v in before.items() if not torch.equal(v, after[k])}


@pytest.mark.parametrize("mode", ["full", "lora", "hira", "frozen_rows", "frozen_unfreeze"])
def test_each_mode_trains_what_it_says(tok, batches, mode):
    model = _model(tok)
    before = _snapshot(model)
    added = builtin_added_token_ids(tok)
    spec = {
        "full": TrainableSpec(mode="full"),
        "lora": TrainableSpec(mode="lora", r=4),
        "hira": TrainableSpec(mode="hira", r=4),
        "frozen_rows": TrainableSpec(mode="frozen", new_token_rows=True),
        "frozen_unfreeze": TrainableSpec(mode="frozen", unfreeze=[r"norm\.weight$"]),
    }[mode]
    model = prepare_stage_model(model, spec, added if spec.new_token_rows is True else [])
    report = trainable_report(model)
    losses = _train(model, batches)
    assert all(torch.isfinite(torch.tensor(losses)))
    changed = _changed(before, model)
    if mode == "full":
        assert report["share"] == 1.0 and len(changed) == len(before)
    elif mode in ("lora", "hira"):
        assert type(model).__name__ == "PeftModelForCausalLM"
        assert 0 < report["trainable"] == report["adapter"] < report["total"]
        assert not changed  # the base weights did not move (only adapter parameters, which are extra entries)
    elif mode == "frozen_rows":
        assert changed == {"model.embed_tokens.weight", "lm_head.weight"} or changed == {"model.embed_tokens.weight"}
        assert report["trainable"] == len(added) * 32
    else:
        assert changed and all(k.endswith("norm.weight") for k in changed)


def test_new_token_rows_bitwise_against_the_checkpoint(tok, batches, tmp_path):
    """frozen + new_token_rows, tied embeddings, AdamW with weight decay 0.1: only the added rows change."""
    model = _model(tok)
    assert model.get_input_embeddings().weight is model.get_output_embeddings().weight
    initial = _snapshot(model)
    added = builtin_added_token_ids(tok)
    model = prepare_stage_model(model, TrainableSpec(mode="frozen", new_token_rows=True), added)
    _train(model, batches, steps=4)
    save_stage_checkpoint(model, tok, tmp_path / "ck", {"stage": "rows"})
    saved = load_file(tmp_path / "ck" / "model.safetensors")
    emb_key = "model.embed_tokens.weight"
    for key, value in saved.items():
        if key != emb_key:
            assert torch.equal(value, initial[key]), key
    rows = torch.zeros(len(tok), dtype=torch.bool)
    rows[added] = True
    assert torch.equal(saved[emb_key][~rows], initial[emb_key][~rows])  # bitwise: frozen rows untouched
    moved = (saved[emb_key][rows] != initial[emb_key][rows]).any(dim=1)
    assert moved.all(), "every added row trained"
    meta = json.loads((tmp_path / "ck" / "meta.json").read_text())
    assert meta["stage"] == "rows" and meta["trainable"]["trainable"] == len(added) * 32


def test_why_masked_rows_need_no_weight_decay(tok, batches):
    """The gradient mask alone is not enough under AdamW: decoupled weight decay shrinks masked rows too."""
    model = _model(tok)
    initial = model.get_input_embeddings().weight.detach().clone()
    added = builtin_added_token_ids(tok)
    model = prepare_stage_model(model, TrainableSpec(mode="frozen", new_token_rows=True), added)
    naive = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    loss = _loss(model, batches[0])
    loss.backward()
    naive.step()
    frozen = torch.ones(len(tok), dtype=torch.bool)
    frozen[added] = False
    assert not torch.equal(model.get_input_embeddings().weight.detach()[frozen], initial[frozen])


def test_new_token_rows_untied(tok, batches):
    model = _model(tok, "llama-tiny", tie_word_embeddings=False)
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert emb is not head
    e0, h0 = emb.detach().clone(), head.detach().clone()
    added = builtin_added_token_ids(tok)
    model = prepare_stage_model(model, TrainableSpec(mode="frozen", new_token_rows=True), added)
    assert trainable_report(model)["trainable"] == 2 * len(added) * 32
    _train(model, batches, steps=3)
    frozen = torch.ones(len(tok), dtype=torch.bool)
    frozen[added] = False
    assert torch.equal(emb.detach()[frozen], e0[frozen]) and torch.equal(head.detach()[frozen], h0[frozen])
    assert not torch.equal(head.detach()[~frozen], h0[~frozen])


@pytest.mark.parametrize("mode", ["lora", "hira"])
def test_adapter_checkpoint_loads_with_peft_and_transformers(tok, batches, tmp_path, mode):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = _model(tok)
    initial = _snapshot(model)
    model = prepare_stage_model(model, TrainableSpec(mode=mode, r=4, new_token_rows=True), builtin_added_token_ids(tok))
    _train(model, batches, steps=3)
    model.eval()
    probe = batches[1]
    with torch.no_grad():
        reference = model(input_ids=probe.input_ids, attention_mask=probe.attention_mask).logits
    meta = save_stage_checkpoint(model, tok, tmp_path / "ck", {"stage": mode})
    assert meta["adapter"]["type"] == mode and meta["adapter"]["complete"]
    with torch.no_grad():  # saving merged a copy: the trained model is untouched
        again = model(input_ids=probe.input_ids, attention_mask=probe.attention_mask).logits
    assert torch.equal(again, reference)
    assert type(model).__name__ == "PeftModelForCausalLM"

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "ck").eval()
    base = _model(tok)
    base.load_state_dict(initial)
    adapted = PeftModel.from_pretrained(base, tmp_path / "ck" / "adapter").eval()
    with torch.no_grad():
        for loaded in (merged, adapted):
            logits = loaded(input_ids=probe.input_ids, attention_mask=probe.attention_mask).logits
            assert torch.allclose(logits, reference, atol=1e-5), (
                loaded.__class__.__name__,
                (logits - reference).abs().max(),
            )


def test_adapter_merge_then_continue(tok, batches):
    lora = TrainableSpec(mode="lora", r=4)
    model = prepare_stage_model(_model(tok), lora, [])
    _train(model, batches, steps=2)
    model.eval()
    with torch.no_grad():
        reference = model(input_ids=batches[0].input_ids).logits

    kept = prepare_stage_model(
        model,
        lora.model_copy(update={"adapter": "continue"}),
        [],
        previous=lora.model_copy(update={"adapter": "continue"}),
    )
    assert kept is model and trainable_report(kept)["trainable"] == trainable_report(kept)["adapter"]
    with pytest.raises(ValueError, match="same|mode"):
        prepare_stage_model(
            model, TrainableSpec(mode="hira", r=4), [], previous=lora.model_copy(update={"adapter": "continue"})
        )
    with pytest.raises(ValueError, match="changes r"):
        prepare_stage_model(
            model, TrainableSpec(mode="lora", r=8), [], previous=lora.model_copy(update={"adapter": "continue"})
        )

    merged = prepare_stage_model(model, TrainableSpec(mode="full"), [], previous=lora)  # adapter: merge (default)
    assert type(merged).__name__ == "Qwen2ForCausalLM"
    assert trainable_report(merged)["share"] == 1.0
    merged.eval()
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=batches[0].input_ids).logits, reference, atol=1e-5)


def test_unfreeze_regexes_and_errors(tok):
    model = prepare_stage_model(_model(tok), TrainableSpec(mode="frozen", unfreeze=["lm_head"]), [])
    # tied: unfreezing lm_head trains the one shared matrix
    assert model.get_input_embeddings().weight.requires_grad
    with pytest.raises(ValueError, match="matches no parameter"):
        prepare_stage_model(_model(tok), TrainableSpec(mode="lora", unfreeze=["nrom"]), [])
    with pytest.raises(ValueError, match="nothing to train"):
        prepare_stage_model(_model(tok), TrainableSpec(mode="frozen"), [])
    with pytest.raises(ValueError, match="no tokens were added"):
        prepare_stage_model(_model(tok), TrainableSpec(mode="frozen", new_token_rows=True), [])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prepare_stage_model(
            _model(tok), TrainableSpec(mode="lora", r=2, new_token_rows=False), builtin_added_token_ids(tok)
        )
    assert any("new_token_rows" in str(w.message) for w in caught)


def test_new_token_rows_auto_trains_added_and_flagged_rows_when_the_mode_freezes_them(tok):
    added, flagged = builtin_added_token_ids(tok), [7]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = prepare_stage_model(_model(tok), TrainableSpec(mode="lora", r=2), added, undertrained_ids=flagged)
    assert not any("new_token_rows" in str(w.message) for w in caught)
    emb = model.get_input_embeddings().weight
    assert emb.requires_grad and sorted(emb._harness_trainable_rows) == sorted(added + flagged)
    # true keeps its meaning (the added rows only); full trains everything whatever the setting
    model = prepare_stage_model(
        _model(tok), TrainableSpec(mode="lora", r=2, new_token_rows=True), added, undertrained_ids=flagged
    )
    assert model.get_input_embeddings().weight._harness_trainable_rows == added
    model = prepare_stage_model(_model(tok), TrainableSpec(mode="full"), added, undertrained_ids=flagged)
    assert not hasattr(model.get_input_embeddings().weight, "_harness_trainable_rows")


def test_target_module_names_per_architecture(tok):
    assert resolve_target_modules(_model(tok), None) == ["q_proj", "k_proj", "v_proj", "up_proj", "down_proj"]
    gpt2 = build_builtin(ModelSpec(builtin="gpt2-tiny", config={"n_embd": 32, "n_layer": 1, "n_head": 2}), tok, 0)
    assert resolve_target_modules(gpt2, None) == ["attn.c_attn", "mlp.c_fc", "mlp.c_proj"]
    q35 = build_builtin(ModelSpec(builtin="qwen3_5-tiny", config={"num_hidden_layers": 2}), tok, 0)
    assert resolve_target_modules(q35, ["q_proj", "o_proj"]) == [
        "self_attn.q_proj",
        "linear_attn.in_proj_qkv",
        "self_attn.o_proj",
        "linear_attn.out_proj",
    ]
    with pytest.raises(ValueError, match="gate_proj"):
        resolve_target_modules(gpt2, ["gate_proj"])
    lora = prepare_stage_model(gpt2, TrainableSpec(mode="lora", r=2), [])
    names = [n for n, _ in lora.named_parameters() if "lora_A" in n]
    assert any("attn.c_attn" in n for n in names) and any("mlp.c_proj" in n for n in names)
    assert not any("attn.c_proj" in n for n in names)


# ----------------------------------------------------------------------------------------------------------------
# The special-token gradient check
# ----------------------------------------------------------------------------------------------------------------


def test_stage_special_tokens(tok, batches):
    found = stage_special_tokens(tok, batches)
    assert found == {IM_START: tok.convert_tokens_to_ids(IM_START), IM_END: tok.convert_tokens_to_ids(IM_END)}


def test_check_passes_with_the_harness_row_mask(tok, batches):
    model = prepare_stage_model(
        _model(tok), TrainableSpec(mode="frozen", new_token_rows=True), builtin_added_token_ids(tok)
    )
    _loss(model, batches[0]).backward()
    result = check_special_token_gradients(model, stage_special_tokens(tok, batches), batch=batches[0])
    assert {t for t, _, _ in result["checked"]} == {IM_START, IM_END}


def _seed_style(tok, boundary: int):
    """The seed's mechanism verbatim: embedding trainable, a hook zeroing ``grad[:boundary]``."""
    model = _model(tok)
    for p in model.parameters():
        p.requires_grad_(False)
    weight = model.get_input_embeddings().weight

    def embedding_grad_hook(grad):
        grad = grad.clone()
        grad[:boundary] = 0
        return grad

    weight.requires_grad = True
    weight.register_hook(embedding_grad_hook)
    return model


def test_check_catches_the_seeds_off_by_one():
    """The seed: vocabulary of 32000 with <|endoftext|> the last row (31999); the hook should zero grad[:31999]
    and zeroed grad[:32000], so <|endoftext|> never trained. Same layout here: a new special token appended as
    the last row and made EOS; boundary len(tokenizer) (the bug) vs len(tokenizer) - 1 (correct)."""
    texts = [f"{m['role']}\n{m['content']}" for i in range(40) for m in _example(i).messages]
    copy = train_tokenizer(texts, 400, 1)  # a fresh tokenizer: the module's stays untouched
    copy.add_special_tokens({"additional_special_tokens": ["<|eot|>"]})
    eot = copy.convert_tokens_to_ids("<|eot|>")
    assert eot == len(copy) - 1
    copy.eos_token = "<|eot|>"
    copy.chat_template = copy.chat_template.replace("<|im_end|>", "<|eot|>")
    batch = collate(encode_examples(copy, [_example(i) for i in range(4)]), copy.pad_token_id)
    assert (batch.labels == eot).any()
    special = stage_special_tokens(copy, [batch])
    assert special["<|eot|>"] == eot

    buggy = _seed_style(copy, boundary=len(copy))  # grad[:32000] = 0
    _loss(buggy, batch).backward()
    with pytest.raises(SpecialTokenGradientError) as err:
        check_special_token_gradients(buggy, {"<|eot|>": eot})
    assert "'<|eot|>'" in str(err.value) and f"id {eot}" in str(err.value)

    fixed = _seed_style(copy, boundary=len(copy) - 1)  # grad[:31999] = 0
    _loss(fixed, batch).backward()
    check_special_token_gradients(fixed, {"<|eot|>": eot})
    # …and it would still catch the *other* special tokens the seed's single-row hook leaves frozen
    with pytest.raises(SpecialTokenGradientError, match="im_start"):
        check_special_token_gradients(fixed, special, batch=batch)
