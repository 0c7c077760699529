"""JSON-lines files that survive a kill mid-write: ``samples.jsonl`` and the optuna journal.

A process killed (or a disk filled) while appending leaves an *unfinished last line*: bytes after the last newline.
Readers here skip it and say so (:class:`UnfinishedLineWarning`, naming the file and line); a malformed line
*before* the last one is real corruption and an error naming file and line (:class:`JsonlError`). Writers append
each batch of records (one evaluation's samples) in one ``write`` followed by ``flush`` and ``fsync``, after first
cutting off any unfinished tail, so a new record is never glued to half of an old one.

:func:`json_safe` makes a value strict JSON (a non-finite float becomes null) for the reports written as JSON.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

PathLike = str | Path


class JsonlError(ValueError):
    """A malformed line that is not an unfinished last line; the message is ``FILE:LINE: why``."""


class UnfinishedLineWarning(UserWarning):
    """An unfinished last line was skipped (or trimmed); the message names the file and line."""


def _parse(line: bytes, path: PathLike, lineno: int) -> Any:
    try:
        return json.loads(line)
    except UnicodeDecodeError as e:
        raise JsonlError(f"{path}:{lineno}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise JsonlError(f"{path}:{lineno}: malformed JSON ({e.msg} at column {e.colno})") from None


def _split_complete(data: bytes, path: PathLike) -> tuple[list[tuple[int, bytes]], int | None]:
    """(numbered non-blank complete lines, number of the unfinished last line or None). A last line without its
    newline counts as complete when it parses (the writer died between the record and its newline)."""
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the data ends with a newline
    numbered = [(i + 1, line) for i, line in enumerate(lines) if line.strip()]
    unfinished = None
    if tail.strip():
        try:
            json.loads(tail)
            numbered.append((len(lines) + 1, tail))
        except ValueError:  # JSONDecodeError and UnicodeDecodeError (a multi-byte character cut in half)
            unfinished = len(lines) + 1
    return numbered, unfinished


def _warn_unfinished(path: PathLike, lineno: int, action: str) -> None:
    warnings.warn(
        f"{path}:{lineno}: unfinished last line (a write was cut off) {action}", UnfinishedLineWarning, stacklevel=3
    )


def read_jsonl(path: PathLike) -> list[Any]:
    """Every record of a JSON-lines file, in order; blank lines are ignored, an unfinished last line is skipped
    with an :class:`UnfinishedLineWarning`, any other malformed line raises :class:`JsonlError`."""
    return [record for _, record in _records(path)]


def _records(path: PathLike) -> list[tuple[int, Any]]:
    numbered, unfinished = _split_complete(Path(path).read_bytes(), path)
    records = [(lineno, _parse(line, path, lineno)) for lineno, line in numbered]
    if unfinished is not None:
        _warn_unfinished(path, unfinished, "skipped")
    return records


def complete_jsonl_bytes(path: PathLike) -> bytes:
    """The file's complete lines (validated as JSON, newline-terminated) as bytes, for a fast parser such as
    ``polars.read_ndjson``; the same skipping and errors as :func:`read_jsonl`."""
    numbered, unfinished = _split_complete(Path(path).read_bytes(), path)
    for lineno, line in numbered:
        _parse(line, path, lineno)
    if unfinished is not None:
        _warn_unfinished(path, unfinished, "skipped")
    return b"".join(line + b"\n" for _, line in numbered)


def trim_unfinished_last_line(path: PathLike) -> bool:
    """Make the file end at a line boundary before appending: an unfinished last line is cut off (with a
    warning), a complete last record missing only its newline gets one. True when the file was changed.
    Call it while holding the file's write lock (the sweep journal's flock; the run directory's claim)."""
    path = Path(path)
    if not path.exists():
        return False
    with open(path, "rb+") as f:
        data = f.read()
        if not data or data.endswith(b"\n"):
            return False
        _, unfinished = _split_complete(data, path)
        if unfinished is None:
            f.write(b"\n")
        else:
            f.truncate(data.rfind(b"\n") + 1)
            _warn_unfinished(path, unfinished, "cut off before appending")
        f.flush()
        os.fsync(f.fileno())
    return True


def append_jsonl(
    path: PathLike, records: Iterable[dict[str, Any]], *, run_id: str | None = None, fsync: bool = True
) -> int:
    """Append ``records`` as JSON lines in a single ``write`` + ``flush`` (+ ``fsync``); with ``run_id`` every
    record gets a ``run_id`` field first (sample lines must carry it so two runs' lines are never counted as one
    run's). Returns the number of lines written."""
    lines = [
        json.dumps({"run_id": run_id, **r} if run_id is not None else r, ensure_ascii=False) + "\n" for r in records
    ]
    if not lines:
        return 0
    trim_unfinished_last_line(path)
    with open(path, "ab") as f:
        f.write("".join(lines).encode("utf-8"))
        f.flush()
        if fsync:
            os.fsync(f.fileno())
    return len(lines)


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±inf: not JSON) as None, through dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
