"""Checkpoints on the shared volume: atomic, verified on load, fenced at the storage.

Layout under ``output/<run>/checkpoints/``::

    ckpt-00000007-t42.pt            one plain dict of tensors and numbers (seq 7, written under lease token 42)
    manifest-t000000000042.json     what lease 42 promoted: the retained checkpoints, newest first, with sha256

**Fencing at the storage.** A check ("do I still hold the lease?") followed by a write is not enough:
the writer can freeze between the two for longer than its lease. So the token is part of what is
written, and readers decide by it:

* each lease writes only its own manifest (``manifest-t<token>``), and writes it as soon as it claims
  the run (`fence`), adopting the entries of the newest manifest before it;
* the loader trusts only the manifest with the highest token; a lower one (a stale holder's, however
  late it lands) is never read while a higher one is readable;
* a writer promotes only while no higher manifest exists, and after the lease check (`may_promote`);
* retention deletes a file only if no manifest on the share names it and its token is not above
  the writer's own: a stale writer can never delete what the current holder loads. A manifest keeps the
  newest checkpoints and the day boundaries `ladder` picks (a late day rewinds to the kept one before it).

**What grows with the run stays out of the file.** A checkpoint's list-valued keys named in `SPILLED`
(the run's history and its applied days, an entry each per applied day) are written in immutable segments
of `SEGMENT` entries under ``history/seg-<sha256>.json``, named by their content; the file keeps the
references (file, sha256, count) and the entries since the last full segment. A segment is written once,
shared by every later checkpoint of the lineage, verified against its hash on read and parsed once per
process (its name is its content), so neither a checkpoint's bytes nor the work to write or read it grows
with the days applied. `load` gives the dict back whole, as it was saved. Segments are never pruned
(their total is the history itself, once).

Loading walks the trusted manifest newest first and skips (with a warning) any file whose hash or
contents do not check out, so a torn or corrupt checkpoint falls back to the previous one. Files are
loaded with ``torch.load(weights_only=True)``: no arbitrary unpickling.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workload.core import faults
from workload.share.fsutil import atomic_write_bytes, atomic_write_text

log = logging.getLogger(__name__)

# What the two name makers below write (zero-padded, so names sort as numbers up to 10**8 and 10**12).
_NAME = re.compile(r"^ckpt-(\d{8,})-t(\d+)\.pt$")
_MANIFEST = re.compile(r"^manifest-t(\d{12,})\.json$")
KEEP_MANIFESTS = 3  # the newest leases' manifests: a fallback if the newest is unreadable
# List-valued keys that grow by one entry a day, kept in segment files, not in each checkpoint (the docstring).
SPILLED = ("history", "applied")
SEGMENT = 64  # entries per history segment
SEGMENTS_KEY = "{key}@segments"  # where a checkpoint dict keeps the references of `key`'s segments
_SEGMENT_NAME = re.compile(r"^seg-([0-9a-f]{64})\.json$")
_segment_cache: dict[str, list[Any]] = {}  # sha256 -> entries: content-addressed, so never stale
_ref_cache: dict[tuple[Any, ...], dict[str, Any]] = {}  # a segment's identity (see `_identity`) -> its reference


def checkpoint_name(seq: int, token: int) -> str:
    """The file name of checkpoint `seq` written under lease `token`; `parse_checkpoint_name` inverts it."""
    return f"ckpt-{seq:08d}-t{token}.pt"


def parse_checkpoint_name(name: str) -> tuple[int, int] | None:
    """(seq, token) of a name `checkpoint_name` made; None for any other file (a temp file, a stray)."""
    m = _NAME.match(name)
    return (int(m[1]), int(m[2])) if m else None


def manifest_name(token: int) -> str:
    """The file name of lease `token`'s manifest; `parse_manifest_name` inverts it."""
    return f"manifest-t{token:012d}.json"


def parse_manifest_name(name: str) -> int | None:
    """The lease token of a name `manifest_name` made; None for any other file."""
    m = _MANIFEST.match(name)
    return int(m[1]) if m else None


@dataclass(frozen=True)
class Loaded:
    state: dict[str, Any]
    path: Path
    seq: int
    token: int = 0


def _order(entry: dict[str, Any]) -> tuple[int, int]:
    return int(entry.get("token", 0)), int(entry["seq"])


