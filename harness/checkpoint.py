"""Checkpoints in Hugging Face format (``save_pretrained`` + tokenizer + a JSON of trainer state), written
atomically: into a temporary sibling directory first, then renamed into place, so a checkpoint directory is
either absent or complete, never half-written.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path


def save_atomically(target: Path, model, tokenizer, meta: dict) -> None:
    """Write a Hugging Face checkpoint (safetensors + tokenizer + meta.json) into a temporary sibling directory,
    then rename it into place, so ``target`` is either absent or complete."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, default=str))
        if target.exists():
            old = target.with_name(f".{target.name}.old{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
