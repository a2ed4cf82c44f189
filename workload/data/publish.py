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
- **The daily cycle** (``workload.data.cycle``, opt-in: ``seed --test-window N``): the rule that picks
  the test days is recorded once and never changes; late labels for a published training day are
  published as a new version of it (the old entry retired), and a scored day that arrives labelled
  retires its unlabelled copy.
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
from pathlib import Path, PurePosixPath
from typing import Any

from workload.core import faults
from workload.data import cycle as cycles
from workload.data.cycle import Cycle
from workload.data.dayfile import (
    REQUIRED_ROLES,
    TRAINING,
    DatasetError,
    check_suffix,
    describe,
    labelled,
    place,
    read_transactions,
    source_name,
)
from workload.data.manifest import MANIFEST, manifest_cycle, manifest_reading, read_manifest, save_manifest
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


def recorded_cycle(root: Path, manifest: dict[str, Any], asked: Cycle | None) -> Cycle | None:
    """The cycle the published dataset follows; DatasetError when `asked` is another one (given again, the
    same rule is fine; left out, the recorded one holds)."""
    was = manifest_cycle(manifest)
    if asked is None or asked == was:
        return was
    raise DatasetError(f"dataset {root.name!r} on the share follows {cycles.describe(was)}; refusing "
                       f"{asked.describe()}: days would move between training and testing. Publish it under a new "
                       "dataset name (--dataset NAME)")


def _changed(f: SourceFile, entry: dict[str, Any]) -> str:
    was = entry.get("source") or {}
    return (f"{f.rel} ({f.uri}) changed since it was published ({was.get('size')} bytes, crc32c "
            f"{was.get('crc32c')}; now {f.size} bytes, crc32c {f.crc32c}); published days are immutable: "
            "restore it, or publish the changed data under a new dataset name (--dataset NAME)")


def publish(root: Path, src: Source, reading: Reading = AS_IS,
            required: tuple[str, ...] = REQUIRED_ROLES, called: str | None = None,
            cycle: Cycle | None = None) -> Outcome:
    """Bring the dataset at `root` up to date with `src`, its files read through `reading`: copy
    what is new, refuse what changed. `required`: the roles the dataset must have (score needs none).
    `called`: what its warnings call the dataset, "dataset <name>" unless given (score's copy is a
    temporary folder: it names the user's source instead).

    `cycle`: the daily cycle's rule for a new dataset (a published one keeps the one it records).

    Loaders of one dataset take turns: the later one syncs against what the earlier one published."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with _publishing(root):
        _remove_staging(root)
        return _publish(root, src, reading, required, called or f"dataset {root.name}", cycle)


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


def _publish(root: Path, src: Source, reading: Reading, required: tuple[str, ...], called: str,
             cycle: Cycle | None) -> Outcome:
    manifest = read_manifest(root) if (root / MANIFEST).exists() else None
    if manifest is None and root.exists():
        if any(root.iterdir()):
            raise DatasetError(f"{root} is on the share without a {MANIFEST} (not published by seed): "
                                  "remove it, or publish under another dataset name (--dataset NAME)")
        root.rmdir()
    if manifest is not None:
        check_source(root, manifest, src.uri, reading)
        cycle = recorded_cycle(root, manifest, cycle)
    published = {cycles.source_rel(e): e for e in (manifest or {"files": []})["files"]}
    retired = list((manifest or {}).get(cycles.RETIRED, []))
    left = {cycles.source_rel(r) for r in retired} - set(published)  # source files whose day left the manifest
    listed = [f for f in src.files() if f.rel not in left]
    for f in listed:
        check_suffix(f.rel, f.uri)  # pickle is refused before a byte is copied
    changed = [f for f in listed if f.rel in published and not f.same_content(published[f.rel].get("source") or {})]
    # The daily cycle: late labels for a training day are a new version of it (checked in _add).
    versions = {f.rel: _next_version(published[f.rel], published, retired)
                for f in changed if cycle and f.rel.startswith(f"{TRAINING}/")}
    changed = [f for f in changed if f.rel not in versions]
    if changed:
        more = f" (and {len(changed) - 1} more changed file(s))" if len(changed) > 1 else ""
        raise DatasetError(_changed(changed[0], published[changed[0].rel]) + more)
    gone = sorted(set(published) - {f.rel for f in listed})
    if gone and manifest is not None:
        log.warning("%s: %d published file(s) are no longer in the source and stay on the share (days are "
                    "immutable), for example %s", src.uri, len(gone), ", ".join(gone[:3]))
    new = [f for f in listed if f.rel not in published or f.rel in versions]
    entries = list(published.values())
    if new or manifest is None:
        staged = Staged(new, versions, cycle, retired)
        entries = _add(root, src, staged, manifest is None, entries, reading,
                       (TRAINING,) if cycle and required == REQUIRED_ROLES else required)
    for warning in (history_shortfall(entries), calendar_gaps(entries)):
        if warning:
            log.warning("%s: %s", called, warning)
    return Outcome(root=root, source=src.uri, copied=[f.rel for f in new], unchanged=len(listed) - len(new),
                   entries=entries)


@dataclass(frozen=True)
class Staged:
    """What one publish adds: the source files, the new versions among them (source path -> the version's
    path on the share), the dataset's cycle and the entries it retired before."""

    files: list[SourceFile]
    versions: dict[str, tuple[str, int]]
    cycle: Cycle | None
    retired: list[dict[str, Any]]

    def path(self, f: SourceFile) -> str:
        return self.versions[f.rel][0] if f.rel in self.versions else f.rel


