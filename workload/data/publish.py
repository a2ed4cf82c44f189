"""Publishing a dataset on the share: the rules a dataset keeps over time, in one place.

- **One source per dataset.** The manifest records where the dataset came from (a folder, a
  ``gs://`` prefix, the simulator) and how its files are read (column mapping, date format);
  another source or another reading under the same name is refused: publish it under a new
  dataset name.
- **Days are immutable.** A file already published never changes; if its source copy changed (other
  size or checksum), ``seed`` refuses, naming the day. Publish under a new name to start over.
- **New days are appended.** Files new in the source are copied, validated together with the
  published ones (transaction IDs unique across the dataset, no day re-sent under new IDs, roles
  apart in time, training before testing), moved in, and
  then the manifest is replaced: the manifest is the publishing point, so a worker never sees a
  half-added day. ``seed`` then enqueues them for every run (see ``workload.queue.plan``).
- **Nothing half-done.** Files are copied to a staging folder on the share first; a bad file, an
  unreachable bucket or a kill leaves the published dataset as it was.
- **One publisher at a time.** Two loaders on one dataset (a reload racing a slower one, each seeing
  another listing of the source) take turns under a lock on the share (``.<name>.lock`` beside the
  dataset; POSIX locks, which NFS carries to the server and the kernel drops when the holder dies).
  The second reads the manifest the first wrote and adds only what is still new: a published day
  stays published, and no loader enqueues a day that another loader's manifest then drops.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workload.core import faults
from workload.data.dayfile import (
    REQUIRED_ROLES,
    DatasetError,
    check_suffix,
    describe,
    labelled,
    place,
    read_transactions,
    source_name,
)
from workload.data.manifest import MANIFEST, manifest_reading, read_manifest, save_manifest
from workload.data.reading import AS_IS, Reading
from workload.data.rules import RowHashes, calendar_gaps, check_dataset, history_shortfall, late_postings
from workload.data.source import Source, SourceFile
from workload.share.fsutil import FILE_MODE, fsync_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """What one publish did: files copied from the source, files already on the share."""

    root: Path
    source: str
    copied: list[str]
    unchanged: int
    entries: list[dict[str, Any]]


def recorded_source(root: Path) -> str | None:
    """The source a published dataset records; None if the dataset is absent or records none."""
    if not (root / MANIFEST).exists():
        return None
    return read_manifest(root).get("source")


def check_source(root: Path, manifest: dict[str, Any], uri: str, reading: Reading = AS_IS) -> None:
    """The same source, read the same way, as the dataset was published from; DatasetError otherwise."""
    recorded = manifest.get("source")
    if recorded == uri:
        was = manifest_reading(manifest)
        if was == reading:
            return
        raise DatasetError(f"dataset {root.name!r} on the share was published with {was.describe()}; refusing "
                              f"{reading.describe()}: a changed mapping or date format is a new dataset. Publish it "
                              "under a new dataset name (--dataset NAME)")
    seen = f"was published from {recorded}" if recorded else "records no source (laid out by hand or an older seed)"
    raise DatasetError(f"dataset {root.name!r} on the share {seen}; refusing to feed it from {uri}: a dataset "
                          "has one source. Publish this one under a new dataset name (--dataset NAME)")


def _changed(f: SourceFile, entry: dict[str, Any]) -> str:
    was = entry.get("source") or {}
    return (f"{f.rel} ({f.uri}) changed since it was published ({was.get('size')} bytes, crc32c "
            f"{was.get('crc32c')}; now {f.size} bytes, crc32c {f.crc32c}); published days are immutable: "
            "restore it, or publish the changed data under a new dataset name (--dataset NAME)")


def publish(root: Path, src: Source, reading: Reading = AS_IS,
            required: tuple[str, ...] = REQUIRED_ROLES, called: str | None = None) -> Outcome:
    """Bring the dataset at `root` up to date with `src`, its files read through `reading`: copy
    what is new, refuse what changed. `required`: the roles the dataset must have (score needs none).
    `called`: what its warnings call the dataset, "dataset <name>" unless given (score's copy is a
    temporary folder: it names the user's source instead).

    Loaders of one dataset take turns: the later one syncs against what the earlier one published."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with _publishing(root):
        _remove_staging(root)
        return _publish(root, src, reading, required, called or f"dataset {root.name}")


def lock_path(root: Path) -> Path:
    """The dataset's publishing lock: beside it, since the dataset's folder appears by one rename."""
    return root.parent / f".{root.name}.lock"


@contextmanager
def _publishing(root: Path) -> Iterator[None]:
    """Hold the dataset's publishing lock (waiting for another loader's turn to end)."""
    fd = os.open(lock_path(root), os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            log.info("dataset %s: another loader is publishing it; waiting for its turn to end", root.name)
            fcntl.lockf(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _publish(root: Path, src: Source, reading: Reading, required: tuple[str, ...], called: str) -> Outcome:
    manifest = read_manifest(root) if (root / MANIFEST).exists() else None
    if manifest is None and root.exists():
        if any(root.iterdir()):
            raise DatasetError(f"{root} is on the share without a {MANIFEST} (not published by seed): "
                                  "remove it, or publish under another dataset name (--dataset NAME)")
        root.rmdir()
    if manifest is not None:
        check_source(root, manifest, src.uri, reading)
    published = {e["path"]: e for e in (manifest or {"files": []})["files"]}
    listed = src.files()
    for f in listed:
        check_suffix(f.rel, f.uri)  # pickle is refused before a byte is copied
    changed = [f for f in listed if f.rel in published and not f.same_content(published[f.rel].get("source") or {})]
    if changed:
        more = f" (and {len(changed) - 1} more changed file(s))" if len(changed) > 1 else ""
        raise DatasetError(_changed(changed[0], published[changed[0].rel]) + more)
    gone = sorted(set(published) - {f.rel for f in listed})
    if gone and manifest is not None:
        log.warning("%s: %d published file(s) are no longer in the source and stay on the share (days are "
                    "immutable), for example %s", src.uri, len(gone), ", ".join(gone[:3]))
    new = [f for f in listed if f.rel not in published]
    entries = list(published.values())
    if new or manifest is None:
        entries = _add(root, src, new, manifest is None, entries, reading, required)
    for warning in (history_shortfall(entries), calendar_gaps(entries)):
        if warning:
            log.warning("%s: %s", called, warning)
    return Outcome(root=root, source=src.uri, copied=[f.rel for f in new], unchanged=len(listed) - len(new),
                   entries=entries)


def _add(root: Path, src: Source, new: list[SourceFile], first: bool, published: list[dict[str, Any]],
         reading: Reading, required: tuple[str, ...]) -> list[dict[str, Any]]:
    """Copy `new` into a staging folder, validate them with the published files, then publish."""
    staging = root.parent / f".{root.name}.staging-{uuid.uuid4().hex[:12]}"  # unique: loader pods are all pid 1
    staging.mkdir(parents=True)  # with the umask's mode, as the published folder must have (mkdtemp would give 0700)
    try:
        added, keys, ignored = [], {}, set()
        for f in new:
            dest = staging / f.rel
            src.fetch(f, dest)
            frame = read_transactions(dest, f.uri, reading, labelled(f.rel))
            added.append({**describe(frame, f.rel), "source": f.identity()})
            keys[f.rel] = RowHashes.of(frame)
            ignored.update(frame.attrs.get("ignored", ()))
        if ignored:
            log.info("%s: ignored column(s): %s (not in the schema: never features)", src.uri,
                     ", ".join(sorted(ignored)))
        for entry in published:  # a re-sent day is found against every day, so each is read again
            rel = entry["path"]
            keys[rel] = RowHashes.of(read_transactions(root / rel, source_name(entry), reading, labelled(rel)))
        entries = published + added
        for warning in check_dataset(entries, keys, src.uri, required):
            log.warning("%s: %s", src.uri, warning)
        faults.point("staged")
        if first:
            save_manifest(staging, entries, src.uri, reading)
            os.rename(staging, root)  # the whole dataset appears at once
            fsync_dir(root.parent)
            faults.point("published")
        else:
            for f in new:
                (root / f.rel).parent.mkdir(exist_ok=True)
                os.replace(staging / f.rel, root / f.rel)  # invisible to workers until the manifest names it
                faults.point("day-moved")
            for role in {f.rel.split("/")[0] for f in new}:
                fsync_dir(root / role)
            save_manifest(root, entries, src.uri, reading)
            faults.point("published")
        _log_added(root, src.uri, added, first)
        return entries
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove_staging(root: Path) -> None:
    """Staging folders left by a loader killed mid-copy: only the lock's holder stages, so under the
    lock every one found is a leftover."""
    for stale in root.parent.glob(f".{root.name}.staging-*"):
        log.warning("dataset %s: removing %s, left by a loader that was stopped mid-copy", root.name, stale)
        shutil.rmtree(stale, ignore_errors=True)


def _log_added(root: Path, uri: str, added: list[dict[str, Any]], first: bool) -> None:
    late = late_postings(added)
    if late:
        log.info("%s: %s", uri, late)
    rows = sum(e["rows"] for e in added)
    frauds = sum(e["frauds"] for e in added)
    days = sorted({place(e) for e in added})
    span = f", {days[0]}..{days[-1]}" if days else ""
    log.info("dataset %s %s from %s: %d file(s)%s, %d transactions, %d fraudulent (%.2f%%)", root,
             "published" if first else "extended", uri, len(added), span, rows, frauds,
             100 * frauds / max(rows, 1))
