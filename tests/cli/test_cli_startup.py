"""``harness --help`` and ``harness validate`` of a broken file start without the heavy libraries (torch,
transformers, polars) and still end with the documented exit code and the error by YAML path; the error mapping of
:mod:`harness.cli.errors`, which looks its types up only in modules already imported, still maps every user error.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

from harness.cli.errors import USER_ERRORS
from tests.conftest import ROOT, TINY, write_yaml

HEAVY = ("torch", "transformers", "polars")

# The command line run in a fresh interpreter: its exit code, stdout, stderr and the heavy modules it imported.
PROBE = """
import contextlib, io, json, sys
watched = json.loads(sys.argv[2])
sys.argv = ["harness", *json.loads(sys.argv[1])]
out, err, code = io.StringIO(), io.StringIO(), 0
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        from harness.cli.app import main
        main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
heavy = sorted(m for m in watched if m in sys.modules)
print(json.dumps({"code": code, "out": out.getvalue(), "err": err.getvalue(), "heavy": heavy}))
"""


def cli_in_fresh_process(*args: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args), json.dumps(HEAVY)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["validate", "--help"]])
def test_help_imports_no_heavy_library(args):
    seen = cli_in_fresh_process(*args)
    assert seen["code"] == 0 and "Usage: harness" in seen["out"], seen
    assert seen["heavy"] == [], f"harness {' '.join(args)} imported {seen['heavy']}"


def test_validate_of_an_unknown_field_imports_no_heavy_library(tmp_path):
    broken = write_yaml(tmp_path / "x.yaml", {**TINY, "bogus_field": 1})
    seen = cli_in_fresh_process("validate", str(broken))
    assert seen["code"] == 2, seen
    lines = seen["err"].splitlines()
    assert lines[0] == f"{broken}: 1 error" and lines[1].startswith("  bogus_field: unknown key 'bogus_field'"), seen
    assert "Traceback" not in seen["err"]
    assert seen["heavy"] == [], f"validate of a broken file imported {seen['heavy']}"


def test_validate_of_a_yaml_syntax_error_imports_no_heavy_library(tmp_path):
    broken = tmp_path / "x.yaml"
    broken.write_text("name: [x\n  a: b: c\n")
    seen = cli_in_fresh_process("validate", str(broken))
    assert seen["code"] == 2, seen
    assert seen["err"].splitlines() == [
        f"{broken}: 1 error",
        "  line 2, column 4: invalid YAML (expected ',' or ']', but got ':')",
    ]
    assert seen["heavy"] == [], f"validate of a broken file imported {seen['heavy']}"


def test_run_of_an_unknown_field_fails_before_importing_torch(tmp_path):
    broken = write_yaml(tmp_path / "x.yaml", {**TINY, "bogus_field": 1})
    seen = cli_in_fresh_process("run", str(broken), "--out", str(tmp_path / "run"))
    assert seen["code"] == 2 and "bogus_field: unknown key" in seen["err"], seen
    assert seen["heavy"] == [] and not (tmp_path / "run").exists()


def test_each_user_error_is_looked_up_in_the_module_that_defines_it():
    """The ``sys.modules`` lookup is sound only if each entry names the defining module: an exception of the type
    can then exist only once that module was imported."""
    from harness.cli.errors import USER_ERRORS

    for module, name in USER_ERRORS:
        error_type = getattr(importlib.import_module(module), name)
        assert issubclass(error_type, BaseException) and error_type.__module__ == module, (module, name)


def _planted(error_type: type[BaseException]) -> BaseException:
    """An instance of a subclass of ``error_type`` that any constructor signature allows."""
    planted = type("Planted", (error_type,), {"__init__": lambda self: Exception.__init__(self, "planted problem")})
    planted.__str__ = lambda self: "planted problem"
    return planted()


@pytest.mark.parametrize("module, name", USER_ERRORS)
def test_every_user_error_is_one_line_exit_2(module, name, capsys, monkeypatch):
    from harness.cli.errors import run_cli as run_with_policy

    error = _planted(getattr(importlib.import_module(module), name))

    def app():
        raise error

    monkeypatch.setattr(sys, "argv", ["harness", "run"])
    with pytest.raises(SystemExit) as ended:
        run_with_policy(app)
    assert ended.value.code == 2
    assert capsys.readouterr().err == "harness: planted problem\n"