def _next_version(entry: dict[str, Any], published: dict[str, dict[str, Any]],
                  retired: list[dict[str, Any]]) -> tuple[str, int]:
    """Where the next version of a published day goes, and its number; refused if a file of the dataset
    already has that path."""
    version = int(entry.get("version", 1)) + 1
    path = cycles.version_path(cycles.source_rel(entry), version)
    if any(e["path"] == path for e in [*published.values(), *retired]):
        raise DatasetError(f"{source_name(entry)}: new labels would be published as {path}, a name the dataset "
                           "already has; rename that source file")
    return path, version


def _add(root: Path, src: Source, staged: Staged, first: bool, published: list[dict[str, Any]],
         reading: Reading, required: tuple[str, ...]) -> list[dict[str, Any]]:
    """Copy the staged files into a staging folder, validate them with the published files, then publish."""
    staging = root.parent / f".{root.name}.staging-{uuid.uuid4().hex[:12]}"  # unique: loader pods are all pid 1
    staging.mkdir(parents=True)  # with the umask's mode, as the published folder must have (mkdtemp would give 0700)
    try:
        added, keys, ignored = [], {}, set()
        for f in staged.files:
            rel = staged.path(f)
            dest = staging / rel
            src.fetch(f, dest)
            frame = read_transactions(dest, f.uri, reading, labelled(rel))
            version = {"from": f.rel, "version": staged.versions[f.rel][1]} if f.rel in staged.versions else {}
            added.append({**describe(frame, rel), "source": f.identity(), **version})
            keys[rel] = RowHashes.of(frame)
            ignored.update(frame.attrs.get("ignored", ()))
        if ignored:
            log.info("%s: ignored column(s): %s (not in the schema: never features)", src.uri,
                     ", ".join(sorted(ignored)))
        for entry in published:  # a re-sent day is found against every day, so each is read again
            rel = entry["path"]
            keys[rel] = RowHashes.of(read_transactions(root / rel, source_name(entry), reading, labelled(rel)))
        retiring = _retire(published, added, keys, staged)
        entries = [e for e in published if e["path"] not in retiring] + added
        for warning in check_dataset(entries, keys, src.uri, required):
            log.warning("%s: %s", src.uri, warning)
        cycles.check_folders(entries, staged.cycle, src.uri)
        faults.point("staged")
        retired = [*staged.retired, *retiring.values()]
        if first:
            save_manifest(staging, entries, src.uri, reading, staged.cycle, retired)
            os.rename(staging, root)  # the whole dataset appears at once
            fsync_dir(root.parent)
            faults.point("published")
        else:
            _move_in(root, staging, [e["path"] for e in added])
            save_manifest(root, entries, src.uri, reading, staged.cycle, retired)
            faults.point("published")
        _log_added(root, src.uri, added, first)
        return entries
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_in(root: Path, staging: Path, rels: list[str]) -> None:
    for rel in rels:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / rel, root / rel)  # invisible to workers until the manifest names it
        faults.point("day-moved")
    for folder in sorted({str(PurePosixPath(rel).parent) for rel in rels}, key=len, reverse=True):
        fsync_dir(root / folder)  # a version's folder (training/v2) before its role's
    for role in {rel.split("/")[0] for rel in rels if rel.count("/") > 1}:
        fsync_dir(root / role)


def _retire(published: list[dict[str, Any]], added: list[dict[str, Any]], keys: dict[str, RowHashes],
            staged: Staged) -> dict[str, dict[str, Any]]:
    """The published entries that leave the manifest (the daily cycle): a day's older version, whose new
    labels must keep its transactions; a scored day now labelled. Their keys leave `keys`."""
    by_source = {cycles.source_rel(e): e for e in published}
    replaced = {}
    for rel, (path, _) in staged.versions.items():
        old = by_source[rel]
        a, b = keys[old["path"]], keys[path]
        if not cycles.same_transactions(a.ids, a.rows, b.ids, b.rows):
            raise DatasetError(f"{source_name(old)} changed since it was published, and not only its labels: new "
                               "labels for a published day (a chargeback) must keep its transactions (IDs, cards, "
                               "terminals, times, amounts); publish other data under a new dataset name")
        replaced[old["path"]] = path
    if staged.cycle is not None:
        replaced |= cycles.scored_now_labelled(published, added, keys)
    for path in replaced:
        del keys[path]
    for old, new in replaced.items():
        log.info("%s: retired, %s replaces it (the daily cycle)", old, new)
    return {e["path"]: {**e, "retired_by": replaced[e["path"]]} for e in published if e["path"] in replaced}


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
