"""The plug-in contract (issue 37): every registered plug-in builds from its defaults; a user's recipe and evaluator
in a directory of their own, named under ``plugins:``, run end to end; misspelt names and broken modules are one
line with did-you-mean and exit 2; installed distributions' entry points are discovered (docs/extending.md)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from harness.config import load_experiment
from harness.core import plugins as plugin_imports
from harness.core import registry as registry_module
from harness.core.plugins import Plugin
from harness.core.registry import PLUGIN_REGISTRIES, RECIPES
from harness.runs.planning.code_identity import run_plugins
from tests.conftest import ROOT, invoke

EXAMPLE = ROOT / "docs" / "extending"


@pytest.fixture(autouse=True)
def _registries_restored(monkeypatch):
    """Each test's plug-ins are forgotten after it (registries, imported entries, discovery), so tests are
    independent: a user module registers afresh from every test's own directory."""
    for registry in PLUGIN_REGISTRIES.values():
        registry.names()  # providers imported before the snapshot
    saved = {kind: dict(registry._items) for kind, registry in PLUGIN_REGISTRIES.items()}
    monkeypatch.setattr(plugin_imports, "_imported", dict(plugin_imports._imported))
    modules = set(sys.modules)
    yield
    for kind, registry in PLUGIN_REGISTRIES.items():
        registry._items.clear()
        registry._items.update(saved[kind])
    for name in set(sys.modules) - modules:
        if name.startswith(("harness_plugin_", "lab_ep_")):
            del sys.modules[name]


@pytest.fixture
def lab(tmp_path) -> Path:
    """A user's directory outside the package: the example plug-ins and experiment of docs/extending.md."""
    where = tmp_path / "my_lab"
    where.mkdir()
    for name in ("my_plugins.py", "experiment.yaml"):
        shutil.copy(EXAMPLE / name, where / name)
    return where


def _edit(path: Path, change) -> Path:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


CASES = [(kind, name) for kind, registry in PLUGIN_REGISTRIES.items() for name in registry.names()]


def _build(kind: str, cls: type, params) -> object:
    """An instance of the plug-in from validated ``params``, as the harness builds one of its kind."""
    if kind == "recipes":
        from data_recipes import build_world

        return cls(params, build_world(20, 0) if cls.needs_world else None)
    if kind == "mixture_controllers":
        return cls(np.ones(3), params.model_dump())
    return cls(params)


@pytest.mark.parametrize("kind,name", CASES, ids=[f"{k}:{n}" for k, n in CASES])
def test_every_registered_plugin_of_every_kind_builds_from_its_defaults(kind, name):
    cls = PLUGIN_REGISTRIES[kind].plugin_class(name)
    assert issubclass(cls, Plugin) and cls.name == name
    params = cls.Params.model_validate(cls.example_params)  # Params() where every setting has a default
    if not cls.example_params:
        assert cls.Params() == params
    assert _build(kind, cls, params) is not None
    json.dumps(cls.params_schema())  # what `harness schema` prints
    with pytest.raises(ValueError):  # unknown settings are refused
        cls.Params.model_validate({**cls.example_params, "no_such_setting": 1})


def test_every_plugin_kind_is_covered():
    assert set(PLUGIN_REGISTRIES) == {"recipes", "evaluators", "probes", "mixture_controllers", "model_checks"}
    assert {kind for kind, _ in CASES} == set(PLUGIN_REGISTRIES)


def test_a_user_recipe_and_evaluator_named_in_plugins_run_end_to_end(lab, tmp_path, monkeypatch):
    from harness.config import load_experiment
    from harness.core.store import read_metrics
    from harness.runs.execution.runner import run_experiment

    monkeypatch.chdir(tmp_path)  # the .py path is relative to the experiment file, not to the current directory
    exp = load_experiment(lab / "experiment.yaml")
    assert exp.plugins == [str(lab / "my_plugins.py")]  # resolved: the run directory's copy re-loads anywhere
    run_dir = tmp_path / "run"
    run_experiment(exp, run_dir)

    store = read_metrics(run_dir)
    letters = store.filter((store["task"] == "letters") & (store["metric"] == "loss") & (store["split"] == "train"))
    assert len(letters) > 0 and letters["value"].is_finite().all()  # the user recipe's data was trained on
    lengths = store.filter(store["metric"] == "answer_length")
    assert set(lengths["task"]) == {"letters", "repeat"} and (lengths["value"] >= 0).all()  # the user evaluator
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert any(s["task"] == "letters" and "How many letters" in s["prompt"] for s in samples)
    resolved = yaml.safe_load((run_dir / "config.resolved.yaml").read_text())
    assert resolved["plugins"] == [str(lab / "my_plugins.py")]


