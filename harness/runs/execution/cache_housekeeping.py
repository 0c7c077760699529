"""Housekeeping of the stage cache (``harness cache ls | du | prune``): list its entries, add up their sizes, and
remove the least recently used ones by age and total size. An entry's last use is its directory's mtime, which a
run touches when it replays the entry (:meth:`harness.runs.execution.stage_cache.StageCache.replay`).

Names starting with ``.`` under ``stages/`` are writers' temporary directories; prune removes those older than
:data:`ABANDONED_AFTER_S` (a writer that died), never younger ones (a writer at work).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from harness.runs.execution.stage_cache import META

ABANDONED_AFTER_S = 6 * 3600
_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_UNITS_B = {
    "": 1,
    "b": 1,
    "k": 1e3,
    "kb": 1e3,
    "m": 1e6,
    "mb": 1e6,
    "g": 1e9,
    "gb": 1e9,
    "t": 1e12,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_age(text: str) -> float:
    """Seconds in ``7d``, ``12h``, ``30m``, ``45s``, ``2w``; ValueError naming the text otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if not match:
        raise ValueError(f"--older-than {text!r}: expected a number and a unit s, m, h, d or w (e.g. 7d)")
    return float(match.group(1)) * _UNITS_S[match.group(2)]


def parse_size(text: str) -> int:
    """Bytes in ``20GB``, ``500MB``, ``1.5GiB``, ``1000``; ValueError naming the text otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in _UNITS_B:
        raise ValueError(f"--max-size {text!r}: expected a number and a unit B, KB, MB, GB, TB (or KiB… GiB)")
    return int(float(match.group(1)) * _UNITS_B[match.group(2)])


def human_size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


@dataclass
class EntryInfo:
    path: Path
    size: int  # bytes
    last_used: float  # epoch seconds (the directory's mtime)
    meta: dict | None  # None: unreadable meta.json (a corrupt entry)

    @property
    def label(self) -> str:
        if self.meta is None:
            return "(corrupt: no readable meta.json)"
        m = self.meta
        return f"{m.get('experiment')}/{m.get('stage')} (stage {m.get('index')}, ends at step {m.get('end_step')})"


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def list_entries(root: Path) -> list[EntryInfo]:
    """The entries under ``root``, least recently used first (their meta read, their files not verified)."""
    if not root.is_dir():
        return []
    out = []
    for path in root.iterdir():
        if path.name.startswith(".") or not path.is_dir():
            continue
        try:
            meta = json.loads((path / META).read_text())
        except (OSError, ValueError):
            meta = None
        out.append(EntryInfo(path, _size(path), path.stat().st_mtime, meta))
    return sorted(out, key=lambda e: e.last_used)


def prune(
    root: Path, older_than_s: float | None = None, max_size: int | None = None, now: float | None = None
) -> list[EntryInfo]:
    """Remove entries unused for ``older_than_s``, corrupt ones, then the least recently used until the rest total
    at most ``max_size`` bytes; also writers' temporary directories abandoned long ago. Returns what went."""
    now = time.time() if now is None else now
    entries, removed = list_entries(root), []
    for entry in entries:
        if entry.meta is None or (older_than_s is not None and now - entry.last_used > older_than_s):
            removed.append(entry)
    kept = [e for e in entries if e not in removed]
    total = sum(e.size for e in kept)
    for entry in kept:  # least recently used first
        if max_size is None or total <= max_size:
            break
        removed.append(entry)
        total -= entry.size
    for entry in removed:
        shutil.rmtree(entry.path, ignore_errors=True)
    if root.is_dir():
        for tmp in root.glob(".*"):
            if tmp.is_dir() and now - tmp.stat().st_mtime > ABANDONED_AFTER_S:
                shutil.rmtree(tmp, ignore_errors=True)
    return removed
