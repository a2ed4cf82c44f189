"""Crash-safe file writes: a reader sees the old file or the new one, never a torn one.

Files are made readable by the group (the share is read by other pods and by people exporting
results); `tempfile.mkstemp` alone would leave them owner-only (0600).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

from workload.core import faults

log = logging.getLogger(__name__)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()  # read once, at import (single-threaded): os.umask can only be read by setting it
FILE_MODE = (0o666 & ~_UMASK) | 0o640  # what open() would give, and always readable by the group

# A seeder's temporary folder: ``.<name>.tmp-<host>-<pid>``; stale once its writer is gone.
STALE_TMP_IDLE_S = 3600.0


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, durable: bool = True) -> None:
    """Temp file in the same folder, flush + fsync, os.replace, fsync the folder. `durable=False` skips both
    fsyncs (a reader still sees the old file or the new one, whole): for files rendered again from what is
    durable (a run's report and pictures, from its checkpoint), where two fsyncs cost more than the render."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), FILE_MODE)
            half = len(data) // 2
            f.write(data[:half])
            f.flush()
            faults.point("mid-write")
            f.write(data[half:])
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename is None:  # write()/fsync() errors name no file: name the one we were writing
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str, durable: bool = True) -> None:
    atomic_write_bytes(path, text.encode(), durable)


def tmp_dir_for(final: Path) -> Path:
    """Where a writer builds `final` before publishing it with one rename: named for this host and
    process, so `clean_stale_tmp` can tell a dead writer's leftovers from a live one's work."""
    final = Path(final)
    return final.parent / f".{final.name}.tmp-{socket.gethostname()}-{os.getpid()}"


def _idle_s(folder: Path) -> float:
    """Seconds since anything in `folder` (recursively) last changed."""
    newest = folder.lstat().st_mtime
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
            except FileNotFoundError:
                continue
    return time.time() - newest


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_OWNER = re.compile(r"^(?P<host>.+)-(?P<pid>\d+)(-[A-Za-z0-9_]+)?$")


def clean_stale_tmp(parent: Path, idle_s: float = STALE_TMP_IDLE_S) -> list[Path]:
    """Remove the temporary folders (``tmp_dir_for``, with or without a random suffix) of writers that
    are gone; returns what was removed.

    A folder from this host whose process is dead goes at once; one from another host (another pod:
    its pid means nothing here) only after `idle_s` without a change."""
    removed: list[Path] = []
    if not Path(parent).is_dir():
        return removed
    host = socket.gethostname()
    for path in Path(parent).glob(".*.tmp-*"):
        if not path.is_dir():
            continue
        m = _OWNER.match(path.name.rsplit(".tmp-", 1)[1])
        try:
            mine_and_dead = bool(m) and m["host"] == host and not _pid_alive(int(m["pid"]))
            if mine_and_dead or _idle_s(path) > idle_s:
                shutil.rmtree(path, ignore_errors=True)
                log.warning("removed %s, left behind by a writer that is gone", path)
                removed.append(path)
        except FileNotFoundError:
            continue
    return removed
