"""llava-tiny, image encoding, mixed batches, the image_use probe and a micro training run (no runner involved)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import data_recipes as dr
from harness.checks.pools import pool_report
from harness.config import validate_data
from harness.data.encoding import IGNORE_INDEX, encode_examples
from harness.data.images import collate_mixed, encode_image_examples
from harness.evaluation.image_use import derangement, image_use
from harness.models.image_text import (
    IMAGE_TOKEN,
    build_llava_tiny,
    load_image_text_model,
    model_part,
    parameters_by_part,
)
from harness.models.tokenizer import train_tokenizer
from harness.training.forward import batch_logits

SMALL_TEXT = dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
)
SMALL_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)


@pytest.fixture(scope="module")
def data():
    qa = dr.get_recipe("shapes_qa")().build("shapes_qa", 400, 16, 0)
    count = dr.get_recipe("count")().build("count", 40, 4, 0)
    texts = [f"{m['role']}\n{m['content']}" for ex in qa["train"] + count["train"] for m in ex.messages]
    return qa, count, texts


def small_llava(texts, seed=0, **kwargs):
    return build_llava_tiny(
        train_tokenizer(texts, 300),
        seed,
        text_overrides=kwargs.pop("text", SMALL_TEXT),
        vision_overrides=SMALL_VISION,
        **kwargs,
    )


def test_llava_tiny_shapes_and_reload(data, tmp_path):
    qa, _, texts = data
    model, processor = small_llava(texts)
    assert model.config.text_config.vocab_size == len(processor.tokenizer)
    assert processor.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN) == model.config.image_token_id
    encoded = encode_image_examples(processor, qa["heldout"][:2])
    assert all(int((e.input_ids == model.config.image_token_id).sum()) == 16 for e in encoded)  # (32 / 8)²
    batch = collate_mixed(encoded, processor.tokenizer.pad_token_id)
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, pixel_values=batch.pixel_values
    ).logits
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    again, again_processor = load_image_text_model(str(tmp_path))
    assert type(again).__name__ == "LlavaForConditionalGeneration"
    re_encoded = encode_image_examples(again_processor, qa["heldout"][:2])
    assert all(
        np.array_equal(a.input_ids, b.input_ids) and np.allclose(a.pixel_values, b.pixel_values)
        for a, b in zip(encoded, re_encoded)
    )
    with torch.no_grad():
        assert torch.allclose(
            again(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, pixel_values=batch.pixel_values
            ).logits,
            logits,
            atol=1e-5,
        )
    # harness validate on that saved model: its processor encodes the image task, whose pools are listed
    exp = validate_data(
        {
            "name": "v",
            "model": {"hf": str(tmp_path)},
            "tasks": {"shapes_qa": {"recipe": "shapes_qa", "train": 40, "eval": 4}},
            "eval": {"splits": ["heldout"]},
            "stages": [{"name": "s", "steps": 1, "mixture": {"shapes_qa": 1.0}}],
        }
    )
    assert any(line.split()[:3] == ["shapes_qa", "heldout", "n=4"] for line in pool_report(exp))


def test_parts_name_vision_tower_projector_and_language_model(data):
    model, _ = small_llava(data[2])
    parts = parameters_by_part(model)
    assert set(parts) == {"vision_tower", "projector", "language_model"}
    assert all(".multi_modal_projector." in "." + n for n in parts["projector"])
    assert model_part("model.visual.merger.mlp.0.weight") == "projector"  # Qwen-VL naming
    assert model_part("model.visual.blocks.0.attn.qkv.weight") == "vision_tower"


def test_encoding_is_completion_only_and_text_rows_match_the_text_encoder(data):
    qa, count, texts = data
    model, processor = small_llava(texts)
    tokenizer = processor.tokenizer
    image_ex, text_ex = qa["train"][:3], count["train"][:3]
    encoded = encode_image_examples(processor, image_ex + text_ex)
    for enc, ex in zip(encoded, image_ex + text_ex):
        supervised = enc.input_ids[1:][enc.labels[:-1] != IGNORE_INDEX]
        assert tokenizer.decode(supervised) == ex.answer + "<|im_end|>"
        image_positions = enc.input_ids == model.config.image_token_id
        assert (enc.labels[np.flatnonzero(image_positions[1:])] == IGNORE_INDEX).all()  # shifted labels
        assert tokenizer.decode(enc.input_ids[: enc.prompt_length]).endswith("<|im_start|>assistant\n")
        assert enc.has_image == (ex.image is not None)
    for enc, ref in zip(encoded[3:], encode_examples(tokenizer, text_ex)):
        assert np.array_equal(enc.input_ids, ref.input_ids) and np.array_equal(enc.labels, ref.labels)


def test_mixed_batch_forward_backward_reaches_projector(data):
    qa, count, texts = data
    model, processor = small_llava(texts)
    encoded = encode_image_examples(processor, [count["train"][0], qa["train"][0], count["train"][1], qa["train"][1]])
    batch = collate_mixed(encoded, processor.tokenizer.pad_token_id)
    assert batch.image_rows == (1, 3) and batch.pixel_values.shape[0] == 2
    logits = batch_logits(model, batch)
    loss = torch.nn.functional.cross_entropy(logits, batch.labels.flatten()[batch.supervised])
    loss.backward()
    assert math.isfinite(loss.item())
    projector = model.model.multi_modal_projector
    assert projector.linear_1.weight.grad.abs().sum() > 0 and projector.linear_2.weight.grad.abs().sum() > 0
    # Each image lands in its own row: row 3 alone gives the same logits as inside the mixed batch.
    with torch.no_grad():
        alone = collate_mixed([encoded[3]], processor.tokenizer.pad_token_id)
        full = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, pixel_values=batch.pixel_values
        ).logits[3, : encoded[3].length]
        single = model(
            input_ids=alone.input_ids, attention_mask=alone.attention_mask, pixel_values=alone.pixel_values
        ).logits[0]
    assert torch.allclose(full, single, atol=1e-4)


def test_training_forward_of_an_image_batch_is_the_models_own_logits_with_its_images(data):
    qa, count, texts = data
    model, processor = small_llava(texts)
    encoded = encode_image_examples(processor, [count["train"][0], qa["train"][0], count["train"][1]])
    batch = collate_mixed(encoded, processor.tokenizer.pad_token_id)
    with torch.no_grad():
        own = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, pixel_values=batch.pixel_values)
        blind = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
        picked = batch_logits(model, batch)
    reference = own.logits.flatten(0, 1)[batch.supervised]
    # The head at the supervised positions only vs the full logits gathered: the same products, summed in whatever
    # order each matmul picks. Not a measured tolerance: float32 rounding of a dot product over hidden_size terms.
    bound = model.config.text_config.hidden_size * torch.finfo(torch.float32).eps * reference.abs().max()
    assert (picked - reference).abs().max() <= bound
    assert (blind.logits.flatten(0, 1)[batch.supervised] - reference).abs().max() > bound  # the images count


def test_a_ranks_slice_of_an_image_batch_keeps_the_images_of_its_rows(data):
    from harness.training.parallel import DataParallel

    qa, count, texts = data
    model, processor = small_llava(texts)
    rows = [qa["train"][0], count["train"][0], count["train"][1], qa["train"][1]]  # images in rows 0 and 3
    batch = collate_mixed(encode_image_examples(processor, rows), processor.tokenizer.pad_token_id)
    assert batch.image_rows == (0, 3)
    hooks = object.__new__(DataParallel)  # the slicing needs no process group
    hooks.world = 2
    with torch.no_grad():
        whole = batch_logits(model, batch)
        parts = []
        for rank in range(2):
            hooks.rank = rank
            part = hooks.shard(batch)
            assert part.image_rows == ((0,) if rank == 0 else (1,))
            assert torch.equal(part.pixel_values, batch.pixel_values[rank : rank + 1])
            parts.append(batch_logits(model, part))
    # each row computed at the batch's width either way; bound as above (rounding, not a measured tolerance)
    bound = model.config.text_config.hidden_size * torch.finfo(torch.float32).eps * whole.abs().max()
    assert (torch.cat(parts) - whole).abs().max() <= bound


def test_drop_images_keeps_tokens_but_not_pixel_content(data):
    qa, _, texts = data
    model, processor = small_llava(texts)
    encoded = encode_image_examples(processor, qa["train"][:2])
    dropped = collate_mixed(encoded, processor.tokenizer.pad_token_id, drop_images=True)
    assert dropped.image_rows == (0, 1) and dropped.pixel_values.shape[0] == 2
    assert not dropped.pixel_values.any()  # the vision path stays in the graph, the image content does not
    assert (dropped.input_ids == model.config.image_token_id).sum() == 32
    swapped = collate_mixed(
        encode_image_examples(processor, qa["train"][:2], [qa["train"][5].image] * 2),
        processor.tokenizer.pad_token_id,
        drop_images=True,
    )
    with torch.no_grad():  # without pixel content, the image cannot matter: the seed's bug
        assert torch.equal(batch_logits(model, dropped), batch_logits(model, swapped))


def test_qwen3_5_backbone_in_bf16_autocast_is_finite(data):
    qa, count, texts = data
    text = dict(
        SMALL_TEXT,
        num_hidden_layers=2,
        head_dim=16,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
    )
    model, processor = build_llava_tiny(
        train_tokenizer(texts, 300), 0, text="qwen3_5-tiny", text_overrides=text, vision_overrides=SMALL_VISION
    )
    assert model.config.text_config.model_type == "qwen3_5_text"
    batch = collate_mixed(
        encode_image_examples(processor, qa["train"][:2] + count["train"][:2]), processor.tokenizer.pad_token_id
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = batch_logits(model, batch)
    loss = torch.nn.functional.cross_entropy(logits.float(), batch.labels.flatten()[batch.supervised])
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_derangement_moves_every_item():
    import random

    for n in (2, 3, 10):
        for seed in range(20):
            perm = derangement(n, random.Random(seed))
            assert sorted(perm) == list(range(n)) and all(p != i for i, p in enumerate(perm))


def _probe(model, processor, examples):
    recipe = dr.get_recipe("shapes_qa")()
    (stats,) = image_use(model, processor, examples, {"shapes_qa": recipe}, "heldout", batch_size=8, max_new_tokens=8)
    return stats


def test_probe_reports_zero_dependence_for_a_model_blind_to_images(data):
    qa, _, texts = data
    model, processor = small_llava(texts)
    projector = model.model.multi_modal_projector
    with torch.no_grad():  # every image feature becomes exactly 0: the image cannot reach the language model
        projector.linear_2.weight.zero_()
        projector.linear_2.bias.zero_()
    stats = _probe(model, processor, qa["heldout"])
    assert stats.dependence.value == 0 and stats.dependence.n == 16
    assert stats.ll_gap == 0
    assert stats.acc.value == stats.acc_blank.value == stats.acc_swapped.value
    assert {row[2] for row in stats.rows()} >= {
        "img_acc",
        "img_acc_blank",
        "img_acc_swapped",
        "img_dependence",
        "img_ll_gap",
        "img_dependence_n",
        "img_dependence_lo",
    }


@pytest.fixture(scope="module")
def trained(data):
    """llava-tiny after 60 AdamW steps on shapes_qa (micro size), with its per-step losses."""
    qa, _, texts = data
    model, processor = small_llava(texts)
    encoded = encode_image_examples(processor, qa["train"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(60):
        batch = collate_mixed(
            [encoded[i] for i in rng.choice(len(encoded), 16, replace=False)], processor.tokenizer.pad_token_id
        )
        logits = batch_logits(model, batch)
        loss = torch.nn.functional.cross_entropy(logits, batch.labels.flatten()[batch.supervised])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return model, processor, losses


def test_micro_training_lowers_loss_and_the_probe_runs(data, trained):
    qa, _, _ = data
    model, processor, losses = trained
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    stats = _probe(model, processor, qa["heldout"][:8])
    assert stats.acc.n == 8 and math.isfinite(stats.ll_gap)
    assert len(stats.items) == 8 and all(isinstance(i["pred_real"], str) for i in stats.items)


def test_probe_detects_a_model_that_reads_its_images(data):
    qa, _, texts = data
    model, processor = small_llava(texts)
    # Constructed dependence: the text carries nothing (zero token embeddings; a random LM head, untied from
    # them), so the image features are the only input that can move the answer; pixel content is scaled above
    # the vision tower's position embeddings so that the features differ from image to image.
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.model.vision_tower.embeddings.patch_embedding.weight.mul_(50.0)
        model.get_input_embeddings().weight.zero_()
        head = torch.randn(model.lm_head.weight.shape, generator=generator)
    model.lm_head.weight = torch.nn.Parameter(head)
    stats = _probe(model, processor, qa["heldout"])
    assert stats.dependence.value > 0 and stats.dependence.lo > 0
    assert stats.ll_gap != 0
    assert {i["image_id"] for i in stats.items} == {e.meta["image_id"] for e in qa["heldout"]}
    assert all(i["swapped_with"] != i["image_id"] for i in stats.items)
