"""``tasks.<name>.system``: a task instruction as a system turn before every example of the task, in every split —
in the model's input, never supervised, and refused where the recipe's examples carry a system turn already."""

from __future__ import annotations

import json

import pytest

from data_recipes.base import Example
from harness.config import Experiment
from harness.data.encoding import IGNORE_INDEX
from harness.data.images import chat_messages
from harness.data.task_data import DataError
from harness.models.tokenizer import train_tokenizer
from harness.runs.planning.prepare import build_task_data, encode_task_data

INSTRUCTION = "Answer yes or no."


def _tokenizer(data):
    texts = [m["content"] for splits in data.splits.values() for ex in splits["train"] for m in ex.messages]
    return train_tokenizer(texts + [INSTRUCTION] * 20, vocab_size=400, min_frequency=1)


def _supervised(tokenizer, enc) -> str:
    return tokenizer.decode([t for t in enc.labels.tolist() if t != IGNORE_INDEX])


def test_the_instruction_leads_every_example_of_its_task_only(tiny):
    tiny["tasks"]["yesno"]["system"] = INSTRUCTION
    tiny["eval"]["splits"] = ["heldout", "heldout_template"]
    plain = build_task_data(
        Experiment.model_validate(
            {
                **tiny,
                "tasks": {
                    name: {k: v for k, v in spec.items() if k != "system"} for name, spec in tiny["tasks"].items()
                },
            }
        )
    )
    data = build_task_data(Experiment.model_validate(tiny))
    for split, examples in data.splits["yesno"].items():
        assert examples, split
        for ex, before in zip(examples, plain.splits["yesno"][split]):
            assert ex.messages == ({"role": "system", "content": INSTRUCTION},) + before.messages
            assert (ex.prompt, ex.answer) == (before.prompt, before.answer)
    for task in ("repeat", "math"):
        assert all(ex.messages[0]["role"] == "user" for exs in data.splits[task].values() for ex in exs), task


def test_the_instruction_is_in_the_input_and_never_supervised(tiny):
    tiny["tasks"]["yesno"]["system"] = INSTRUCTION
    exp = Experiment.model_validate(tiny)
    data = build_task_data(exp)
    tokenizer = _tokenizer(data)
    encoded = encode_task_data(exp, data, tokenizer)
    for enc, ex in zip(encoded.train["yesno"], data.splits["yesno"]["train"]):
        assert INSTRUCTION in tokenizer.decode(enc.input_ids.tolist())
        assert _supervised(tokenizer, enc) == ex.answer + "<|im_end|>"
    items = [it for it in encoded.eval_items if it.task == "yesno"]
    assert items and all(
        INSTRUCTION in it.prompt_text and it.prompt_text.rstrip().endswith("assistant") for it in items
    )
    assert not any(INSTRUCTION in it.prompt_text for it in encoded.eval_items if it.task != "yesno")


def test_an_instruction_on_examples_that_have_a_system_turn_is_refused(tiny, tmp_path):
    rows = [{"prompt": f"q{i}", "answer": f"a{i}", "sys": "Be brief."} for i in range(12)]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    tiny["tasks"] = {
        "mine": {
            "recipe": "jsonl",
            "train": 8,
            "eval": 2,
            "system": INSTRUCTION,
            "params": {"path": str(tmp_path / "qa.jsonl"), "prompt": "prompt", "answer": "answer", "system": "sys"},
        }
    }
    tiny["stages"] = [{"name": "a", "steps": 2, "mixture": {"mine": 1.0}}]
    with pytest.raises(DataError, match=r"tasks\.mine\.system: .*already carry a system turn"):
        build_task_data(Experiment.model_validate(tiny))


def test_an_empty_instruction_is_a_config_error(tiny):
    tiny["tasks"]["yesno"]["system"] = ""
    with pytest.raises(ValueError, match="system"):
        Experiment.model_validate(tiny)


def test_an_image_goes_to_the_first_user_turn_after_the_instruction():
    ex = Example.single("shapes", "What colour is the circle?", "Red.").with_system("Look at the image.")
    structured = chat_messages(ex.messages, with_image=True)
    assert [m["role"] for m in structured] == ["system", "user", "assistant"]
    assert structured[0]["content"] == [{"type": "text", "text": "Look at the image."}]
    assert structured[1]["content"][0] == {"type": "image"}
    with pytest.raises(ValueError, match="already starts with a system turn"):
        ex.with_system("again")


def test_a_task_without_an_instruction_dumps_as_before(tiny):
    """``system`` came after runs and stage-cache entries existed: absent, it is not in the resolved config, so their
    cache keys and recorded configs still match; set, it is."""
    assert all("system" not in spec for spec in Experiment.model_validate(tiny).resolved_dict()["tasks"].values())
    tiny["tasks"]["yesno"]["system"] = INSTRUCTION
    assert Experiment.model_validate(tiny).resolved_dict()["tasks"]["yesno"]["system"] == INSTRUCTION


@pytest.mark.parametrize("train", [40, 0], ids=["trained", "eval-only"])
def test_a_chat_template_without_a_system_role_is_a_data_error_naming_the_task(tiny, train):
    """A hub template that refuses the system role (Gemma's raises) meets ``tasks.<name>.system``: one DataError,
    whether the training pool or (an eval-only task) the evaluation items meet it first."""
    tiny["tasks"]["yesno"].update(system=INSTRUCTION, train=train)
    tiny["stages"] = [{"name": "a", "steps": 4, "mixture": {"repeat": 1.0}}]
    exp = Experiment.model_validate(tiny)
    data = build_task_data(exp)
    tokenizer = _tokenizer(data)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    with pytest.raises(
        DataError, match=r"^tasks\.yesno: the model's chat template refused .*System role not supported"
    ):
        encode_task_data(exp, data, tokenizer)
