"""The layers hold: import-linter's contracts (``[tool.importlinter]`` in pyproject.toml) are kept, and no two modules
of ``harness``, ``analysis`` and ``data_recipes`` import each other, directly or through others.

Both read every import statement, function-level ones included (grimp parses the source; nothing is imported), so a
deferred import is no way around a layer. Each check is also run on a copy of the tree with one planted violation,
to show it fails when it should.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

from tests.conftest import ROOT
from tests.repo.test_import_graph import strongly_connected

PACKAGES = ("harness", "analysis", "data_recipes")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """import-linter's command on the tree at ``root`` (its pyproject.toml, its packages first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = [
        sys.executable,
        "-c",
        "from importlinter.cli import lint_imports_command; lint_imports_command()",
        "--config",
        str(root / "pyproject.toml"),
        "--no-cache",
    ]
    return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)


def import_cycles(*packages: str) -> list[list[str]]:
    """Every set of modules that import each other (strongly connected components of more than one module of
    grimp's import graph, every import statement counted), each sorted."""
    graph = grimp.build_graph(*packages, cache_dir=None)
    return strongly_connected({m: graph.find_modules_directly_imported_by(m) for m in graph.modules})


@pytest.fixture(scope="module")
def tree_copy(tmp_path_factory) -> Path:
    """A copy of the packages and pyproject.toml, to plant violations in."""
    root = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__", "*.ipynb"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def test_contracts_are_kept():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_no_import_cycles():
    assert import_cycles(*PACKAGES) == []


@pytest.mark.parametrize(
    "where, planted",
    [
        ("harness/core/stats.py", "from harness.evaluation import passes  # planted: core importing a layer above\n"),
        (
            "harness/data/stream.py",
            "def _planted():\n    from harness.runs.execution import runner  # planted, inside a function\n",
        ),
        ("analysis/trials.py", "def _planted():\n    from harness.config import Experiment  # planted\n"),
        # a slice's internals reached past its face: allowed by the layers, refused by the slice's own contract
        (
            "harness/checks/inspection.py",
            "def _planted():\n    from harness.runs.planning.pretrain import builtin_base\n",
        ),
        (
            "harness/runs/execution/runner.py",
            "def _planted():\n    from harness.training.packing_check import check_packing\n",
        ),
        ("harness/training/loop.py", "def _planted():\n    from harness.training.steering import Steering\n"),
    ],
)
def test_an_upward_import_breaks_a_contract(tree_copy, where, planted):
    path = tree_copy / where
    original = path.read_text()
    path.write_text(original + "\n\n" + planted)
    try:
        result = lint_imports(tree_copy)
    finally:
        path.write_text(original)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout and where.removesuffix(".py").replace("/", ".") in result.stdout


def test_a_function_level_cycle_is_found(tree_copy, monkeypatch):
    path = tree_copy / "harness/core/names.py"
    original = path.read_text()
    path.write_text(original + "\n\ndef _planted():\n    from harness.core import redact  # planted\n")
    (tree_copy / "harness/core/redact.py").write_text(
        (ROOT / "harness/core/redact.py").read_text() + "\n\ndef _back():\n    from harness.core import names\n"
    )
    monkeypatch.syspath_prepend(str(tree_copy))
    for name in [m for m in sys.modules if m.split(".")[0] in PACKAGES]:
        monkeypatch.delitem(sys.modules, name)  # grimp finds packages through the import system
    try:
        cycles = import_cycles(*PACKAGES)
    finally:
        path.write_text(original)
        shutil.copy(ROOT / "harness/core/redact.py", tree_copy / "harness/core/redact.py")
    assert cycles == [["harness.core.names", "harness.core.redact"]]
