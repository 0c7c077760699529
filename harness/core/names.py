"""Names that become path components (experiment names, stage names, task names) must stay one component.

``.`` and ``..`` used to pass validation: a stage named ``.`` saved its checkpoint over ``checkpoints/`` itself,
and an experiment named ``..`` wrote outside ``runs/``. :func:`check_safe_name` rejects them, path separators,
empty names, control characters, and anything that would resolve outside the directory it is joined to.
"""

from __future__ import annotations

import os
import posixpath
import unicodedata


def check_safe_name(name: str, what: str) -> str:
    """``name`` unchanged when it is safe as a single path component; else ``ValueError`` whose one-line message
    says ``what`` it is and why (``stage name '..': ...``). For pydantic field validators: the message is the
    part after "Value error, "."""
    if not isinstance(name, str):
        raise ValueError(f"{what} must be a string, got {type(name).__name__} {name!r}")
    if not name.strip():
        raise ValueError(f"{what} must not be empty")
    if name in (".", ".."):
        raise ValueError(f"{what} {name!r} is not allowed: it names a directory, not a new entry in it")
    separators = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    bad = sorted(ch for ch in separators if ch in name)
    if bad:
        raise ValueError(f"{what} {name!r} contains a path separator ({' '.join(bad)}); use letters, digits, - _ .")
    if any(unicodedata.category(ch) == "Cc" for ch in name):
        raise ValueError(f"{what} {name!r} contains a control character")
    # Belt and braces: whatever the platform's rules, joined to a parent it must be a direct child of that parent.
    parent = posixpath.join(os.sep, "parent")
    if os.path.dirname(os.path.normpath(os.path.join(parent, name))) != os.path.normpath(parent):
        raise ValueError(f"{what} {name!r} resolves outside its parent directory")
    return name
