"""llava-tiny inside the harness: a micro vision run end to end (store, samples, reloadable checkpoint), the
``debug.drop_images`` bug caught by the probe and by sanity, the model section's checks and part-name unfreezing."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

import data_recipes as dr
from harness.checks.sanity import run_sanity
from harness.config import ConfigError, load_experiment
from harness.core.seesaw import change_tests
from harness.core.store import read_metrics
from harness.data.images import collate_mixed, encode_image_examples
from harness.evaluation.evidence import outcome_rows
from harness.models.image_text import build_llava_tiny, model_part
from harness.models.tokenizer import train_tokenizer
from harness.runs.execution.runner import run_experiment
from harness.training.adapters import prepare_stage_model
from tests.conftest import write_yaml

SMALL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
MICRO_VISION = {
    "name": "vision_micro",
    "seed": 0,
    "world": {"people": 30, "seed": 0},
    "model": {
        "builtin": "llava-tiny",
        "config": {**SMALL, "num_key_value_heads": 1},
        "vision": {**SMALL, "patch_size": 16},
        "tokenizer": {"vocab_size": 400},
    },
    "tasks": {
        "caption": {"recipe": "caption", "train": 40, "eval": 4},
        "shapes_qa": {"recipe": "shapes_qa", "train": 40, "eval": 6},
        "repeat": {"recipe": "repeat", "train": 40, "eval": 4},
    },
    "train": {"batch_size": 4, "optim": {"lr": 3e-3, "warmup": 2}, "log_every": 2},
    "eval": {"every": 4, "splits": ["heldout"]},
    "stages": [
        {
            "name": "align",
            "steps": 3,
            "mixture": {"caption": 1.0},
            "trainable": {"mode": "frozen", "unfreeze": ["projector"]},
        },
        {"name": "instruct", "steps": 4, "mixture": "natural"},
    ],
    "tracking": {"wandb": {"mode": "disabled"}, "console": False},
}


def _experiment(tmp_path, **debug):
    data = copy.deepcopy(MICRO_VISION)
    if debug:
        data["debug"] = debug
    return load_experiment(write_yaml(tmp_path / "vision.yaml", data))


@pytest.fixture(scope="module")
def vision_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("vision")
    run_experiment(_experiment(tmp), tmp / "run")
    return tmp / "run"


def test_micro_vision_run_logs_the_probe_for_every_image_task(vision_run):
    frame = read_metrics(vision_run)
    image_rows = frame.filter(frame["metric"] == "img_dependence")
    assert set(image_rows["task"].to_list()) == {"caption", "shapes_qa"}  # not the text task
    assert set(image_rows["stage"].to_list()) == {"align", "instruct"}
    greedy = frame.filter(frame["metric"] == "greedy")
    assert {"caption", "shapes_qa", "repeat"} <= set(greedy["task"].to_list())  # image tasks sit with text tasks
    n = frame.filter((frame["metric"] == "img_acc_n") & (frame["task"] == "shapes_qa"))["value"].to_list()
    assert n and all(v == 6 for v in n)
    # the image proportions carry n and their Wilson interval in the store's columns, as the text tasks' rows do
    for metric in ("greedy", "img_acc", "img_acc_blank", "img_acc_swapped", "img_dependence"):
        rows = frame.filter((frame["metric"] == metric) & (frame["task"] == "shapes_qa"))
        assert rows.height and rows["n"].to_list() == [6] * rows.height, metric
        assert all(lo <= v <= hi and hi > lo for v, lo, hi in zip(rows["value"], rows["ci_low"], rows["ci_high"]))


def test_micro_vision_samples_name_their_images(vision_run):
    samples = [json.loads(line) for line in (vision_run / "samples.jsonl").read_text().splitlines()]
    image_samples = [s for s in samples if s["task"] == "shapes_qa"]
    assert image_samples and all(s["image_id"] and s["swapped_with"] != s["image_id"] for s in image_samples)
    assert all("pred_blank" in s and "image" not in s for s in image_samples)
    assert all("image_id" not in s for s in samples if s["task"] == "repeat")


def test_image_tasks_enter_the_paired_seesaw_test(vision_run):
    """Image samples carry their 0/1 greedy outcome, so the run's paired test covers image tasks (they were
    silently left out: no outcomes, no tests)."""
    samples = [json.loads(line) for line in (vision_run / "samples.jsonl").read_text().splitlines()]
    frame = read_metrics(vision_run)
    for task in ("caption", "shapes_qa"):
        mine = [s for s in samples if s["task"] == task]
        assert mine and all(s["outcomes"] == {"greedy": int(s["correct"])} for s in mine)
        for (step, stage, split), group in _by_evaluation(mine).items():  # the outcomes give the stored greedy value
            stored = frame.filter(
                (frame["task"] == task)
                & (frame["metric"] == "greedy")
                & (frame["step"] == step)
                & (frame["stage"] == stage)
                & (frame["split"] == split)
            )["value"].to_list()
            assert stored == [sum(s["outcomes"]["greedy"] for s in group) / len(group)]
    tests = change_tests(outcome_rows(samples), ["greedy"])
    assert {"caption", "shapes_qa", "repeat"} <= {t["task"] for t in tests}
    summary = json.loads((vision_run / "summary.json").read_text())
    assert summary["seesaw"]["tests"] == len(change_tests(outcome_rows(samples)))  # the run tested them too


def _by_evaluation(samples: list[dict]) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = {}
    for s in samples:
        out.setdefault((s["step"], s["stage"], s["split"]), []).append(s)
    return out


def test_vision_checkpoint_reloads_with_its_processor(vision_run):
    directory = vision_run / "checkpoints" / "instruct"
    model = AutoModelForImageTextToText.from_pretrained(directory)
    processor = AutoProcessor.from_pretrained(directory)
    examples = dr.get_recipe("shapes_qa")().build("shapes_qa", 4, 2, 0)["heldout"]
    batch = collate_mixed(encode_image_examples(processor, examples), processor.tokenizer.pad_token_id)
    assert int((batch.input_ids == model.config.image_token_id).sum()) == 2 * 4  # (32 / 16)² per image
    with torch.no_grad():
        logits = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, pixel_values=batch.pixel_values
        ).logits
    assert torch.isfinite(logits).all() and logits.shape[-1] == len(processor.tokenizer)


def test_drop_images_is_flagged_by_the_probe_at_the_first_evaluation(tmp_path):
    run_experiment(_experiment(tmp_path, drop_images=True), tmp_path / "run")
    frame = read_metrics(tmp_path / "run")
    dependence = frame.filter(frame["metric"] == "img_dependence")
    first = dependence.filter(dependence["step"] == dependence["step"].min())
    assert first.height == 2 and first["value"].to_list() == [0.0, 0.0]
    assert dependence["value"].max() == 0.0
    gap = frame.filter(frame["metric"] == "img_ll_gap")["value"].to_list()
    assert gap and all(v == 0.0 for v in gap)  # no pixels anywhere: the images cannot move a single logit


def test_sanity_fails_a_run_that_drops_its_images(tmp_path):
    results = run_sanity(
        _experiment(tmp_path, drop_images=True), n=8, threshold=0.95, max_steps=6, checkpoint=None, image_threshold=0.2
    )
    images = {r.name: r for r in results}["images_matter"]
    assert not images.passed and images.value == 0.0 and images.details["items"] >= 2


@pytest.mark.parametrize(
    "change, key",
    [
        ({"vision": {"patch_sise": 16}}, "model.vision.patch_sise"),
        ({"vision": {"patch_size": 7}}, "model.vision.patch_size"),
        ({"text": "llava-tiny"}, "model.text"),
        ({"text": "qwen9-tiny"}, "model.text"),
        ({"builtin": "qwen2-tiny", "vision": {"patch_size": 16}}, "model.vision"),
    ],
)
def test_model_section_errors_name_the_field(tmp_path, change, key):
    data = copy.deepcopy(MICRO_VISION)
    data["model"].update(change)
    with pytest.raises(ConfigError) as info:
        load_experiment(write_yaml(tmp_path / "bad.yaml", data))
    assert key in str(info.value)


def test_unfreeze_by_part_name_covers_the_whole_part():
    qa = dr.get_recipe("shapes_qa")().build("shapes_qa", 20, 2, 0)
    texts = [m["content"] for ex in qa["train"] for m in ex.messages]
    model, _ = build_llava_tiny(
        train_tokenizer(texts, 300), 0, text_overrides={**SMALL, "num_key_value_heads": 1}, vision_overrides=SMALL
    )
    model = prepare_stage_model(model, {"mode": "frozen", "unfreeze": ["language_model"]}, [])
    trained = {model_part(n) for n, p in model.named_parameters() if p.requires_grad}
    frozen = {model_part(n) for n, p in model.named_parameters() if not p.requires_grad}
    assert trained == {"language_model"} and frozen == {"vision_tower", "projector"}
    assert model.lm_head.weight.requires_grad  # the head belongs to the language model


def test_lora_on_an_image_text_model_adapts_the_language_model_only():
    qa = dr.get_recipe("shapes_qa")().build("shapes_qa", 20, 2, 0)
    texts = [m["content"] for ex in qa["train"] for m in ex.messages]
    model, _ = build_llava_tiny(
        train_tokenizer(texts, 300), 0, text_overrides={**SMALL, "num_key_value_heads": 1}, vision_overrides=SMALL
    )
    model = prepare_stage_model(model, {"mode": "lora", "r": 2}, [])
    adapted = {model_part(n.replace("base_model.model.", "")) for n, p in model.named_parameters() if "lora_" in n}
    assert adapted == {"language_model"}
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
