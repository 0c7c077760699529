"""Image recipes: split contract for images (held-out combinations never trained), determinism, and that each
image really shows what its gold answer says."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

import data_recipes as dr
from data_recipes import SPLITS, get_recipe
from data_recipes._shapes import _CENTRES, COLOURS, ShapesParams, heldout_triples

IMAGE_TASKS = ["shapes_qa", "shapes_yesno", "count_shapes", "position", "caption"]


def build(name, n_train=200, n_eval=16, seed=0, **params):
    cls = get_recipe(name)
    return cls(cls.Params(**params)).build(name, n_train, n_eval, seed)


def triples_of(ex) -> set[tuple[str, str, str]]:
    scene = ex.meta["image_id"].split("~")[0]
    return {tuple(obj.replace("@", "-").split("-")) for obj in scene.split("|")}


def test_image_recipes_registered_and_flagged():
    for name in IMAGE_TASKS:
        assert get_recipe(name).has_images
    assert not get_recipe("count").has_images  # the letter-counting text task is untouched


@pytest.mark.parametrize("name", IMAGE_TASKS)
def test_sizes_and_image_field(name):
    s = build(name, image_size=40)
    assert [len(s[k]) for k in SPLITS] == [200, 16, 16]
    for ex in (ex for k in SPLITS for ex in s[k]):
        assert ex.image.size == (40, 40) and ex.image.mode == "RGB"
        assert [m["role"] for m in ex.messages] == ["user", "assistant"]
        assert all(isinstance(m["content"], str) and m["content"] for m in ex.messages)
        assert ex.meta["image_id"] == ex.meta["item"]


@pytest.mark.parametrize("name", IMAGE_TASKS)
def test_deterministic_per_seed(name):
    a, b, other = build(name), build(name), build(name, seed=1)
    for split in SPLITS:
        assert [(e.messages, e.meta) for e in a[split]] == [(e.messages, e.meta) for e in b[split]]
        assert all(np.array_equal(np.asarray(x.image), np.asarray(y.image)) for x, y in zip(a[split], b[split]))
    assert [e.meta["image_id"] for e in other["train"]] != [e.meta["image_id"] for e in a["train"]]


@pytest.mark.parametrize("name", IMAGE_TASKS)
@pytest.mark.parametrize("holdout", ["triple", "pair"])
def test_heldout_combinations_never_trained(name, holdout):
    params = dict(holdout=holdout)
    held = heldout_triples(ShapesParams(**params))
    s = build(name, n_train=400, **params)
    for ex in s["train"] + s["heldout_template"]:
        assert not triples_of(ex) & held, ex.meta
    for ex in s["heldout"]:
        target = tuple(ex.meta["target"].replace("@", "-").split("-"))
        assert target in held and triples_of(ex) & held == {target}
    if holdout == "pair":  # a held-out (colour, shape) pair is never seen anywhere in training
        held_pairs = {(c, sh) for c, sh, _ in held}
        assert not {(c, sh) for ex in s["train"] for c, sh, _ in triples_of(ex)} & held_pairs


def test_every_image_task_holds_out_the_same_combinations():
    held_targets = {
        name: {ex.meta["target"] for seed in (0, 1) for ex in build(name, seed=seed)["heldout"]} for name in IMAGE_TASKS
    }
    held = {f"{c}-{s}@{p}" for c, s, p in heldout_triples(ShapesParams())}
    assert all(targets <= held for targets in held_targets.values())
    for name in IMAGE_TASKS:  # no task trains on another task's held-out combination
        assert not {f"{c}-{s}@{p}" for ex in build(name)["train"] for c, s, p in triples_of(ex)} & held


def test_holdout_keeps_every_attribute_in_training():
    held = heldout_triples(ShapesParams())
    assert 0 < len(held) < 96
    train_triples = {(c, s, p) for ex in build("caption", n_train=500)["train"] for c, s, p in triples_of(ex)}
    for axis in range(3):
        assert {t[axis] for t in held} <= {t[axis] for t in train_triples}


@pytest.mark.parametrize("name", IMAGE_TASKS)
def test_heldout_template_is_new_wording_on_trained_images(name):
    s = build(name)
    train_templates = {e.meta["template"] for e in s["train"]}
    train_images = {e.meta["image_id"] for e in s["train"]}
    assert not {e.meta["template"] for e in s["heldout_template"]} & train_templates
    assert not {e.prompt for e in s["heldout_template"]} & {e.prompt for e in s["train"]}
    assert {e.meta["image_id"] for e in s["heldout_template"]} <= train_images
    assert {e.meta["template"] for e in s["heldout"]} <= train_templates


@pytest.mark.parametrize("name", IMAGE_TASKS)
def test_gold_answers_score_and_have_the_mode(name):
    cls = get_recipe(name)
    recipe = cls(cls.Params())
    for ex in (ex for split in build(name).values() for ex in split):
        assert recipe.is_correct(ex.answer, ex.answer) and recipe.mode_ok(ex.answer)
        assert recipe.is_correct(" " + ex.answer.upper() + " ", ex.answer)


def test_image_shows_each_object_at_its_slot():
    """The pixel at each slot centre has the colour of the object the image id puts there; empty slots are
    background — so the answers are readable from the pixels alone."""
    size = 64
    for ex in build("caption", n_train=60, image_size=size)["train"]:
        pixels = np.asarray(ex.image)
        placed = {p: c for c, _, p in triples_of(ex)}
        for position, (fx, fy) in _CENTRES.items():
            rgb = tuple(pixels[int(fy * size), int(fx * size)])
            assert rgb == (COLOURS[placed[position]] if position in placed else (255, 255, 255)), ex.meta


def test_grid_layout_puts_each_object_inside_one_patch():
    """layout: grid — with patch = side / 3, each object's pixels lie in its own edge cell (one image token) and
    the centre and corner cells stay empty."""
    size, cell = 48, 16
    cells = {"top": (1, 0), "bottom": (1, 2), "left": (0, 1), "right": (2, 1)}
    for ex in build("caption", n_train=60, image_size=size, layout="grid")["train"]:
        pixels = np.asarray(ex.image).reshape(3, cell, 3, cell, 3)
        placed = {p: c for c, _, p in triples_of(ex)}
        for column, row in itertools.product(range(3), range(3)):
            colours = {tuple(rgb) for rgb in pixels[row, :, column, :].reshape(-1, 3)} - {(255, 255, 255)}
            position = next((p for p, xy in cells.items() if xy == (column, row)), None)
            assert colours == ({COLOURS[placed[position]]} if position in placed else set()), (ex.meta, position)


def test_answer_balance():
    qa = Counter(e.meta["kind"] for e in build("shapes_qa")["train"])
    assert qa["colour"] == qa["shape"] == 100
    yn = Counter(e.answer for e in build("shapes_yesno")["train"])
    assert yn["Yes."] == yn["No."] == 100
    counts = Counter(e.answer for e in build("count_shapes")["train"])
    assert set(counts) == {"1", "2", "3", "4"}
    positions = Counter(e.answer for e in build("position")["train"])
    assert set(positions) == {"top", "bottom", "left", "right"}


def test_no_answers_are_near_misses():
    for ex in build("shapes_yesno")["train"]:
        colour, shape = ex.prompt.split(" a ")[-1].rstrip("?").split()[:2]
        present = {(c, s) for c, s, _ in triples_of(ex)}
        assert ((colour, shape) in present) == (ex.answer == "Yes.")
        if ex.answer == "No.":  # one attribute matches an object in the picture
            assert any(c == colour or s == shape for c, s in present)


def test_scoring():
    qa, count = get_recipe("shapes_qa")(), get_recipe("count_shapes")()
    assert qa.is_correct("Red.", "red") and not qa.is_correct("blue", "red")
    assert qa.mode_ok("triangle") and not qa.mode_ok("Yes.")
    assert count.is_correct(" 3 ", "3") and not count.is_correct("three", "3")
    assert get_recipe("shapes_yesno")().is_correct("Yes, there is.", "Yes.")


def test_impossible_sizes_are_value_errors():
    with pytest.raises(ValueError):
        build("shapes_qa", n_train=10_000_000)
    with pytest.raises(ValueError):
        ShapesParams(min_objects=3, max_objects=2)


def test_importing_recipes_still_needs_no_torch():
    import subprocess
    import sys

    code = "import sys, data_recipes; print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )
    assert dr.RECIPES.names()
