"""Read an offline W&B run back: the records of its ``run-<id>.wandb`` transaction log.

wandb >= 0.2x writes an offline run as one stream of ``wandb_internal_pb2.Record``
protobufs in LevelDB's log format (what ``wandb sync`` uploads) and, offline, no
``config.yaml`` or ``wandb-summary.json``; its Python side no longer ships the reader
(``wandb.sdk.internal.datastore`` is gone), so this is that reader: a 7-byte file header
(``:W&B``, magic 0xBEE1, version 0), then 32 KiB blocks of chunks, each with a 7-byte header
(CRC-32 of type + data, length, type: full / first / middle / last); a block's tail shorter
than a header is padding. Records are parsed with wandb's own protobuf classes.
"""

from __future__ import annotations

import json
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2 as pb

_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[pb.Record]:
    """Every record of a ``.wandb`` file, checksums checked; stops at a torn tail."""
    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:_HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    pos, pending = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # padding at a block's end
            pos += left
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        chunk = data[pos + _HEADER : pos + _HEADER + length]
        if kind == 0 or len(chunk) < length:  # zero fill or a write still under way
            return
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"bad checksum at {pos}"
        pos += _HEADER + length
        if kind == _FULL:
            pending = chunk
        elif kind == _FIRST:
            pending = chunk
            continue
        elif kind == _MIDDLE:
            pending += chunk
            continue
        else:
            assert kind == _LAST, kind
            pending += chunk
        record = pb.Record()
        record.ParseFromString(pending)
        yield record


def _path(item: Any) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


@dataclass
class OfflineRun:
    """What an offline run holds: its config, each logged step, the final summary."""

    config: dict[str, Any] = field(default_factory=dict)
    history: dict[int, dict[str, Any]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    exited: bool = False


def read_offline_run(path: Path) -> OfflineRun:
    """The config, history (by step) and summary a ``.wandb`` file records; values decoded
    from their JSON, nested keys joined with ``/`` (a histogram ``h`` is ``h/values`` and
    ``h/bins``; keys containing ``/`` themselves arrive as nested keys too)."""
    run = OfflineRun()
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind in ("run", "config"):
            items = (record.run.config if kind == "run" else record.config).update
            run.config.update({_path(i): json.loads(i.value_json) for i in items})
        elif kind == "history":
            row = {_path(i): json.loads(i.value_json) for i in record.history.item}
            run.history[int(row["_step"])] = row
        elif kind == "summary":
            run.summary.update({_path(i): json.loads(i.value_json) for i in record.summary.update})
        elif kind == "exit":
            run.exited = True
    return run


def read_finished_run(run_dir: Path, run_id: str, timeout_s: float = 30.0) -> OfflineRun:
    """The offline run of ``run_id`` under ``run_dir/wandb`` once its exit record is on disk.

    ``finish()`` can return before wandb's service has flushed the stream (a clean-clone CI
    run read only its header): call ``wandb.teardown()`` first, which flushes, and this
    still gives the write time on a loaded machine."""
    (stream,) = (run_dir / "wandb").glob(f"offline-run-*{run_id}/run-{run_id}.wandb")
    deadline = time.monotonic() + timeout_s
    while not (run := read_offline_run(stream)).exited and time.monotonic() < deadline:
        time.sleep(0.2)
    assert run.exited, f"{stream}: no exit record after {timeout_s} s"
    return run
