"""Checks on user data rows that ``datasets`` / Arrow would otherwise blur: the field types of mapped columns,
and (for JSON-lines files) a line-by-line scan whose errors name the file and line.

Arrow's JSON reader reports a malformed line as ``DatasetGenerationError`` (no line number), raises
``StopIteration`` on an empty file, rejects a lone surrogate without saying where, and silently turns ``42``,
``True`` or ``{"x": 1}`` in a text column into strings. :func:`scan_jsonl` reads the file first with the standard
library and stops at the first such line with ``FILE:LINE: why``; :func:`field_text` is the one rule for what a
mapped field may hold.
"""

from __future__ import annotations

import glob as globlib
import json
from collections.abc import Iterable
from typing import Any

CAST_HINT = "set params.cast_to_string: true to turn numbers and booleans into text"


class RowProblem(Exception):
    """A row that cannot become an example; the message says why (the caller adds file / row)."""


def field_text(value: Any, field: str, cast_to_string: bool) -> str:
    """The text of a mapped field: strings as they are, null as "" (an empty field is then reported as such);
    numbers and booleans only with ``cast_to_string`` (as JSON writes them: 42, 1.5, true); anything else —
    mappings, lists — never, since its ``str()`` is Python syntax, not text a model should learn."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if cast_to_string and isinstance(value, (bool, int, float)):
        return json.dumps(value)
    kind = type(value).__name__
    hint = f" ({CAST_HINT})" if isinstance(value, (bool, int, float)) else ""
    raise RowProblem(f"field {field!r} holds {kind} {_short(value)}, not text{hint}")


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _lone_surrogate(value: Any, path: str = "") -> str | None:
    """The location (``column`` or ``column[2].content``) of the first string holding a lone surrogate, or None.
    JSON's ``"\\ud800"`` escape decodes to one; it cannot be encoded as UTF-8, so Arrow and tokenizers fail on it."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "value"
        return None
    if isinstance(value, dict):
        items: Iterable = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for where, v in items:
        found = _lone_surrogate(v, where)
        if found:
            return found
    return None


def check_turn_fields(row: dict[str, Any], messages_column: str) -> None:
    """Types inside a conversation column: a list of mappings whose role and content are text."""
    turns = row.get(messages_column)
    if not isinstance(turns, list):
        return  # the loader reports a missing or non-list conversation with its own message
    for i, turn in enumerate(turns):
        if isinstance(turn, dict):
            for key in ("role", "from", "content", "value"):
                if turn.get(key) is not None and not isinstance(turn[key], str):
                    raise RowProblem(
                        f"field '{messages_column}[{i}].{key}' holds {type(turn[key]).__name__} "
                        f"{_short(turn[key])}, not text"
                    )


def scan_jsonl(pattern: str, text_fields: list[str], messages_field: str | None, cast_to_string: bool) -> None:
    """Read every file ``pattern`` names line by line and raise ``ValueError("FILE: …")`` / ``("FILE:LINE: …")``
    at the first empty file, invalid UTF-8, malformed JSON, non-object line, lone surrogate, or mapped field that is
    not text. A file that is one JSON document (an array of rows) is checked as such."""
    files = sorted(globlib.glob(pattern)) if globlib.has_magic(pattern) else [pattern]
    for name in files:
        with open(name, "rb") as f:
            data = f.read()
        lines = data.split(b"\n")
        numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
        if not numbered:
            raise ValueError(f"{name}: no rows (the file is empty)")
        document = _as_document(data)
        if document is not None:
            rows = document if isinstance(document, list) else []
            located = [(f"{name}: row {i}", row) for i, row in enumerate(rows)]
        else:
            located = [(f"{name}:{n}", _parse_line(name, n, line)) for n, line in numbered]
        for where, row in located:
            try:
                _check_row(row, text_fields, messages_field, cast_to_string)
            except RowProblem as e:
                raise ValueError(f"{where}: {e}") from None


def _as_document(data: bytes) -> Any:
    """The parsed file when it is a single JSON array (``[{…}, {…}]``); None for JSON lines."""
    if not data.lstrip().startswith(b"["):
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def _parse_line(name: str, lineno: int, line: bytes) -> Any:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{name}:{lineno}: not valid UTF-8 (byte {line[e.start]:#04x} at column {e.start + 1})"
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name}:{lineno}: malformed JSON ({e.msg} at column {e.colno})") from None


def _check_row(row: Any, text_fields: list[str], messages_field: str | None, cast_to_string: bool) -> None:
    if not isinstance(row, dict):
        raise RowProblem(f"not a JSON object but {type(row).__name__} {_short(row)}")
    where = _lone_surrogate(row)
    if where:
        raise RowProblem(f"field {where!r} holds a lone surrogate (invalid Unicode; fix the data's \\ud8xx escapes)")
    for field in text_fields:
        if field in row:
            field_text(row[field], field, cast_to_string)
    if messages_field:
        check_turn_fields(row, messages_field)
