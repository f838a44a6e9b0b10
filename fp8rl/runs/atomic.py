"""Crash-safe file writes: whole files by temp-and-rename, log lines by single appends.

A reader of a file written here sees either the old content or the new, never a
mix: the new bytes go to a temporary file in the same directory, are fsynced,
and replace the target with ``os.replace`` (atomic on POSIX); the directory is
then fsynced so the rename itself survives a power cut. Temporary files are
named ``.tmp-<name>.<pid>.<random>``; one left behind by a killed process is
never mistaken for the real file and is removed by :func:`remove_stale_temp_files`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

logger = logging.getLogger(__name__)

TEMP_PREFIX = ".tmp-"


def temp_path_for(path: Path) -> Path:
    """A fresh temporary name next to ``path`` (same directory, so rename is atomic)."""
    return path.with_name(f"{TEMP_PREFIX}{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")


def fsync_dir(directory: Path) -> None:
    """Flush a directory entry (a rename or a new file) to disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically; ``durable`` adds the fsyncs."""
    path = Path(path)
    tmp = temp_path_for(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_with(
    path: Path, write: Callable[[BinaryIO], object], *, durable: bool = True
) -> None:
    """Replace ``path`` atomically with what ``write`` puts into a binary file object.

    For writers that want a file object (``torch.save``). If ``write`` raises, or
    the process dies, ``path`` keeps its old content.
    """
    path = Path(path)
    tmp = temp_path_for(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str, *, durable: bool = True) -> None:
    """Replace ``path`` with UTF-8 ``text`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"), durable=durable)


def atomic_write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    """Replace ``path`` with ``obj`` as indented JSON (keys in insertion order)."""
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n", durable=durable)


def append_line(path: Path, line: bytes, *, durable: bool = True) -> None:
    """Append one complete line to ``path`` with a single ``write`` call.

    ``line`` must end with ``\\n`` and contain no other newline. One ``write`` on an
    ``O_APPEND`` descriptor never interleaves with other appenders and never
    touches earlier bytes, so a kill can at worst leave this line torn (no
    trailing newline) at the end of the file.
    """
    if not line.endswith(b"\n") or b"\n" in line[:-1]:
        raise ValueError("append_line takes exactly one line ending in a newline")
    path = Path(path)
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, line)
        if written != len(line):  # only on a full disk or a signal; finish the line
            logger.warning("short append to %s (%d of %d bytes)", path, written, len(line))
            _write_all(fd, line[written:])
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    if durable and created:
        fsync_dir(path.parent)


def remove_stale_temp_files(directory: Path) -> list[Path]:
    """Delete temporary files left in ``directory`` by killed writers; return them.

    Only call this while holding the run's lock: a live writer's temp file would
    otherwise be pulled from under it.
    """
    removed: list[Path] = []
    directory = Path(directory)
    if not directory.is_dir():
        return removed
    for entry in directory.iterdir():
        if entry.name.startswith(TEMP_PREFIX) and entry.is_file():
            entry.unlink()
            removed.append(entry)
    if removed:
        logger.info("removed %d leftover temporary file(s) in %s", len(removed), directory)
    return removed


@contextlib.contextmanager
def atomic_directory(path: Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Build a directory under a temporary name and rename it to ``path`` on success.

    Yields the temporary directory (a sibling of ``path``, so the rename is atomic). If
    the block raises or the process dies, ``path`` is untouched and the temporary
    directory is removed (or, after a kill, left under a ``.tmp-`` name that is never
    mistaken for the real one). An existing ``path`` is an error unless ``overwrite``,
    in which case it is replaced (moved aside, then deleted after the rename).
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
    tmp.mkdir()
    try:
        yield tmp
        for entry in tmp.rglob("*"):
            if entry.is_file():
                fd = os.open(entry, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        old = None
        if path.exists():
            old = temp_path_for(path)
            os.replace(path, old)
        os.replace(tmp, path)
        fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