def test_plugin_schemas_cover_a_user_plugin_params(lab, monkeypatch, capsys):
    result = invoke("schema", str(lab / "experiment.yaml"))
    assert result.exit_code == 0, result.output
    schema = json.loads(result.stdout)
    assert "plugins" in schema["properties"]
    assert schema["x-plugins"]["recipes"]["count_letters"]["properties"]["max_letters"]["default"] == 6
    assert schema["x-plugins"]["evaluators"]["answer_length"]["properties"]["unit"]["default"] == "chars"
    assert set(schema["x-plugins"]["mixture_controllers"]["doremi"]["properties"]) == {"eta", "smoothing", "reference"}


MISSPELT = {
    "plugin file": (lambda d: d.update(plugins=["my_plugin.py"]), "plugins[0]", "did you mean 'my_plugins.py'?"),
    "plugin module": (lambda d: d.update(plugins=["json.decodr"]), "plugins[0]", "did you mean 'json.decoder'?"),
    "recipe": (
        lambda d: d["tasks"]["letters"].update(recipe="count_leters"),
        "tasks.letters.recipe",
        "did you mean 'count_letters'?",
    ),
    "evaluator": (
        lambda d: d["eval"].update(evaluators=["greedy", "answer_lenght"]),
        "eval.evaluators[1]",
        "did you mean 'answer_length'?",
    ),
    "recipe param": (
        lambda d: d["tasks"]["letters"].update(params={"max_leters": 5}),
        "tasks.letters.params.max_leters",
        "did you mean 'max_letters'?",
    ),
}


@pytest.mark.parametrize("what", list(MISSPELT))
def test_a_misspelt_name_is_one_line_with_did_you_mean_and_exit_2(lab, what):
    change, path, hint = MISSPELT[what]
    result = invoke("validate", str(_edit(lab / "experiment.yaml", change)))
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip().startswith(f"{path}:")]
    assert len(lines) == 1 and hint in lines[0], result.output
    assert "Traceback" not in result.output


def test_an_import_error_in_a_named_plugin_is_one_line_exit_2(lab):
    (lab / "broken.py").write_text("import no_such_package_anywhere\n")
    result = invoke("validate", str(_edit(lab / "experiment.yaml", lambda d: d.update(plugins=["broken.py"]))))
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.output.splitlines() if "plugins[0]" in line]
    assert "broken.py" in line and "ModuleNotFoundError: No module named 'no_such_package_anywhere'" in line
    assert "Traceback" not in result.output


def _installed(site: Path, module: str, source: str) -> None:
    """A distribution installed in ``site`` (a dist-info with an entry point in group harness.plugins)."""
    (site / f"{module}.py").write_text(source)
    info = site / "lab_ep-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lab-ep\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[harness.plugins]\nlab = {module}\n")


ENTRY_POINT_RECIPE = """
from data_recipes import Example, Recipe, register


@register("ep_words")
class EpWords(Recipe):
    def build(self, task, n_train, n_eval, seed):
        make = lambda i: Example.single(task, f"Say w{i}", f"w{i}")
        return {"train": [make(i) for i in range(n_train)], "heldout": [make(-i - 1) for i in range(n_eval)],
                "heldout_template": [Example.single(task, f"Repeat w{i}", f"w{i}") for i in range(n_eval)]}
"""


@pytest.fixture
def fresh_discovery(monkeypatch):
    """Entry points discovered afresh (the process discovered its own at the first lookup)."""
    monkeypatch.setattr(registry_module, "_discovery_started", False)
    monkeypatch.setattr(registry_module, "_discovered", [])


def test_an_installed_distributions_entry_point_plugin_is_discovered(tmp_path, monkeypatch, fresh_discovery, lab):
    _installed(tmp_path, "lab_ep_words", ENTRY_POINT_RECIPE)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "ep_words" in RECIPES  # the first lookup discovers it: no plugins: entry, no import by anyone
    assert registry_module.discover_entry_points() == ["lab_ep_words"]
    assert "lab_ep_words" not in run_plugins(load_experiment(lab / "experiment.yaml"))  # a run not naming it
    experiment = _edit(lab / "experiment.yaml", lambda d: d["tasks"]["letters"].update(recipe="ep_words", params={}))
    result = invoke("validate", str(experiment))
    assert result.exit_code == 0, result.output
    assert "lab_ep_words" in run_plugins(load_experiment(experiment))  # its module is in this run's stage-cache key


def test_a_broken_entry_point_module_is_one_line_exit_2(tmp_path, monkeypatch, fresh_discovery, lab):
    _installed(tmp_path, "lab_ep_broken", "raise RuntimeError('lab misconfigured')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = invoke("validate", str(lab / "experiment.yaml"))
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.output.splitlines() if "lab_ep_broken" in line]
    assert "entry point 'lab' of distribution 'lab-ep'" in line and "RuntimeError: lab misconfigured" in line
