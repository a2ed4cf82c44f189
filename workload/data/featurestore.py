"""Features once per dataset: each day's features on the share, next to the day, computed on CPU.

Features are a property of the data, not of a run, so a sweep of N runs must not compute them N
times on GPU nodes. ``seed`` (the loader Job, CPU only) computes every training and testing day's
features right after the dataset is published, and again for days appended later; a worker that
finds a day without them (or with stale or damaged ones) computes and stores them itself.

This module only stores and checks: the dataset (``workload.data.dataset``) decides what a day's
features are computed from (its window's files, ``Dataset.feature_inputs``), asks here for stored ones
and computes the rest. It never calls back into the dataset.

Layout: ``datasets/<name>/features/<FEATURE_VERSION>/<role>/<day file stem>.npy``: six .npy arrays
back to back (the float32 features ``[n, len(FEATURE_NAMES)]``, then labels, days, cards, the
known-compromised flag and transaction IDs), read with one copy and viewed in place; never unpickled (only those plain
dtypes are accepted). Next to it ``<stem>.json``, its manifest entry: the feature version and names,
the dataset files the day's window read (path, rows, frauds, first and last day, from the dataset
manifest), and the array file's size and checksum. Both are written atomically, the data first, so an entry
never names a file that is not whole. A stored day is used only if its entry matches this code's version and
names and the dataset's current files, and the bytes match the checksum; otherwise it is
recomputed (and a warning says why), never trusted.

The checksum is CRC32C, as Cloud Storage's own (google-crc32c's C extension: ~10 GB/s), not sha256: it guards
against damage, as Filestore's or a disk's errors would do it (a writer able to replace the file could replace its
entry too, whatever the hash), and sha256 cost 0.13 s of a GPU worker's 1M-row day on an H200 pod's Xeon
(issue 33: per-item overhead), CRC32C ~0.01 s. Entries written with a sha256 (before) are still checked with it,
and written again with CRC32C only when recomputed for another reason. Where google-crc32c has no C extension
(its pure-Python fallback reads ~100 MB in tens of seconds), the store writes and checks sha256 instead.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import mmap
import os
from pathlib import Path, PurePosixPath
from typing import Any

import google_crc32c
import numpy as np

from workload.data import features
from workload.share.fsutil import atomic_write_bytes, atomic_write_text

log = logging.getLogger(__name__)

FOLDER = "features"
STORED_ROLES = ("training", "testing")  # history days only feed windows: never trained or evaluated
_ARRAYS = (("x", "<f4"), ("y", "<f4"), ("day", "<M8[D]"), ("card", "<i8"), ("known", "|b1"), ("ids", "<i8"))
LAYOUT = 2  # what the file holds (the arrays above): another layout is recomputed, whatever its version
FAST_CRC = google_crc32c.implementation == "c"
CHUNK = 1 << 20  # bytes read, then checksummed, at a time: a chunk's copy for google-crc32c stays in cache


def _checksum(data: bytes) -> tuple[str, str]:
    """(entry key, value) of the checksum this process writes: CRC32C (hex) with google-crc32c's C extension, else
    sha256 (see the module's docstring)."""
    return ("crc32c", f"{google_crc32c.value(data):08x}") if FAST_CRC else ("sha256", hashlib.sha256(data).hexdigest())


class StaleFeatures(Exception):
    """A stored day that must not be used: the message says why."""


def _check(entry: dict[str, Any], data: np.ndarray, crc: str | None, data_path: Path, entry_path: Path) -> None:
    """`StaleFeatures` unless `data` (whose CRC32C `_read` took as it read; None without the C extension) has the
    size and checksum `entry` records: CRC32C or, in an entry written before it, sha256."""
    if entry.get("bytes") == len(data):
        if "crc32c" in entry and crc is not None:
            if entry["crc32c"] == crc:
                return
        elif "sha256" in entry:
            if entry["sha256"] == hashlib.sha256(data).hexdigest():
                return
        elif "crc32c" in entry:
            raise StaleFeatures(f"{entry_path}: its CRC32C needs google-crc32c's C extension, which this Python lacks")
    raise StaleFeatures(f"{data_path}: checksum mismatch with {entry_path.name} (damaged or replaced)")


def paths(root: Path, rel: str) -> tuple[Path, Path]:
    """(arrays, entry) of dataset file `rel` (``training/2018-04-01.parquet``) under `root`."""
    rel_path = PurePosixPath(rel)
    base = Path(root) / FOLDER / features.FEATURE_VERSION / rel_path.parent / rel_path.stem
    return base.with_suffix(".npy"), base.with_suffix(".json")


def _to_bytes(out: dict[str, np.ndarray]) -> bytes:
    """The day's arrays as .npy records back to back: x (float32 [n, features]), then y, day, card, known, ids."""
    buf = io.BytesIO()
    for name, dtype in _ARRAYS:
        np.lib.format.write_array(buf, np.ascontiguousarray(out[name], dtype=dtype), allow_pickle=False)
    return buf.getvalue()


def _from_bytes(data: bytearray | np.ndarray) -> dict[str, np.ndarray]:
    """Arrays viewed in place on `data` (no copy: the 1M-row day is ~90 MB); only the expected plain
    dtypes are accepted, so nothing here can unpickle."""
    out, pos = {}, 0
    for name, dtype in _ARRAYS:
        head = io.BytesIO(bytes(data[pos:pos + 4096]))
        version = np.lib.format.read_magic(head)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, seen = read_header(head)
        if np.dtype(seen) != np.dtype(dtype) or fortran:
            raise ValueError(f"array {name}: dtype {seen}{' (Fortran order)' if fortran else ''}, expected {dtype}")
        count = int(np.prod(shape))
        start = pos + head.tell()
        if start + count * np.dtype(dtype).itemsize > len(data):
            raise ValueError(f"array {name}: truncated")
        out[name] = np.frombuffer(data, dtype=dtype, count=count, offset=start).reshape(shape)
        pos = start + count * np.dtype(dtype).itemsize
    if pos != len(data) or out["x"].ndim != 2 or out["x"].shape[1] != len(features.FEATURE_NAMES):
        raise ValueError(f"unexpected layout: x {out['x'].shape}, {len(data) - pos} trailing bytes")
    if any(len(out[name]) != len(out["x"]) for name, _ in _ARRAYS):
        seen = ", ".join(f"{name} {len(out[name])}" for name, _ in _ARRAYS)
        raise ValueError(f"arrays of different lengths ({seen}): each must have x's {len(out['x'])} rows")
    return out


def _buffer(size: int) -> np.ndarray:
    """`size` writable bytes, not zero-filled by hand: an anonymous private mapping, its pages mapped at once where the
    system can (MAP_POPULATE, Linux). Reading the 1M-row day's 101 MB into it takes ~60 ms where a bytearray (zeroed
    page by page first) took ~120 ms; and unlike numpy's own large arrays it asks for no huge pages, whose
    compaction stalled first reads here by hundreds of milliseconds (issue 33: per-item overhead)."""
    if size == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):  # Windows' mmap takes no flags: a bytearray, as before
        return np.frombuffer(bytearray(size), dtype=np.uint8)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return np.frombuffer(mmap.mmap(-1, size, flags=flags), dtype=np.uint8)  # unmapped when its last view goes


