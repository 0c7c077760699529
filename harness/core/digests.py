"""Content digests that key the harness's caches: :func:`content_hash` of a JSON-able description, shared by the
pretrained base's cache, the stage cache's keys and the process's last-encoding reuse, so the same description
always gets the same key wherever it is computed."""

from __future__ import annotations

import hashlib
import json


def content_hash(obj) -> str:
    """The SHA-256 (hex) of a JSON-able description: keys sorted, values JSON cannot hold written by ``str``."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()