def _identity(entries: list[Any]) -> tuple[Any, ...]:
    """A cheap key for a segment's entries (history entries name the checkpoint they went into, a file name
    no other entry has), so a save does not serialise every full segment again to learn its name."""
    return tuple((e.get("checkpoint"), e.get("time"), e.get("shard")) if isinstance(e, dict) else repr(e)
                 for e in entries)


RECENT_BOUNDARIES = 8  # day boundaries kept whatever their age: a backfill of last week rewinds at no extra cost


def ladder(seqs: list[int], top: int) -> set[int]:
    """The boundary checkpoints (by seq) that retention keeps, `top` being the newest checkpoint's seq: the
    newest `RECENT_BOUNDARIES`, and of the older ones, at each distance d from `top` in [2**j, 2**(j+1)), the
    oldest in each stretch of 2**(j-1) seqs: about two a doubling, so a run of N checkpoints keeps
    8 + 2 log2(N) boundaries, and a late day k checkpoints back retrains at most about k/2 days more than
    with every boundary kept. The stretches double as `top` grows, and each keeps the oldest of the two it
    merges, so a boundary the rule drops it never asks for again."""
    ordered = sorted(set(seqs), reverse=True)
    kept = set(ordered[:RECENT_BOUNDARIES])
    stretches: dict[tuple[int, int], int] = {}
    for seq in ordered[RECENT_BOUNDARIES:]:
        level = max(top - seq, 1).bit_length() - 1
        width = 1 << max(level - 1, 0)
        key = (width, seq // width)
        stretches[key] = min(seq, stretches.get(key, seq))
    return kept | set(stretches.values())


class SegmentError(ValueError):
    """A history segment is missing, torn or not what its reference says."""


class CheckpointStore:
    def __init__(self, run_dir: Path, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.dir = Path(run_dir) / "checkpoints"
        self.keep = keep

    # -- manifests -------------------------------------------------------------------------------
    def manifest_path(self, token: int) -> Path:
        return self.dir / manifest_name(token)

    def manifests(self) -> list[tuple[int, Path]]:
        """Every lease's manifest, highest token first."""
        if not self.dir.is_dir():
            return []
        found = [(t, p) for p in self.dir.iterdir() if (t := parse_manifest_name(p.name)) is not None]
        return sorted(found, reverse=True)

    def superseded_by(self, token: int) -> int | None:
        """The fencing rule: the highest token above `token` that has written a manifest here (then
        lease `token` is stale and must write nothing), or None while `token` is the newest."""
        found = self.manifests()
        return found[0][0] if found and found[0][0] > token else None

    @property
    def manifest(self) -> Path:
        """The trusted manifest (the highest token's); its mtime is the last promotion."""
        found = self.manifests()
        return found[0][1] if found else self.manifest_path(0)

    def highest_token(self) -> int:
        """The highest lease token anything in this folder was written under (0 if none)."""
        tokens = [t for t, _ in self.manifests()]
        if self.dir.is_dir():
            tokens += [parsed[1] for p in self.dir.iterdir() if (parsed := parse_checkpoint_name(p.name))]
        return max(tokens, default=0)

    def _read_manifest(self, path: Path) -> list[dict[str, Any]]:
        entries = json.loads(path.read_text())["entries"]
        for e in entries:
            if parse_checkpoint_name(e["file"]) is None:
                raise ValueError(f"entry {e['file']!r} is not a checkpoint file name")
        return sorted(entries, key=_order, reverse=True)

    def _entries(self) -> list[dict[str, Any]]:
        """The trusted manifest's entries, newest first. Only if no manifest is readable at all: every
        file found, unverified (a lost manifest must not lose the run)."""
        for _, path in self.manifests():
            try:
                return self._read_manifest(path)
            except FileNotFoundError:
                continue  # pruned between listing and reading: a newer one exists
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("checkpoint manifest %s is unreadable (%s); trying the previous one", path, exc)
        found = []
        for path in self.dir.iterdir() if self.dir.exists() else []:
            parsed = parse_checkpoint_name(path.name)
            if parsed:
                found.append({"file": path.name, "seq": parsed[0], "token": parsed[1], "sha256": None})
        if found:
            log.warning("no readable checkpoint manifest in %s; scanning the folder", self.dir)
        return sorted(found, key=_order, reverse=True)

    def retained(self) -> set[str]:
        """File names of the checkpoints the trusted manifest keeps (the others are pruned)."""
        return {e["file"] for e in self._entries()}

    # -- history segments ------------------------------------------------------------------------
    @property
    def segments_dir(self) -> Path:
        return self.dir / "history"

    def _spill(self, state: dict[str, Any]) -> dict[str, Any]:
        """`state` with each `SPILLED` list cut to its entries since the last full segment, the full segments
        written (once: a segment already on the share is not written again) and referenced."""
        out = dict(state)
        for key in SPILLED:
            entries = state.get(key)
            if not isinstance(entries, list) or SEGMENTS_KEY.format(key=key) in state:
                continue
            full = len(entries) - len(entries) % SEGMENT
            refs = [self._segment(entries[i:i + SEGMENT]) for i in range(0, full, SEGMENT)]
            out[key], out[SEGMENTS_KEY.format(key=key)] = entries[full:], refs
        return out

    def _segment(self, entries: list[Any]) -> dict[str, Any]:
        ident = (str(self.dir), *_identity(entries))
        ref = _ref_cache.get(ident)
        if ref is not None and (self.segments_dir / ref["file"]).exists():
            return dict(ref)
        data = json.dumps(entries, sort_keys=True).encode()
        digest = hashlib.sha256(data).hexdigest()
        ref = {"file": f"seg-{digest}.json", "sha256": digest, "count": len(entries)}
        path = self.segments_dir / ref["file"]
        if not path.exists():
            atomic_write_bytes(path, data)
        _ref_cache[ident] = ref
        _segment_cache.setdefault(digest, json.loads(data))
        return dict(ref)

    def _unspill(self, state: dict[str, Any]) -> dict[str, Any]:
        """The dict as it was saved: each spilled key's segments read back (SegmentError when one is not)."""
        for key in SPILLED:
            refs = state.pop(SEGMENTS_KEY.format(key=key), None)
            if refs is None:
                continue
            whole: list[Any] = []
            for ref in refs:
                whole += self._read_segment(ref)
            state[key] = whole + list(state.get(key, []))
        return state

    def _read_segment(self, ref: dict[str, Any]) -> list[Any]:
        m = _SEGMENT_NAME.match(str(ref.get("file")))
        if not m or m[1] != ref.get("sha256"):
            raise SegmentError(f"history segment reference {ref!r} is not a segment name with its sha256")
        cached = _segment_cache.get(m[1])
        if cached is None:
            try:
                data = (self.segments_dir / ref["file"]).read_bytes()
            except FileNotFoundError:
                raise SegmentError(f"history segment {self.segments_dir / ref['file']} is missing") from None
            if hashlib.sha256(data).hexdigest() != m[1]:
                raise SegmentError(f"history segment {self.segments_dir / ref['file']} does not match its sha256")
            cached = json.loads(data)
            if not isinstance(cached, list) or len(cached) != ref.get("count"):
                raise SegmentError(f"history segment {ref['file']} does not hold {ref.get('count')} entries")
            if len(_segment_cache) > 4096:  # a long-lived process of many runs: start the cache again
                _segment_cache.clear()
            _segment_cache[m[1]] = cached
        return list(cached)

    # -- reading ---------------------------------------------------------------------------------
    def load(self, accept: Callable[[dict[str, Any]], bool] = lambda state: True) -> Loaded | None:
        """The newest checkpoint that verifies and that `accept` takes; None when there is none."""
        for entry in self._entries():
            path = self.dir / entry["file"]
            try:
                data = path.read_bytes()
                if entry.get("sha256") and hashlib.sha256(data).hexdigest() != entry["sha256"]:
                    raise ValueError("sha256 does not match the manifest (torn or corrupted file)")
                state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
                if not isinstance(state, dict) or "model" not in state:
                    raise ValueError("not a training checkpoint (no 'model' entry)")
                state = self._unspill(state)
            except Exception as exc:  # noqa: BLE001 - any unreadable file means: fall back
                log.warning("checkpoint %s is unusable (%s); falling back to the previous one", path, exc)
                continue
            if accept(state):
                return Loaded(state=state, path=path, seq=int(entry["seq"]), token=int(entry.get("token", 0)))
        return None

    # -- writing ---------------------------------------------------------------------------------
    def fence(self, token: int) -> bool:
        """Claim the run on the share for lease `token`: write its manifest (the newest one's entries)
        before anything else, so from now on every lower token is ignored. False if a higher token
        already wrote here (then this lease is stale, or the queue's token counter is behind)."""
        if self.superseded_by(token) is not None:
            return False
        if self.manifest_path(token).exists():
            return True
        entries = self._entries()
        atomic_write_text(self.manifest_path(token), json.dumps({"entries": entries}, indent=1) + "\n")
        if self.superseded_by(token) is not None:  # frozen while writing it, past the lease: take it back
            self.manifest_path(token).unlink(missing_ok=True)
            return False
        return True

    def next_path(self, token: int) -> Path:
        """Where the next checkpoint goes; the token in the name keeps a stale writer's file apart."""
        entries = self._entries()
        seq = (max(int(e["seq"]) for e in entries) + 1) if entries else 1
        return self.dir / checkpoint_name(seq, token)

    def save(self, state: dict[str, Any], *, path: Path, may_promote: Callable[[], bool],
             boundary: bool) -> Path | None:
        """Write `state` atomically to `path` (from `next_path`), then promote it if `may_promote()`
        (the lease check) allows and no higher lease has written here. `boundary`: the state is at a day
        boundary (`LineageState.is_boundary`), which retention keeps. Returns `path`, or None when the
        writer lost its lease (nothing promoted, nothing deleted)."""
        parsed = parse_checkpoint_name(path.name)
        if path.parent != self.dir or not parsed:
            raise ValueError(f"{path} is not a checkpoint path of {self.dir}; use next_path()")
        seq, token = parsed
        buf = io.BytesIO()
        torch.save(self._spill(state), buf)
        data = buf.getvalue()
        atomic_write_bytes(path, data)
        faults.point("checkpoint-written")
        if not may_promote():
            log.warning("lease lost before promoting %s: discarding it (fencing)", path.name)
            path.unlink(missing_ok=True)
            return None
        faults.point("promote")
        newer = self.superseded_by(token)
        if newer is not None:
            log.warning("lease token %d wrote %s after ours (%d): we are stale; discarding %s (fencing)",
                        newer, self.manifest_path(newer).name, token, path.name)
            path.unlink(missing_ok=True)
            return None
        entry = {"file": path.name, "seq": seq, "token": token,
                 "sha256": hashlib.sha256(data).hexdigest(), "boundary": boundary}
        entries = [e for e in self._entries() if e["file"] != path.name]
        kept = self._retain([entry, *entries])
        atomic_write_text(self.manifest_path(token), json.dumps({"entries": kept}, indent=1) + "\n")
        self._collect(token)
        return path

    def _retain(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The newest `keep`, plus the day-boundary (end-of-day) checkpoints `ladder` keeps: mid-shard resume
        needs the newest, and a day that arrives late (a backfill, a requeue) rewinds to the boundary before it,
        or, when that one was pruned, to the nearest kept one before it (`lineage.Rewind.target`)."""
        top = max((int(e["seq"]) for e in entries), default=0)
        rungs = ladder([int(e["seq"]) for e in entries[self.keep:] if e.get("boundary")], top)
        return entries[: self.keep] + [e for e in entries[self.keep:] if e.get("boundary") and int(e["seq"]) in rungs]

    def _collect(self, token: int) -> None:
        """Prune what no manifest names, never above our own token; keep the newest manifests.

        A stale writer reaches this only if no higher manifest existed a moment ago; even then it
        deletes only files that no manifest names, and a newer lease adopts its entries from a
        manifest, so what the newer lease loads is named and stays."""
        if self.superseded_by(token) is not None:
            return  # a newer lease owns the folder now: it prunes
        for t, path in self.manifests()[KEEP_MANIFESTS:]:
            if t < token:
                path.unlink(missing_ok=True)
        named: set[str] = set()
        for _, path in self.manifests():
            try:
                named |= {e["file"] for e in json.loads(path.read_text())["entries"]}
            except FileNotFoundError:
                continue
            except (ValueError, KeyError, TypeError):
                return  # cannot tell what that manifest keeps: delete nothing
        for path in self.dir.iterdir():
            parsed = parse_checkpoint_name(path.name)
            if parsed and path.name not in named and parsed[1] <= token:
                path.unlink(missing_ok=True)
            elif path.name.endswith(".tmp"):
                try:
                    if time.time() - path.stat().st_mtime > 600:
                        path.unlink(missing_ok=True)  # left by a writer killed mid-write
                except FileNotFoundError:
                    continue
