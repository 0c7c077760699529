"""Correct outputs: greedy stops at every end-of-turn token, max_new_tokens defaults to what the gold answers need,
an explicit value that cuts an answer is a data error, and cut-off outputs are counted (``truncated``)."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from harness.config import EvalSpec, validate_data
from harness.data.answer_lengths import default_max_new_tokens, length_margin, needed_new_tokens
from harness.data.task_data import DataError
from harness.evaluation import run_evaluation
from harness.evaluation.lengths import stop_token_ids
from harness.models.tokenizer import ENDOFTEXT, IM_END, IM_START, train_tokenizer
from harness.runs.planning.prepare import build_task_data, encode_task_data
from tests.conftest import invoke, write_yaml
from tests.evaluation.test_evaluation import Bigram, ExactRecipe, item


@pytest.fixture(scope="module")
def chatml_other_eos():
    """A tokenizer with a ChatML template whose EOS is ``<|endoftext|>`` (as Qwen base models ship)."""
    tok = train_tokenizer([f"is it {i}? yes it is. no." for i in range(60)], vocab_size=300, min_frequency=1)
    tok.eos_token = ENDOFTEXT
    return tok


def test_stop_tokens_include_the_template_end_token_and_the_generation_config(chatml_other_eos):
    tok = chatml_other_eos
    end, eos = tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(ENDOFTEXT)
    assert tok.eos_token_id == eos != end
    assert stop_token_ids(tok) == sorted({end, eos})
    config = type("GenerationConfig", (), {"eos_token_id": [7, eos]})()
    assert stop_token_ids(tok, config) == sorted({7, end, eos})


def test_greedy_stops_at_im_end_when_eos_is_another_token(chatml_other_eos):
    tok = chatml_other_eos
    end, start = tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(IM_START)
    yes = tok.encode(" yes")[0]
    prompt_last = tok.convert_tokens_to_ids("c")
    table = torch.zeros(len(tok), len(tok))
    table[prompt_last, yes] = 1.0
    table[yes, end] = 1.0
    table[end, start] = 1.0  # without stopping at <|im_end|>, a hallucinated next turn follows
    table[start, yes] = 1.0
    items = [item("yn", "heldout", 0, [prompt_last], [yes, end], tok, gold_text="yes")]
    spec = EvalSpec(evaluators=["greedy"], probes=[], batch_size=1)  # max_new_tokens: null (auto)
    result = run_evaluation(Bigram(table), tok, items, {"yn": ExactRecipe()}, spec)
    sample = result.samples[0]
    assert sample["pred"] == " yes" and sample["correct"] and sample["truncated"] is False
    assert result.value("yn", "heldout", "truncated") == 0.0


def test_an_answer_that_never_stops_is_counted_truncated(chatml_other_eos):
    tok = chatml_other_eos
    yes, end = tok.encode(" yes")[0], tok.convert_tokens_to_ids(IM_END)
    table = torch.zeros(len(tok), len(tok))
    table[:, yes] = 1.0  # " yes" forever
    items = [item("yn", "heldout", i, [5 + i], [yes, end], tok, gold_text="yes") for i in range(2)]
    result = run_evaluation(
        Bigram(table), tok, items, {"yn": ExactRecipe()}, EvalSpec(evaluators=["greedy"], probes=[])
    )
    expected_len = 2 + length_margin(2)
    assert all(s["truncated"] and s["pred"] == " yes" * expected_len for s in result.samples)
    assert result.value("yn", "heldout", "truncated") == 1.0


def test_default_budget_is_the_longest_gold_answer_plus_the_margin():
    class It:
        def __init__(self, task, n):
            self.task, self.gold_ids = task, list(range(n))

    items = [It("a", 3), It("a", 17), It("b", 5)]
    assert needed_new_tokens(items) == {"a": 17, "b": 5}
    assert default_max_new_tokens(items) == 17 + length_margin(17) == 22


def _math_experiment(tiny: dict, max_new_tokens):
    exp = copy.deepcopy(tiny)
    exp["tasks"] = {"math": {"recipe": "math_reversed", "train": 20, "eval": 20, "params": {"digits": 2}}}
    exp["stages"] = [{"name": "a", "steps": 1, "mixture": {"math": 1.0}}]
    exp["eval"]["max_new_tokens"] = max_new_tokens
    return validate_data(exp)


def test_a_budget_that_cuts_math_answers_is_a_data_error_naming_the_task(tiny):
    exp = _math_experiment(tiny, 12)
    data = build_task_data(exp)
    tok = train_tokenizer(
        [m["content"] for ex in data.splits["math"]["train"] for m in ex.messages], vocab_size=300, min_frequency=1
    )
    with pytest.raises(
        DataError,
        match=r"max_new_tokens=12 cuts task 'math': its longest gold answer needs 1\d "
        r"tokens",
    ):
        encode_task_data(exp, data, tok)
    encoded = encode_task_data(_math_experiment(tiny, None), data, tok)
    assert needed_new_tokens(encoded.eval_items)["math"] > 12  # "R 5 2 1 ; A 1 2 5" and its end token


def test_validate_reports_a_cutting_budget_and_each_pool_s_detectable_change(tiny, tmp_path):
    tiny["eval"]["max_new_tokens"] = 4
    cut = invoke("validate", str(write_yaml(tmp_path / "cut.yaml", tiny)))  # in process: validation only
    assert cut.exit_code == 2 and "eval.max_new_tokens=4 cuts task 'math'" in cut.stderr
    tiny["eval"]["max_new_tokens"] = None
    tiny["tasks"]["math"]["eval"] = 100
    ok = invoke("validate", str(write_yaml(tmp_path / "ok.yaml", tiny)))
    assert ok.exit_code == 0, ok.output
    assert "max_new_tokens" in ok.stdout and "(auto)" in ok.stdout
    assert re.search(r"^  math +heldout +n=100 +±0\.\d\d$", ok.stdout, re.M), ok.stdout
    assert re.search(r"^  repeat +heldout +n=4 +none$", ok.stdout, re.M), ok.stdout  # 4 items detect nothing
