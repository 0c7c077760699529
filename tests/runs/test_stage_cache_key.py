"""What the stage-cache key covers (harness.runs.planning.stage_key.stage_keys): every field of the schema, changed one
at a
time to a valid different value, misses from the stage it affects on — or is one of the documented ``NOT_SHAPING``
fields and shares the entries; the code that shapes a stage is in the key (an edited copy of one module misses) and
nothing else of the tree (editor leftovers, modules run after training); and so is what else computes a stage: the
libraries' versions, the GPU, the files of an ``include_path`` benchmark task.

Keys only: nothing here trains, so the whole schema is walked in seconds."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import shutil
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import pytest
import torch
from pydantic import BaseModel

from harness.config import Experiment, TrainSpec
from harness.data.task_data import task_data_hash
from harness.runs.planning import code_identity
from harness.runs.planning.code_identity import AFTER_TRAINING
from harness.runs.planning.prepare import build_task_data
from harness.runs.planning.stage_key import NOT_SHAPING, STAGE_NOT_SHAPING, stage_keys
from harness.training import compiling
from tests.conftest import ROOT, TINY

STAGE = 1  # the stage whose own fields are changed (of three)


def _experiment() -> dict:
    """The tiny experiment with three stages, each overriding *every* train field: a top-level train field then
    reaches a stage only where the harness reads ``exp.train`` directly (the eval items' ``max_length``: the defect
    the old key missed)."""
    exp = copy.deepcopy(TINY)
    exp["model"]["pretrain"]["seq_len"] = 32
    full = TrainSpec.model_validate(exp["train"]).model_dump(mode="json")
    exp["stages"] = [
        {"name": n, "steps": 4, "mixture": m, **copy.deepcopy(full)}
        for n, m in (("a", {"repeat": 1.0}), ("b", {"repeat": 0.5, "yesno": 0.5}), ("c", {"math": 1.0}))
    ]
    return exp


# Values for fields whose type says too little (free strings, dicts of recipe- or architecture-specific keys), and
# the value an optional section is set to before its fields are changed. Keys: the field's path with a leading
# ``train.`` / ``stages.<i>.`` / ``tasks.<name>.`` dropped (``@stage`` marks a stage's own fields).
EXPLICIT: dict[str, Any] = {
    "name": "renamed",
    "plugins": ["my_lab.tasks"],  # validated by the schema only here (the module is imported by load_experiment)
    "seeds": [1, 2],
    "model.builtin": "llama-tiny",
    "model.hf": "org/a-model",
    "model.revision": "main",
    "model.text": "qwen2-tiny",
    "model.vision": {"image_size": 32},
    "model.config": {
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    },
    "tasks.recipe": "yesno",
    "tasks.params": {"max_words": 2},
    "tasks.system": "Answer briefly.",
    "trainable.target_modules": ["q_proj"],
    "trainable.unfreeze": ["lm_head"],
    "loss.task_weights": {"math": 2.0},
    "optim.betas": [0.8, 0.9],
    "eval.evaluators": ["greedy"],
    "eval.probes": [],
    "eval.hijack_words": ["yes"],
    "eval.splits": ["heldout", "train"],
    "eval.benchmarks": [{"task": "world_mc", "limit": 10}],
    "eval.reference_text": str(ROOT / "README.md"),  # any text file: its lines are the forgetting probe's documents
    "tracking.wandb.project": "other",
    "tracking.wandb.entity": "me",
    "tracking.wandb.group": "g",
    "tracking.wandb.tags": ["t"],
    "name@stage": "renamed",
    "init@stage": "a",
    "mixture@stage": {"repeat": 0.3, "yesno": 0.7},
    "debug.inject_nonfinite": {"step": 2, "module": "lm_head"},
    "debug.kill_rank": {"step": 2},
    "debug.inject_nonfinite.module": "embed",
}
TASK = "repeat"  # the task whose fields are changed
# Fields with a single valid value: nothing to change them to.
ONE_VALUE = {"model.pretrain.corpus"}


def _short(path: tuple) -> str:
    names = [str(p) for p in path]
    if names[0] == "stages":
        rest = names[2:]
        return (
            f"{rest[0]}@stage" if len(rest) == 1 and rest[0] in ("name", "steps", "init", "mixture") else ".".join(rest)
        )
    if names[0] == "tasks":
        return ".".join(["tasks", *names[2:]])
    return ".".join(names[1:] if names[0] == "train" else names)


def _explicit(path: tuple) -> Any:
    return copy.deepcopy(EXPLICIT[_short(path)])


UNIONS = (Union, types.UnionType)  # Optional[X] and X | None


def _strip_optional(annotation: Any) -> Any:
    if typing.get_origin(annotation) in UNIONS:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else Union[tuple(args)]  # noqa: UP007 — a union of a runtime tuple
    return annotation


def _model_of(annotation: Any) -> type[BaseModel] | None:
    inner = _strip_optional(annotation)
    return inner if isinstance(inner, type) and issubclass(inner, BaseModel) else None


def _candidates(annotation: Any, current: Any) -> list[Any]:
    """Generic values of ``annotation`` to try in order (the first valid one different from ``current`` is used)."""
    inner = _strip_optional(annotation)
    options = typing.get_args(inner) if typing.get_origin(inner) in UNIONS else (inner,)
    out: list[Any] = []
    for option in options:
        if typing.get_origin(option) is Literal:
            out += list(typing.get_args(option))
        elif option is bool:
            out += [True, False] if current != True else [False]  # noqa: E712 (current may be "auto")
        elif option is int:
            out += [(current or 0) + 1, 5]
        elif option is float:
            out += [current / 2 if current else 0.1, 0.3]
        elif typing.get_origin(option) is list and typing.get_origin(typing.get_args(option)[0]) is Literal:
            out += [[*current, v] for v in typing.get_args(typing.get_args(option)[0]) if v not in current]
    return out


@dataclass
class Case:
    path: tuple
    before: dict
    after: dict


def _get(spec: dict, path: tuple) -> Any:
    for p in path:
        spec = spec[p]
    return spec


def _set(spec: dict, path: tuple, value: Any) -> dict:
    spec = copy.deepcopy(spec)
    target = spec
    for p in path[:-1]:
        target = target[p]
    target[path[-1]] = value
    return spec


def _valid(spec: dict) -> bool:
    try:
        Experiment.model_validate(spec)
        return True
    except ValueError:
        return False


def _change(spec: dict, path: tuple, annotation: Any) -> dict:
    """``spec`` with the field at ``path`` set to a valid different value."""
    current = _get(spec, path)
    values = [_explicit(path)] if _short(path) in EXPLICIT else _candidates(annotation, current)
    for value in values:
        if value != current:
            changed = _set(spec, path, value)
            if path[-1] == "hf":  # a hub model replaces the builtin one (config and pretrain are builtin-only)
                changed["model"] = {"hf": value}
            if _valid(changed):
                return changed
    assert ".".join(map(str, path)) in ONE_VALUE, f"no valid different value for {path} (add one to EXPLICIT)"
    return None


def cases() -> list[Case]:
    """One case per field of every section (tasks: one task's fields; stages: stage ``STAGE``'s fields)."""
    out: list[Case] = []

    def walk(model: type[BaseModel], spec: dict, prefix: tuple) -> None:
        for name, info in model.model_fields.items():
            path = (*prefix, name)
            here = _get(spec, prefix)
            nested = _model_of(info.annotation)
            if name == "tasks":
                walk(typing.get_args(info.annotation)[1], spec, (*path, TASK))
            elif name == "stages":
                walk(typing.get_args(info.annotation)[0], spec, (*path, STAGE))
            elif nested is not None and here.get(name) is None and _short(path) in EXPLICIT:
                after = _set(spec, path, _explicit(path))  # an optional section: setting it is the change
                out.append(Case(path, spec, after))
                walk(nested, after, path)  # and each of its fields, with it set
            elif nested is not None:
                if here.get(name) is None:  # a section left to its defaults: written out, then walked
                    spec = _set(spec, path, info.get_default(call_default_factory=True).model_dump(mode="json"))
                walk(nested, spec, path)
            else:
                if name not in here:  # a field left to its default: set explicitly, so only the change differs
                    spec = _set(spec, path, info.get_default(call_default_factory=True))
                after = _change(spec, path, info.annotation)
                if after is not None:
                    out.append(Case(path, spec, after))

    walk(Experiment, _experiment(), ())
    return out


def _listed(path: tuple) -> str | None:
    """The NOT_SHAPING entry covering ``path`` (a stage's train field is listed as ``train.<field>``)."""
    names = [str(p) for p in path if not isinstance(p, int)]
    if names[0] == "stages":
        return f"train.{names[1]}" if names[1] in STAGE_NOT_SHAPING and len(names) == 2 else None
    for depth in range(len(names), 0, -1):
        if ".".join(names[:depth]) in NOT_SHAPING:
            return ".".join(names[:depth])
    return None


_data_hashes: dict[str, str] = {}


def _keys(spec: dict) -> list[str]:
    exp = Experiment.model_validate(spec)
    data_key = exp.model_dump_json(include={"world", "tasks", "seed", "data_seed"})
    if data_key not in _data_hashes:  # the same task data is built once
        data = build_task_data(exp)
        _data_hashes[data_key] = task_data_hash(data.splits, data.corpus)
    return stage_keys(exp, "base", _data_hashes[data_key], "cpu", code="code")


CASES = cases()


def test_the_walk_covers_every_section_and_the_defect_field():
    paths = {".".join(map(str, c.path)) for c in CASES}
    assert {
        "train.max_length",
        "stages.1.max_length",
        "stages.1.optim.lr",
        "model.pretrain.steps",
        "tasks.repeat.params",
        "eval.seesaw_alpha",
        "debug.inject_nonfinite.module",
        "tracking.wandb.project",
        "data.too_long",
        "world.people",
        "data_seed",
    } <= paths
    assert len(CASES) > 100


@pytest.mark.parametrize("case", CASES, ids=lambda c: ".".join(map(str, c.path)))
def test_every_field_misses_from_the_stage_it_shapes_or_is_listed_as_not_shaping(case, monkeypatch):
    monkeypatch.setattr(compiling, "can_compile", lambda device_type: True)  # compile: true is a valid value here
    before, after = _keys(case.before), _keys(case.after)
    listed = _listed(case.path)
    if listed is not None:
        assert before == after, f"{listed} is documented as not shaping a stage, yet it changes the key"
        return
    first = case.path[1] if case.path[0] == "stages" else 0
    assert before[:first] == after[:first], "a later stage's field changed an earlier stage's key"
    assert all(b != a for b, a in zip(before[first:], after[first:])), (
        f"{'.'.join(map(str, case.path))} shapes a stage but the key ignores it (add it to the key, or to "
        "NOT_SHAPING with the reason it cannot change a stage's numbers)"
    )


def test_the_not_shaping_list_is_short_and_says_why():
    assert len(NOT_SHAPING) <= 10 and all(len(why) > 20 for why in NOT_SHAPING.values())


# -- the code -----------------------------------------------------------------------------------------------------


@pytest.fixture
def code_copy(tmp_path) -> Path:
    """A copy of the files the code hash reads (the harness and data_recipes)."""
    root = tmp_path / "repo"
    for rel in code_identity.shaping_files():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(code_identity.REPO / rel, root / rel)
    for rel in ("harness/runs/execution/console.py", *AFTER_TRAINING):
        shutil.copy2(code_identity.REPO / rel, root / rel)
    return root


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def _keys_of_code(root: Path, spec: dict) -> list[str]:
    exp = Experiment.model_validate(spec)
    data = build_task_data(exp)
    return stage_keys(
        exp, "base", task_data_hash(data.splits, data.corpus), "cpu", code=code_identity.code_fingerprint(root)
    )


def test_an_edited_copy_of_a_shaping_module_misses_and_a_comment_does_not(code_copy, monkeypatch):
    monkeypatch.setattr(compiling, "can_compile", lambda device_type: True)
    spec = _experiment()
    before = _keys_of_code(code_copy, spec)
    assert before == _keys_of_code(code_copy, spec)
    assert code_identity.code_fingerprint() == code_identity.code_fingerprint(code_identity.REPO)

    losses = code_copy / "harness" / "training" / "losses.py"
    _edit(losses, '"""', '"""A docstring edited. ')  # docstrings and comments do not shape numbers: same key
    losses.write_text(losses.read_text() + "\n# a comment\n")
    code_identity._cached.cache_clear()
    assert _keys_of_code(code_copy, spec) == before

    _edit(
        code_copy / "harness" / "runs" / "execution" / "console.py", "PLAIN_EVERY_S = 30.0", "PLAIN_EVERY_S = 31.0"
    )  # prints only
    code_identity._cached.cache_clear()
    assert _keys_of_code(code_copy, spec) == before

    _edit(losses, "import", "import math as _edited\nimport")  # a code change in a module that shapes the loss
    code_identity._cached.cache_clear()
    after = _keys_of_code(code_copy, spec)
    assert all(a != b for a, b in zip(before, after))


def test_editor_leftovers_and_modules_run_after_training_keep_the_code_hash(code_copy):
    before = code_identity.code_fingerprint(code_copy)
    training = code_copy / "harness" / "training"
    for name in (".losses.py.swp", "losses.py~", "#losses.py#", ".#losses.py", "notes.txt"):
        (training / name).write_text("stray\n")
    for rel in AFTER_TRAINING:  # the seesaw of the whole run, its simulations: after the last stage is stored
        (code_copy / rel).write_text((code_copy / rel).read_text() + "\nEDITED = 1\n")
    code_identity._cached.cache_clear()
    assert code_identity.code_fingerprint(code_copy) == before
    (training / "new_module.py").write_text("VALUE = 1\n")  # a source file that does count
    code_identity._cached.cache_clear()
    assert code_identity.code_fingerprint(code_copy) != before


def test_a_recipe_edit_misses(code_copy):
    spec = _experiment()
    spec["stages"] = spec["stages"][:1]
    before = _keys_of_code(code_copy, spec)
    recipe = next((code_copy / "data_recipes").glob("count.py"))
    recipe.write_text(recipe.read_text() + "\nEDITED = 1\n")
    code_identity._cached.cache_clear()
    assert _keys_of_code(code_copy, spec) != before


def test_the_code_hash_names_the_layers_that_shape_numbers():
    files = {p.as_posix() for p in code_identity.shaping_files()}
    assert {
        "harness/training/losses.py",
        "harness/evaluation/passes.py",
        "harness/runs/planning/prepare.py",
        "harness/runs/execution/runner.py",
        "harness/core/stats.py",
        "harness/config/schema.py",
        "data_recipes/count.py",
    } <= files
    assert not {"harness/runs/execution/console.py", "harness/runs/execution/tracking.py", "harness/cli/app.py"} & files


def test_every_run_module_is_placed_in_or_out_of_the_code_hash():
    runs = ROOT / "harness" / "runs"
    modules = {p.relative_to(runs).with_suffix("").as_posix() for p in runs.rglob("*.py")}
    shaping, not_shaping = set(code_identity.SHAPING_RUN_MODULES), set(code_identity.NOT_SHAPING_RUN_MODULES)
    assert not shaping & not_shaping
    assert modules == shaping | not_shaping, "place each module of harness/runs in one list of code_identity"


def test_file_digests_are_remembered_by_path_size_and_mtime(code_copy, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    first = code_identity.fingerprint_of(code_copy, code_identity.shaping_files(code_copy))
    memo = json.loads((tmp_path / "cache" / code_identity.MEMO).read_text())
    assert len(memo) == len(code_identity.shaping_files(code_copy))  # copied files keep their (old) mtimes
    monkeypatch.setattr(code_identity, "file_digest", lambda path: pytest.fail(f"{path} parsed again"))
    assert code_identity.fingerprint_of(code_copy, code_identity.shaping_files(code_copy)) == first


# -- what else computes a stage --------------------------------------------------------------------------------------


def _one_stage() -> dict:
    spec = _experiment()
    spec["stages"] = spec["stages"][:1]
    return spec


def _versions(monkeypatch, **fake: str) -> None:
    """``importlib.metadata.version`` as if the distributions named (``_`` for ``-``) had these versions."""
    real = importlib.metadata.version
    fake = {name.replace("_", "-"): v for name, v in fake.items()}
    monkeypatch.setattr(importlib.metadata, "version", lambda name: fake.get(name) or real(name))


def test_peft_and_kernel_versions_are_in_the_key(monkeypatch):
    spec = _one_stage()
    before = _keys(spec)
    _versions(monkeypatch, peft="9.9.9")
    assert _keys(spec) != before
    _versions(monkeypatch, flash_attn="2.7.0")  # installed where it was absent: the model may run through it
    assert _keys(spec) != before
    monkeypatch.undo()
    assert _keys(spec) == before


def test_the_gpu_model_is_in_the_key_on_cuda(monkeypatch):
    monkeypatch.setattr(compiling, "can_compile", lambda device_type: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    keys = {}
    for name in ("NVIDIA H200", "NVIDIA A100-SXM4-80GB"):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        exp = Experiment.model_validate(_one_stage())
        keys[name] = stage_keys(exp, "base", "data", "cuda", code="code")
    assert keys["NVIDIA H200"] != keys["NVIDIA A100-SXM4-80GB"]


def _task_files(tmp_path: Path) -> tuple[Path, Path]:
    """An lm-eval task directory (YAML with a ``!function`` helper) whose data file lies outside it."""
    tasks, data = tmp_path / "tasks", tmp_path / "data" / "docs.jsonl"
    tasks.mkdir()
    data.parent.mkdir()
    data.write_text('{"q": "1+1", "a": "2"}\n')
    (tasks / "utils.py").write_text("def process(docs):\n    return docs\n")
    (tasks / "mine.yaml").write_text(
        "task: mine\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "process_docs: !function utils.process\ndoc_to_text: '{{q}}'\n"
    )
    return tasks, data


def test_an_include_path_task_is_keyed_by_its_files_not_its_path(tmp_path, monkeypatch):
    tasks, data = _task_files(tmp_path)
    spec = _one_stage()
    spec["eval"]["benchmarks"] = [{"task": "mine", "include_path": str(tasks)}]
    before = _keys(spec)
    assert _keys(spec) == before
    (tasks / ".mine.yaml.swp").write_text("stray")  # an editor's swap file is no task
    assert _keys(spec) == before

    yaml_file = tasks / "mine.yaml"
    yaml_file.write_text(yaml_file.read_text().replace("'{{q}}'", "'Q: {{q}}'"))  # same path, other prompt
    edited = _keys(spec)
    assert edited != before
    data.write_text('{"q": "1+1", "a": "3"}\n')  # its data file, outside the directory
    assert _keys(spec) != edited

    no_benchmarks = _one_stage()
    keyed, plain = _keys(spec), _keys(no_benchmarks)
    _versions(monkeypatch, lm_eval="0.0.1")
    assert _keys(spec) != keyed
    assert _keys(no_benchmarks) == plain  # lm-eval computes benchmark rows only


def test_the_reference_text_is_keyed_by_its_content_not_its_path(tmp_path):
    text = tmp_path / "reference.txt"
    text.write_text("The first document.\nThe second document.\n")
    spec = _one_stage()
    spec["eval"]["probes"] = ["first_token", "forgetting"]
    spec["eval"]["reference_text"] = str(text)
    before = _keys(spec)
    assert _keys(spec) == before
    text.write_text("The first document.\nAn edited second document.\n")  # same path, other documents
    assert _keys(spec) != before


def test_the_loss_pool_size_is_in_the_key_and_unset_keeps_older_keys():
    """eval.loss_items changes what every stage records (its loss-pool rows): another size misses the cache; an
    experiment that does not set it keeps the key it had before the field existed (omitted from the dump)."""
    spec = _experiment()
    assert "loss_items" not in Experiment.model_validate(spec).resolved_dict()["eval"]
    keys = {}
    for size in (200, 1000):
        changed = copy.deepcopy(spec)
        changed.setdefault("eval", {})["loss_items"] = size
        keys[size] = _keys(changed)
    assert all(a != b for a, b in zip(keys[200], keys[1000]))
    assert all(a != b for a, b in zip(_keys(spec), keys[200]))
