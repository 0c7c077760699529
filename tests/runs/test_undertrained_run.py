"""Under-trained special-token rows inside a run: a local model whose chat template's ``<|im_end|>`` row was never
trained (planted: zeros) is warned about, recorded in summary.json, trained under LoRA with ``new_token_rows:
auto`` (and left frozen with ``false``), and listed by ``harness inspect --tokens``."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from harness.config import ModelSpec, load_experiment
from harness.models.builtin import build_builtin, builtin_unused_token_ids
from harness.models.tokenizer import ENDOFTEXT, IM_END, IM_START, PAD, SPECIAL_TOKENS, train_tokenizer
from harness.runs.execution.console import Console
from harness.runs.execution.runner import run_experiment
from tests.conftest import invoke, write_yaml

TEXTS = [f"user\nRepeat after me: word{i} and more words" for i in range(60)]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A qwen2-tiny with a chat template (so the harness adds no token, like a Qwen base) saved locally: every
    special row but <|im_end|>'s a copy of an ordinary row, <|im_end|>'s zeros. Returns (directory, im_end id)."""
    tokenizer = train_tokenizer(TEXTS, 400, 1)
    model = build_builtin(
        ModelSpec(
            config=dict(
                hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
            )
        ),
        tokenizer,
        seed=0,
    )
    weight = model.get_input_embeddings().weight
    special = tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS)
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    with torch.no_grad():
        for k, i in enumerate(special):
            weight[i] = weight[100 + 10 * k]  # looks like any trained row
        weight[im_end] = 0
    directory = tmp_path_factory.mktemp("planted")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory, im_end


def _experiment(tiny, tmp_path, directory, new_token_rows):
    tiny["model"] = {"hf": str(directory)}
    tiny["tasks"] = {"repeat": {"recipe": "repeat", "train": 24, "eval": 2}}
    tiny["train"]["trainable"] = {"mode": "lora", "r": 2, "new_token_rows": new_token_rows}
    tiny["train"]["stage_cache"] = False
    tiny["eval"]["every"] = 100
    tiny["stages"] = [{"name": "a", "steps": 3, "mixture": {"repeat": 1.0}}]
    return write_yaml(tmp_path / f"planted-{new_token_rows}.yaml", tiny)


def _im_end_row(path, im_end):
    return load_file(path)["model.embed_tokens.weight"][im_end]


@pytest.mark.parametrize("new_token_rows", ["auto", False])
def test_run_warns_records_and_auto_trains_the_flagged_row(planted, tiny, tmp_path, capsys, new_token_rows):
    directory, im_end = planted
    exp = load_experiment(_experiment(tiny, tmp_path, directory, new_token_rows))
    result = run_experiment(exp, tmp_path / "run", console=Console(enabled=True))
    console = capsys.readouterr().err
    warning = [line for line in console.splitlines() if "under-trained" in line]
    assert len(warning) == 1 and warning[0].startswith("warning:") and f"{IM_END} (id {im_end})" in warning[0]
    recorded = json.loads((result.run_dir / "summary.json").read_text())["undertrained_tokens"]
    assert [(t["token"], t["id"]) for t in recorded] == [(IM_END, im_end)] and "norm" in recorded[0]["why"]
    before = _im_end_row(directory / "model.safetensors", im_end)
    after_all = load_file(result.run_dir / "checkpoints" / "a" / "model.safetensors")["model.embed_tokens.weight"]
    base_all = load_file(directory / "model.safetensors")["model.embed_tokens.weight"]
    others = torch.ones(base_all.shape[0], dtype=torch.bool)
    others[im_end] = False
    assert torch.equal(after_all[others], base_all[others])  # only the flagged row may move
    if new_token_rows == "auto":
        assert not torch.equal(after_all[im_end], before) and after_all[im_end].abs().sum() > 0
        assert "every stage trains their rows" in warning[0]
    else:
        assert torch.equal(after_all[im_end], before)
        assert "their rows stay frozen in stage(s) a (new_token_rows: false)" in warning[0]  # says what happens


def test_inspect_tokens_lists_the_flagged_row(planted, tiny, tmp_path):
    directory, im_end = planted
    path = _experiment(tiny, tmp_path, directory, "auto")
    table = invoke("inspect", str(path), "--tokens")  # in process: the output, without a subprocess's start-up
    assert table.exit_code == 0, table.stderr[-2000:]
    row = next(line for line in table.stdout.splitlines() if IM_END in line and str(im_end) in line)
    assert "yes" in row and "norm" in row and "tied" in row
    assert "1 of 4 flagged: <|im_end|>" in table.stdout
    listed = invoke("inspect", str(directory), "--tokens", "--json")
    assert listed.exit_code == 0, listed.stderr[-2000:]
    reports = {r["token"]: r for r in json.loads(listed.stdout)}
    assert set(reports) == {PAD, ENDOFTEXT, IM_START, IM_END}
    assert [t for t, r in reports.items() if r["flagged"]] == [IM_END]
    assert reports[IM_END]["input"]["norm"] == 0.0 and reports[IM_END]["input"]["norm_z"] < -3


def test_builtin_reference_rows_are_the_ids_absent_from_the_pretraining_corpus():
    corpus = ["the cat sat on the mat", "a dog ran home"]
    tokenizer = train_tokenizer(corpus * 10 + ["zebra quokka"] * 10, 300, 1)
    unused = set(builtin_unused_token_ids(tokenizer, corpus))
    seen = {i for text in corpus for i in tokenizer(text, add_special_tokens=False)["input_ids"]}
    assert not unused & seen and tokenizer.convert_tokens_to_ids(ENDOFTEXT) not in unused  # between documents
    assert set(tokenizer("zebra quokka", add_special_tokens=False)["input_ids"]) <= unused  # task-only tokens
    assert set(tokenizer.convert_tokens_to_ids([PAD, IM_START, IM_END])) <= unused
    assert unused | seen | {tokenizer.convert_tokens_to_ids(ENDOFTEXT)} == set(range(len(tokenizer)))
