"""What the stage-cache key holds of plug-ins and of the CPU kernel path (issues 51, 53): the plug-ins the run uses
with every module they import from their own package (an edited helper misses, also one imported lazily), keyed by
name and content (the same plug-in in a copied checkout shares entries; one imported earlier for another experiment
changes nothing); and the kernel path torch and its BLAS take (an entry made on one path is not replayed on another,
nor a base model pretrained on one path reused on another).

Keys only, as in test_stage_cache_key.py, but for the tiny base pretrained (4 steps) to show its cache's key."""

from __future__ import annotations

import copy
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.config import Experiment
from harness.core import plugins
from harness.core.plugin_sources import plugin_source
from harness.core.registry import PLUGIN_REGISTRIES
from harness.runs.planning import code_identity
from harness.runs.planning import kernel_path as kernel_path_module
from harness.runs.planning.prepare import warm_base
from harness.runs.planning.stage_key import stage_keys
from tests.conftest import ROOT, TINY

JUDGE = "def judged(answer):\n    return answer.strip()\n"
LAZY = "SCALE = 1\n"
TASKS = """
from ck_lab.judge import judged


def score(answer):
    from ck_lab import lazy  # imported when a score is first asked for: after the key is made

    return lazy.SCALE * len(judged(answer))
"""
UNRELATED = "VALUE = 1\n"


@pytest.fixture
def lab(tmp_path, monkeypatch) -> Path:
    """A user's package ``ck_lab`` (``tasks`` imports its helper ``judge``, and ``lazy`` inside a function) in a
    directory of its own; its modules and the plug-in records are forgotten after the test."""
    package = tmp_path / "checkout" / "ck_lab"
    package.mkdir(parents=True)
    for name, text in (("__init__", ""), ("tasks", TASKS), ("judge", JUDGE), ("lazy", LAZY)):
        (package / f"{name}.py").write_text(text)
    monkeypatch.setattr(plugins, "_imported", dict(plugins._imported))
    for registry in PLUGIN_REGISTRIES.values():
        monkeypatch.setattr(registry, "_items", dict(registry._filled()))
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield package.parent
    _forget_lab()


def _forget_lab() -> None:
    for name in [n for n in sys.modules if n.split(".")[0] == "ck_lab" or n.startswith("harness_plugin_ck_")]:
        del sys.modules[name]
    plugins._imported.pop("ck_lab.tasks", None)


def _keys(checkout: Path, extra_plugins: tuple[str, ...] = ()) -> list[str]:
    """The stage keys of the tiny experiment with ``plugins: [ck_lab.tasks]`` imported from ``checkout`` as a fresh
    process would (``extra_plugins``: imported before, for another experiment)."""
    _forget_lab()
    sys.path.insert(0, str(checkout))
    importlib.invalidate_caches()
    if extra_plugins:
        assert plugins.import_plugins(list(extra_plugins)) == []
    spec = copy.deepcopy(TINY)
    spec["plugins"] = ["ck_lab.tasks"]
    exp = Experiment.model_validate(spec)
    assert plugins.import_plugins(exp.plugins) == []
    keys = stage_keys(exp, "base", "data", "cpu")
    sys.path.remove(str(checkout))
    return keys


def test_an_edited_helper_module_of_the_plugin_misses(lab):
    before = _keys(lab)
    assert _keys(lab) == before
    (lab / "ck_lab" / "judge.py").write_text(JUDGE.replace("strip()", "lower()"))  # the entry file unchanged
    after_helper = _keys(lab)
    assert all(a != b for a, b in zip(before, after_helper))
    (lab / "ck_lab" / "lazy.py").write_text("SCALE = 2\n")  # imported only inside score(): not yet in sys.modules
    assert "ck_lab.lazy" not in sys.modules
    assert all(a != b for a, b in zip(after_helper, _keys(lab)))


def test_the_same_plugin_in_a_copied_checkout_shares_the_key(lab, tmp_path):
    copied = tmp_path / "elsewhere" / "copy"
    shutil.copytree(lab, copied)
    assert _keys(copied) == _keys(lab)


def test_a_plugin_imported_earlier_for_another_experiment_leaves_the_key(lab, tmp_path):
    other = tmp_path / "other_lab"
    other.mkdir()
    (other / "unrelated.py").write_text(UNRELATED)
    alone = _keys(lab)
    assert _keys(lab, extra_plugins=(str(other / "unrelated.py"),)) == alone


def test_the_plugin_files_are_named_relative_to_their_package(lab):
    _keys(lab)
    source = plugin_source("ck_lab.tasks")
    assert source.label == "ck_lab.tasks" and source.root == (lab / "ck_lab").resolve()
    assert {p.as_posix() for p in source.files} == {"__init__.py", "tasks.py", "judge.py", "lazy.py"}


# -- the kernel path ---------------------------------------------------------------------------------------------------


def _tiny_keys() -> list[str]:
    return stage_keys(Experiment.model_validate(TINY), "base", "data", "cpu", code="code")


def test_an_entry_made_on_one_kernel_path_is_not_replayed_on_another(monkeypatch):
    native = code_identity.kernel_path()
    assert native["torch_cpu"] == torch.backends.cpu.get_cpu_capability()
    before = _tiny_keys()
    lower = {**native, "torch_cpu": "AVX2" if native["torch_cpu"] != "AVX2" else "DEFAULT"}
    monkeypatch.setattr(code_identity, "kernel_path", lambda: lower)
    assert all(a != b for a, b in zip(before, _tiny_keys()))
    blas = {**native, "blas": {"mkl": "another instruction set", "cnr": "OFF"}}  # torch's own kernels the same
    monkeypatch.setattr(code_identity, "kernel_path", lambda: blas)
    assert all(a != b for a, b in zip(before, _tiny_keys()))
    monkeypatch.setattr(code_identity, "kernel_path", lambda: copy.deepcopy(native))
    assert _tiny_keys() == before


def test_a_base_pretrained_on_one_kernel_path_is_not_reused_on_another(monkeypatch, tmp_path):
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    exp = Experiment.model_validate(TINY)
    first = warm_base(exp)
    assert not first.cache_hit and warm_base(exp).cache_hit
    native = kernel_path_module.kernel_path()
    monkeypatch.setattr(kernel_path_module, "kernel_path", lambda: {**native, "torch_cpu": "ANOTHER"})
    other = warm_base(exp)
    assert not other.cache_hit and other.cache_dir != first.cache_dir


def test_the_helper_script_moves_torch_and_mkl_to_another_path():
    native = code_identity.kernel_path()
    if native["torch_cpu"] not in ("AVX512", "AVX2"):
        pytest.skip(f"torch's kernels already on {native['torch_cpu']}: no lower vector path to move to")
    target = "avx2" if native["torch_cpu"] == "AVX512" else "default"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    shown = subprocess.run(
        [str(ROOT / "bench" / "kernel_path.sh"), target, "--show"], env=env, capture_output=True, text=True, check=True
    )
    moved = json.loads(shown.stdout)
    assert moved["torch_cpu"] == target.upper()  # ATEN_CPU_CAPABILITY, read when torch loads
    assert moved["onednn"]["ONEDNN_MAX_CPU_ISA"] == ("AVX2" if target == "avx2" else "SSE41")
    if "AVX-512" in native["blas"].get("mkl", ""):  # MKL took MKL_ENABLE_INSTRUCTIONS: it says so itself
        assert "AVX-512" not in moved["blas"]["mkl"] and "AVX2" in moved["blas"]["mkl"]
