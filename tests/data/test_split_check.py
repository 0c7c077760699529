"""The split check (issue 51, item 7; :mod:`data_recipes.split_check`): ``harness validate`` (and every run's
preparation) refuses a recipe whose held-out items are training items or whose pools change between two builds with
the same seed — exit 2, one line naming the task, the split, the count and the first offending item — and every
built-in recipe passes it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from data_recipes import Example, build_world
from data_recipes.split_check import SplitBreach, check_held_out, check_recipe_splits
from harness.core import plugins as plugin_imports
from harness.core.registry import RECIPES
from tests.conftest import ROOT, invoke

PLUGIN = '''
import random

from data_recipes import Example, Recipe, register


def _example(task, i, template="Say {}."):
    return Example.single(task, template.format(f"w{i}"), f"w{i}")


@register("leaky")
class Leaky(Recipe):
    """heldout drawn from the training items: every held-out score would be a training score."""

    def build(self, task, n_train, n_eval, seed):
        train = [_example(task, i) for i in range(n_train)]
        template = [_example(task, i, "{}?") for i in range(n_eval)]
        return {"train": train, "heldout": train[:n_eval], "heldout_template": template}


@register("unseeded")
class Unseeded(Recipe):
    """Draws its words from the module's random, not from random.Random(seed)."""

    def build(self, task, n_train, n_eval, seed):
        words = random.sample(range(10**6), n_train + n_eval)
        train = [_example(task, w) for w in words[:n_train]]
        heldout = [_example(task, w) for w in words[n_train:]]
        template = [_example(task, w, "{}?") for w in words[:n_eval]]
        return {"train": train, "heldout": heldout, "heldout_template": template}
'''


@pytest.fixture(autouse=True)
def _recipes_restored(monkeypatch):
    RECIPES.names()
    saved = dict(RECIPES._items)
    monkeypatch.setattr(plugin_imports, "_imported", dict(plugin_imports._imported))
    modules = set(sys.modules)
    yield
    RECIPES._items.clear()
    RECIPES._items.update(saved)
    for name in set(sys.modules) - modules:
        if name.startswith("harness_plugin_"):
            del sys.modules[name]


def _experiment(tmp_path: Path, recipe: str) -> Path:
    (tmp_path / "recipes.py").write_text(PLUGIN)
    data = yaml.safe_load((ROOT / "docs" / "extending" / "experiment.yaml").read_text())
    data["plugins"] = ["recipes.py"]
    data["tasks"]["letters"] = {"recipe": recipe, "train": 40, "eval": 4}
    data["eval"]["evaluators"] = ["greedy"]
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize(
    "recipe,expected",
    [
        (
            "leaky",
            "tasks.letters (recipe leaky): split heldout: 4 of 4 items are training items (same prompt as a "
            "train item); first: 'Say w0.'",
        ),
        ("unseeded", "tasks.letters (recipe unseeded): split train: "),
    ],
    ids=["heldout-is-train", "unseeded"],
)
def test_validate_refuses_a_broken_split_in_one_line_naming_the_task(tmp_path, recipe, expected):
    result = invoke("validate", str(_experiment(tmp_path, recipe)))
    assert result.exit_code == 2
    (line,) = [line for line in result.output.splitlines() if "tasks.letters" in line]
    assert expected in line
    if recipe == "unseeded":
        assert "differ between two builds with seed" in line and "not deterministic" in line


def _built_ins() -> list[str]:
    from data_recipes.loaders import DatasetLoader

    return [n for n in RECIPES.names() if not issubclass(RECIPES.get(n), DatasetLoader)]


@pytest.mark.parametrize("name", _built_ins())
def test_every_builtin_recipe_passes_the_split_check(name):
    cls = RECIPES.get(name)
    world = build_world(60, 0) if cls.needs_world else None

    def build():
        recipe = cls(cls.Params.model_validate(cls.example_params), world)
        return recipe, recipe.build(name, 24, 6, 11)

    recipe, splits = build()
    check_recipe_splits(recipe, splits, 11, rebuild=lambda: build()[1])


def _ex(prompt: str, answer: str, image_id: str | None = None) -> Example:
    ex = Example.single("t", prompt, answer, **({"image_id": image_id} if image_id else {}))
    return ex if image_id is None else Example(ex.task, ex.messages, ex.meta, image=object())


def test_the_rule_follows_what_each_split_means():
    train = [_ex("What colour?", "red", "scene1"), _ex("Hi", "hello")]
    # an image task repeats its question across splits: the held-out novelty is the image
    check_held_out({"train": train, "heldout": [_ex("What colour?", "blue", "scene2")], "heldout_template": []})
    with pytest.raises(SplitBreach, match="split heldout_template: 1 of 2 items"):
        check_held_out({"train": train, "heldout": [], "heldout_template": [_ex("Hi", "hey"), _ex("Hello", "hi")]})
    # a user's file (loaders): one prompt may carry several answers; only identical rows break the split
    check_held_out({"train": train, "heldout": [_ex("Hi", "hey")], "heldout_template": []}, "prompt_answer")
    with pytest.raises(SplitBreach, match="same prompt and answer"):
        check_held_out({"train": train, "heldout": [_ex("Hi", "hello")], "heldout_template": []}, "prompt_answer")
