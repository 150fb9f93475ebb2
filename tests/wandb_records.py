"""Read a W&B offline run file (``run-<id>.wandb``) back: W&B's own protobuf records, from its log format.

W&B writes an offline run as a LevelDB-style log (a 7-byte ``:W&B`` header, then 32 KiB blocks of
chunks with a 7-byte crc/length/type header each) of ``wandb_internal_pb2.Record`` messages, the
same file ``wandb sync`` uploads. The SDK ships the message definitions but no reader in Python,
so the tests decode the framing here and the records with W&B's classes.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Dict, Iterator, List

BLOCK = 32768
HEADER = struct.Struct("<4sHB")  # ident ":W&B", magic 0xBEE1, version
CHUNK = struct.Struct("<IHB")  # crc32c, length, type
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    ident, magic, _ = HEADER.unpack_from(data, 0)
    assert ident == b":W&B" and magic == 0xBEE1, f"{path} is not a W&B run file"
    pos, pending = HEADER.size, b""
    while pos + CHUNK.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK.size:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = CHUNK.unpack_from(data, pos)
        if kind == 0 and length == 0:  # zero padding at the end of a block
            pos += left
            continue
        body = data[pos + CHUNK.size : pos + CHUNK.size + length]
        pos += CHUNK.size + length
        pending = body if kind in (FULL, FIRST) else pending + body
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def read_run(path: Path) -> Dict[str, Any]:
    """The run's id, group, config, history rows and summary, as W&B recorded them."""
    run: Dict[str, Any] = {"config": {}, "history": [], "summary": {}, "files": [], "tags": []}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.update(id=record.run.run_id, group=record.run.run_group, job_type=record.run.job_type)
            run["tags"] = list(record.run.tags) or run["tags"]
            run["config"].update(_items(record.run.config.update))
        elif kind == "config":
            run["config"].update(_items(record.config.update))
        elif kind == "history":
            run["history"].append(_items(record.history.item))
        elif kind == "summary":
            run["summary"].update(_items(record.summary.update))
        elif kind == "files":
            run["files"] += [f.path for f in record.files.files]
    return run


def _items(items) -> Dict[str, Any]:
    out = {}
    for item in items:
        key = item.key or "/".join(item.nested_key)
        out[key] = json.loads(item.value_json) if item.value_json else None
    return out


def history(run: Dict[str, Any], key: str) -> List[Any]:
    return [row[key] for row in run["history"] if key in row]
