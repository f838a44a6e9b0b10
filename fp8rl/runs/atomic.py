"""Crash-safe writes: whole files and directories by temp-and-rename, log lines by single appends.

A reader of a file written here sees either the old content or the new, never a
mix: the new bytes go to a temporary file in the same directory, are fsynced,
and replace the target with ``os.replace`` (atomic on POSIX); the directory is
then fsynced so the rename itself survives a power cut. Temporary files are
named ``.tmp-<name>.<pid>.<random>``; one left behind by a killed process is
never mistaken for the real file and is removed by :func:`remove_stale_temp_files`.

Directories (:func:`atomic_directory`: a run exported to ``results/``, an HF checkpoint)
are built under the same kind of name and renamed into place. One that replaces an
existing directory is swapped in with ``renameat2(RENAME_EXCHANGE)`` (Linux 3.15+ and
glibc 2.28+, called through ctypes; local filesystems such as ext4, xfs, btrfs and tmpfs
have it), so the target always holds a complete copy, old or new. Where the exchange is not
there (another OS or C library, a filesystem such as NFS that answers EINVAL; tested by
forcing it off) the old copy is first renamed to
``.old-<name>.<pid>.<random>`` and the new one renamed in: a kill between the two leaves
the target missing, its last complete copy under ``.old-``. Every ``.tmp-``/``.old-`` name
starts with a dot, which every reader of a run store skips; :func:`orphaned_copies` lets
readers take a ``.old-`` copy whose target is missing, and :func:`recover_directories`,
which every :func:`atomic_directory` call runs on its target's directory first, renames it
back and removes the other leftovers. A writer holds an exclusive ``flock`` on its
directories while it works, which the kernel drops however it dies, so recovery never
touches a live writer's (on a filesystem without flock, one writer per directory at a
time).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import json
import logging
import os
import re
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from fp8rl.runs.lock import pid_alive

logger = logging.getLogger(__name__)

TEMP_PREFIX = ".tmp-"
#: where the fallback of :func:`atomic_directory` keeps the old copy while it swaps
OLD_PREFIX = ".old-"
#: the audit event (``sys.audit``) raised just before a directory exchange
EXCHANGE_EVENT = "fp8rl.atomic.exchange"
_LEFTOVER = re.compile(r"^\.(?:tmp|old)-(?P<name>.+)\.(?P<pid>\d+)\.(?P<tag>[0-9a-f]{8})$")
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def temp_path_for(path: Path) -> Path:
    """A fresh temporary name next to ``path`` (same directory, so rename is atomic)."""
    return _sibling(path, TEMP_PREFIX)


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


# ------------------------------------------------------------------ whole directories
#
# A directory replaced by atomic_directory goes through at most these names, each step one
# rename or one removal, so a kill between any two leaves one of a few states, all of which
# recover_directories puts right and no reader mistakes for a result:
#
#   build   .tmp-<name>.<pid>.<tag>  (the new copy; <name> untouched)
#   swap    exchange(.tmp-..., <name>)  -> <name> new, .tmp-... the old copy    (Linux)
#     or    <name> -> .old-<name>.<pid>.<tag>; .tmp-... -> <name>                (fallback)
#   clean   remove .tmp-... / .old-...


def _sibling(path: Path, prefix: str) -> Path:
    return path.with_name(f"{prefix}{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")


def _fsync_tree(directory: Path) -> None:
    for entry in directory.rglob("*"):
        if entry.is_file():
            fd = os.open(entry, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _exchange(a: Path, b: Path) -> bool:
    """Swap the entries ``a`` and ``b`` in one step (``renameat2(RENAME_EXCHANGE)``); False
    where the C library, kernel or filesystem cannot (the caller then takes two renames)."""
    fn = _renameat2()
    if fn is None:
        return False
    sys.audit(EXCHANGE_EVENT, str(a), str(b))
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        logger.debug("no RENAME_EXCHANGE for %s (%s): two renames", b, os.strerror(err))
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _lock(directory: Path, operation: int) -> int | None:
    """An open descriptor of ``directory`` holding ``flock(operation)``, or None where the
    filesystem has no flock. Raises ``BlockingIOError`` for a non-blocking lock held
    elsewhere, ``FileNotFoundError`` if the directory went."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, operation)
    except BlockingIOError:
        os.close(fd)
        raise
    except OSError as exc:
        os.close(fd)
        logger.debug("no flock on %s (%s)", directory, exc)
        return None
    return fd


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _writer_alive(entry: Path, operation: int = fcntl.LOCK_EX) -> tuple[bool, int | None]:
    """Whether the process that made leftover ``entry`` still works on it, and (if not) a
    descriptor holding ``operation`` on it for the caller to close.

    Writers hold an exclusive flock on their directories while they work, which the kernel
    drops however they die. A directory made but not yet locked is empty: an empty one
    whose writer (the pid in its name) is alive is left to it.
    """
    try:
        fd = _lock(entry, operation | fcntl.LOCK_NB)
    except (BlockingIOError, FileNotFoundError):
        return True, None
    match = _LEFTOVER.match(entry.name)
    if match and pid_alive(int(match["pid"])) and not any(entry.iterdir()):
        _close(fd)
        return True, None
    return False, fd


