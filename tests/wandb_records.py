"""Read the history a wandb offline run recorded, to check it against the store.

wandb ≥ 0.2x writes ``run-<id>.wandb`` from its Go core and no longer ships a Python reader, so this is a small
reader of its format: a 7-byte header (``:W&B``, magic 0xBEE1, version), then LevelDB-log records in 32 KiB blocks
(4-byte CRC, 2-byte length, 1-byte type: full / first / middle / last), each payload a ``wandb_internal`` Record.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768
HEADER = 7


def _payloads(data: bytes):
    assert data[:4] == b":W&B", "not a wandb run file"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        block_left = BLOCK - pos % BLOCK
        if block_left < HEADER:  # the block's tail is zero padding
            pos += block_left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            continue
        if kind == 1:
            yield chunk
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            yield pending + chunk
            pending = b""


def history(run_dir: Path) -> list[dict]:
    """Every ``run.log`` call of the run's offline file, as ``{key: value, "_step": step}``."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")
    out = []
    for payload in _payloads(path.read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        if record.WhichOneof("record_type") == "history":
            out.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return out
