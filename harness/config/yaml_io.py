"""YAML in and out: ``safe_load`` (reading ``1e-4`` as a float too), reading a file as a mapping with errors that
name the line, and dumping in key order."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from harness.config.errors import ConfigError


class _Loader(yaml.SafeLoader):
    """``yaml.safe_load`` that also reads ``1e-4`` as a float (YAML 1.1 wants ``1.0e-4``; people write both)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+|\.[0-9_]+"
        r"(?:[eE][-+]?[0-9]+)?|\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


# YAML 1.1 reads digits separated by colons as base 60 (``4:00:00`` is the integer 14400); YAML 1.2 dropped that, and
# a person writing a SLURM time limit or a ratio means the text. Those resolvers go; plain integers keep theirs.
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
for _first, _resolvers in list(_Loader.yaml_implicit_resolvers.items()):
    _Loader.yaml_implicit_resolvers[_first] = [
        (tag, rx) for tag, rx in _resolvers if not (tag in (_INT, _FLOAT) and (rx.match("1:30") or rx.match("1:30.5")))
    ]
_Loader.add_implicit_resolver(
    _INT,
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` with floats such as ``1e-4`` read as floats."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 — a SafeLoader subclass


def load_raw(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping with ``safe_load``; errors name the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), [("", "file not found")])
    try:
        data = safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(str(path), [("", f"{where}invalid YAML ({getattr(e, 'problem', None) or e})")]) from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), [("", "the file must hold a mapping of sections (name, tasks, stages, …)")])
    return data


def dump_yaml(data: dict[str, Any]) -> str:
    """YAML text of a mapping, keys in their order (sections read as written), unicode kept."""
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
