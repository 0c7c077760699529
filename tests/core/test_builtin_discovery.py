"""Built-ins are discovered, not listed (issue 51, item 6): the recipe and mixture-controller packages import every
public module of their folder (``harness.core.registry.import_submodules``), in sorted order, so a new built-in is
one new file."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import data_recipes
import harness.data.steering as steering
import harness.evaluation.components as components
from harness.core.metrics import METRICS
from harness.core.registry import EVALUATORS, MIXTURE_CONTROLLERS, RECIPES, import_submodules

PACKAGES = [
    (data_recipes, RECIPES, r'^@register\("(\w+)"\)'),
    (steering, MIXTURE_CONTROLLERS, r'^@MIXTURE_CONTROLLERS\.plugin\("(\w+)"\)'),
    (components, EVALUATORS, r'^@EVALUATORS\.plugin\("(\w+)"\)'),
]


@pytest.mark.parametrize("package,registry,decorator", PACKAGES, ids=["recipes", "mixture_controllers", "evaluators"])
def test_every_module_of_the_folder_is_imported_and_its_components_registered(package, registry, decorator):
    folder = Path(package.__file__).parent
    public = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))  # evaluators: none yet
    assert package.BUILTIN_MODULES == public  # every one, in a deterministic (sorted) order
    assert all(f"{package.__name__}.{name}" in sys.modules for name in public)
    declared = {name for p in folder.glob("*.py") for name in re.findall(decorator, p.read_text(), re.M)}  # + __init__
    assert declared and declared <= set(registry.names())  # what each file registers is there


def test_a_module_dropped_into_the_package_is_registered(tmp_path, monkeypatch):
    extra = tmp_path / "more_recipes"
    extra.mkdir()
    (extra / "dropped.py").write_text(
        "from data_recipes import Example, Recipe, register\n\n\n"
        '@register("dropped_in")\n'
        "class Dropped(Recipe):\n"
        "    def build(self, task, n_train, n_eval, seed):\n"
        '        return {"train": [Example.single(task, "q", "a")], "heldout": [], "heldout_template": []}\n'
    )
    (extra / "_helper.py").write_text("raise RuntimeError('a private helper is not imported by discovery')\n")
    monkeypatch.setattr(data_recipes, "__path__", [*data_recipes.__path__, str(extra)])
    saved = dict(RECIPES._items)
    try:
        names = import_submodules("data_recipes")
        assert "dropped" in names and "_helper" not in names and names == sorted(names)
        assert RECIPES.get("dropped_in").__name__ == "Dropped"
    finally:
        RECIPES._items.clear()
        RECIPES._items.update(saved)
        sys.modules.pop("data_recipes.dropped", None)


def test_an_evaluator_module_dropped_into_the_components_package_is_registered(tmp_path, monkeypatch):
    extra = tmp_path / "more_components"
    extra.mkdir()
    (extra / "dropped_eval.py").write_text(
        "from harness.core.metrics import proportion\n"
        "from harness.core.registry import EVALUATORS\n"
        "from harness.evaluation.components import Component\n\n\n"
        '@EVALUATORS.plugin("dropped_eval")\n'
        "class DroppedEval(Component):\n"
        '    emits = (proportion("dropped_share"),)\n'
    )
    monkeypatch.setattr(components, "__path__", [*components.__path__, str(extra)])
    saved, declared = dict(EVALUATORS._items), dict(METRICS._items)
    try:
        assert "dropped_eval" in import_submodules("harness.evaluation.components")
        assert EVALUATORS.get("dropped_eval").metric_names == ("dropped_share",)
    finally:
        EVALUATORS._items.clear()
        EVALUATORS._items.update(saved)
        METRICS._items.clear()
        METRICS._items.update(declared)
        sys.modules.pop("harness.evaluation.components.dropped_eval", None)
