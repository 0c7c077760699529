"""The one dotted-path syntax into a YAML mapping, shared by ``--set`` overrides and sweep search spaces.

``stages[2].mixture`` and ``stages.2.mixture`` are the same path; an element of a list of named mappings may also
be named (``stages.assistant.mixture`` is the stage called ``assistant``). :func:`format_path` writes a path back in
the canonical form used by every error message (``stages[2].mixture``).
"""

from __future__ import annotations

import re
from typing import Any

from harness.core.registry import suggest

Parts = list[Any]  # str keys and int list indices


class PathError(ValueError):
    """A path that does not lead into the data (unknown element name, index out of range, through a scalar)."""


def format_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """``('stages', 1, 'mixture', 'yesno')`` → ``stages[1].mixture.yesno``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_path(dotted: str) -> Parts:
    """``stages[2].mixture.yesno`` (or ``stages.2.mixture.yesno``) → ``['stages', 2, 'mixture', 'yesno']``."""
    return [int(t) if t.isdigit() else t for t in re.findall(r"[^.\[\]]+", dotted)]


def resolve_path(data: dict[str, Any], parts: Parts) -> Parts:
    """``parts`` with element names replaced by their index (``stages.assistant`` → ``stages[2]``); list indices
    are checked against the data. Parts under a missing key pass unchecked (:func:`set_path` creates them)."""
    out: Parts = []
    node: Any = data
    for part in parts:
        if isinstance(node, list):
            if isinstance(part, str):
                names = [x.get("name") for x in node if isinstance(x, dict)]
                if part not in names:
                    raise PathError(
                        f"no element named {part!r} at {format_path(out)}{suggest(part, names)}; "
                        f"names: {', '.join(map(str, names))}"
                    )
                part = names.index(part)
            elif part >= len(node):
                raise PathError(f"index {part} out of range at {format_path(out)} ({len(node)} elements)")
            node = node[part]
        elif isinstance(node, dict):
            node = node.get(part)
        elif node is not None:
            raise PathError(f"{format_path(out)} is {node!r}, not a mapping")
        out.append(part)
    return out


def set_path(data: dict[str, Any], parts: Parts, value: Any) -> None:
    """Set ``parts`` (already resolved) in ``data``, creating mappings on the way. A scalar on the way is an error,
    never replaced: ``train.trainable.r`` under ``trainable: lora`` would otherwise silently drop ``lora``."""
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            node = node[part]
            continue
        if node.get(part) is None:
            node[part] = {}
        elif not isinstance(node[part], (dict, list)):
            raise PathError(f"{format_path(parts[: i + 1])} is {node[part]!r}, not a mapping")
        node = node[part]
    node[parts[-1]] = value
