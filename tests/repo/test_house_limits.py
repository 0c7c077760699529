"""The house's size limits hold (issue 51, DEVELOPERS.md): every module of ``harness``, ``analysis`` and
``data_recipes`` has at most :data:`MAX_FILE_LINES` lines and every function at most :data:`MAX_FUNCTION_LINES`
(decorators to last line, docstring included), except the ones listed in :data:`EXCEPTIONS` with the reason they
stand. ruff has no rule for either length, so this test keeps them; each check is also run on a planted violation.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGES = ("harness", "analysis", "data_recipes")
MAX_FILE_LINES = 480
MAX_FUNCTION_LINES = 80
#: "path" or "path::function" -> why it stands (an entry that no longer exceeds its limit fails the test: keep the
#: list honest).
EXCEPTIONS: dict[str, str] = {}


def _function_lengths(source: str) -> dict[str, int]:
    lengths = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            lengths[node.name] = max(lengths.get(node.name, 0), node.end_lineno - start + 1)
    return lengths


def over_limits(root: Path) -> dict[str, int]:
    """``{"path": lines}`` for files and ``{"path::function": lines}`` for functions over the limits."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            source = path.read_text(encoding="utf-8")
            name = path.relative_to(root).as_posix()
            if source.count("\n") > MAX_FILE_LINES:
                found[name] = source.count("\n")
            for function, length in _function_lengths(source).items():
                if length > MAX_FUNCTION_LINES:
                    found[f"{name}::{function}"] = length
    return found


def test_files_and_functions_stay_within_the_house_limits():
    found = over_limits(ROOT)
    unlisted = {k: v for k, v in found.items() if k not in EXCEPTIONS}
    assert not unlisted, f"over {MAX_FILE_LINES} lines a file / {MAX_FUNCTION_LINES} a function: {unlisted}"
    stale = sorted(set(EXCEPTIONS) - set(found))
    assert not stale, f"listed as exceptions but within the limits now (remove them): {stale}"


def test_the_limits_check_finds_a_planted_long_function_and_file(tmp_path):
    package = tmp_path / "harness"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (package / "long.py").write_text(f"def long_one():\n{body}\n", encoding="utf-8")
    (package / "big.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1), encoding="utf-8")
    assert over_limits(tmp_path) == {
        "harness/long.py::long_one": MAX_FUNCTION_LINES + 1,
        "harness/big.py": MAX_FILE_LINES + 1,
    }