def _read(path: Path) -> tuple[np.ndarray, str | None]:
    """The file's bytes in a writable buffer (so that arrays viewed on it are writable), read once, and their CRC32C
    taken chunk by chunk as they arrive (None without google-crc32c's C extension, which wants read-only bytes)."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        data = _buffer(size)
        view, crc = memoryview(data), 0
        for start in range(0, size, CHUNK):
            got = f.readinto(view[start:start + CHUNK])
            if got != min(CHUNK, size - start):
                raise OSError(f"{path}: changed while read")
            if FAST_CRC:
                crc = google_crc32c.extend(crc, bytes(view[start:start + got]))
        if f.read(1):
            raise OSError(f"{path}: changed while read")
    return data, f"{crc:08x}" if FAST_CRC else None


def load(root: Path, rel: str, inputs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """The stored features of day `rel` of the dataset at `root`; `StaleFeatures` if missing, stale
    (computed from other `inputs` than the dataset's now), or damaged."""
    data_path, entry_path = paths(root, rel)
    try:
        entry = json.loads(entry_path.read_text())
        data, crc = _read(data_path)
    except FileNotFoundError as exc:
        raise StaleFeatures(f"{exc.filename} is missing") from exc
    except (OSError, ValueError) as exc:
        raise StaleFeatures(f"{entry_path}: unreadable ({exc})") from exc
    if not isinstance(entry, dict):
        raise StaleFeatures(f"{entry_path}: not a feature manifest entry")
    if (entry.get("version"), entry.get("layout")) != (features.FEATURE_VERSION, LAYOUT) or entry.get(
            "names") != list(features.FEATURE_NAMES):
        raise StaleFeatures(f"{entry_path}: features of version {entry.get('version')!r}, this code computes "
                            f"{features.FEATURE_VERSION!r}")
    if entry.get("inputs") != inputs:
        raise StaleFeatures(f"{entry_path}: computed from other dataset files than the share now holds")
    _check(entry, data, crc, data_path, entry_path)
    try:
        out = _from_bytes(data)
    except ValueError as exc:
        raise StaleFeatures(f"{data_path}: unreadable ({exc})") from exc
    if len(out["y"]) != entry.get("rows"):
        raise StaleFeatures(f"{data_path}: {len(out['y'])} rows, its entry says {entry.get('rows')}")
    return out


def store(root: Path, rel: str, out: dict[str, np.ndarray], inputs: list[dict[str, Any]]) -> None:
    """Write a day's features, then its entry (each atomically), recording the `inputs` they were
    computed from."""
    data_path, entry_path = paths(root, rel)
    data = _to_bytes(out)
    atomic_write_bytes(data_path, data)
    entry = {"version": features.FEATURE_VERSION, "layout": LAYOUT, "names": list(features.FEATURE_NAMES),
             "day_file": rel,
             "rows": int(len(out["y"])), "bytes": len(data), **dict([_checksum(data)]), "inputs": inputs}
    atomic_write_text(entry_path, json.dumps(entry, indent=1) + "\n")