def _leftovers(directory: Path) -> dict[Path, list[Path]]:
    """Leftover directories of killed writers in ``directory``, by the target they were for."""
    found: dict[Path, list[Path]] = {}
    if not directory.is_dir():
        return found
    for entry in directory.iterdir():
        match = _LEFTOVER.match(entry.name)
        if match and entry.is_dir() and not entry.is_symlink():
            found.setdefault(directory / match["name"], []).append(entry)
    return found


def _newest_first(entries: list[Path]) -> list[Path]:
    def changed(entry: Path) -> float:
        try:
            return entry.stat().st_ctime
        except FileNotFoundError:
            return 0.0

    return sorted(entries, key=lambda e: (-changed(e), e.name))


def recover_directories(directory: Path) -> list[Path]:
    """Put right what killed :func:`atomic_directory` calls left in ``directory``.

    For each target: if it is missing and a ``.old-`` copy of it is left (a kill between the
    fallback's two renames), the newest such copy is renamed back; then every other
    ``.tmp-``/``.old-`` directory for it is removed. Leftovers of a writer still at work are
    left alone. Safe to repeat, and to kill: every step is one rename or removal. Returns
    the leftovers handled (restored or removed).
    """
    directory = Path(directory)
    handled: list[Path] = []
    for target, entries in sorted(_leftovers(directory).items()):
        aside = [e for e in entries if e.name.startswith(OLD_PREFIX)]
        for entry in _newest_first(aside) + sorted(set(entries) - set(aside)):
            alive, fd = _writer_alive(entry)
            if alive:
                logger.debug("%s: its writer is still at work; left alone", entry)
                continue
            try:
                if entry in aside and not target.exists():
                    os.rename(entry, target)
                    fsync_dir(directory)
                    logger.warning("restored %s from %s (left by a killed writer)", target, entry)
                else:
                    shutil.rmtree(entry, ignore_errors=True)
                    if entry.exists():
                        logger.warning("could not remove %s; left for the next time", entry)
                        continue
                    logger.info("removed %s (left by a killed writer)", entry)
            finally:
                _close(fd)
            handled.append(entry)
    return handled


def orphaned_copies(directory: Path) -> dict[str, Path]:
    """For readers: the last complete copy of each entry of ``directory`` that a killed
    writer left missing, by the entry's name (``.old-<name>...``; see
    :func:`recover_directories`, which renames it back). Reads nothing else and changes
    nothing."""
    out: dict[str, Path] = {}
    for target, entries in _leftovers(Path(directory)).items():
        if target.exists():
            continue
        for entry in _newest_first([e for e in entries if e.name.startswith(OLD_PREFIX)]):
            alive, fd = _writer_alive(entry, fcntl.LOCK_SH)
            _close(fd)
            if not alive:  # (a live writer's is about to be replaced by the new copy)
                out[target.name] = entry
                break
    return out


@contextlib.contextmanager
def atomic_directory(path: Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Build a directory under a temporary name and put it at ``path`` on success.

    Yields the temporary directory (a sibling of ``path``, so the renames are atomic). If the
    block raises, ``path`` is untouched and the temporary directory removed. An existing
    ``path`` is an error unless ``overwrite``, in which case it is replaced: exchanged with
    the new copy in one step where Linux allows (``renameat2(RENAME_EXCHANGE)``), else moved
    aside to ``.old-<name>...`` before the new copy is renamed in; the old copy is deleted
    after. Leftovers of earlier killed calls in ``path``'s directory are first put right
    (:func:`recover_directories`). After a kill at any point, ``path`` holds the old copy
    or the new one, or is missing with its old copy under ``.old-`` (fallback only), which
    readers take (:func:`orphaned_copies`) and the next call renames back.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_directories(path.parent)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists")
    tmp = temp_path_for(path)
    tmp.mkdir()
    held = [_lock(tmp, fcntl.LOCK_EX)]
    aside = None
    try:
        yield tmp
        _fsync_tree(tmp)
        if not path.exists():
            os.replace(tmp, path)
            fsync_dir(path.parent)
        elif _exchange(tmp, path):
            fsync_dir(path.parent)
            shutil.rmtree(tmp, ignore_errors=True)  # the old copy now
        else:
            held.append(_lock(path, fcntl.LOCK_EX))  # so nobody takes the aside for orphaned
            aside = _sibling(path, OLD_PREFIX)
            os.replace(path, aside)
            os.replace(tmp, path)
            fsync_dir(path.parent)
            shutil.rmtree(aside, ignore_errors=True)
    except BaseException:
        if aside is not None and aside.exists() and not path.exists():
            os.replace(aside, path)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        for fd in held:
            _close(fd)
