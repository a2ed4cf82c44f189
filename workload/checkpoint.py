"""Checkpoints on the shared volume: atomic, verified on load, fenced on promotion.

Layout under ``output/<run>/checkpoints/``::

    ckpt-00000007-t42.pt   one plain dict of tensors and numbers (seq 7, written under lease token 42)
    manifest.json          the retained checkpoints, newest first, with their sha256: the `latest` pointer

A checkpoint is *promoted* by rewriting the manifest, only after the writer proved it still holds
the run's lease. Loading walks the manifest newest first and skips (with a warning) any file whose
hash or contents do not check out, so a torn or corrupt checkpoint falls back to the previous one.
Files are loaded with ``torch.load(weights_only=True)``: no arbitrary unpickling.
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

from workload import faults
from workload.fsutil import atomic_write_bytes, atomic_write_text

log = logging.getLogger(__name__)

_NAME = re.compile(r"^ckpt-(\d{8})-t(\d+)\.pt$")


@dataclass(frozen=True)
class Loaded:
    state: dict[str, Any]
    path: Path
    seq: int


class CheckpointStore:
    def __init__(self, run_dir: Path, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.dir = Path(run_dir) / "checkpoints"
        self.manifest = self.dir / "manifest.json"
        self.keep = keep

    # -- reading ---------------------------------------------------------------------------------
    def _entries(self) -> list[dict[str, Any]]:
        """Manifest entries newest first; without a readable manifest, every file found, unverified."""
        try:
            entries = json.loads(self.manifest.read_text())["entries"]
            return sorted(entries, key=lambda e: e["seq"], reverse=True)
        except FileNotFoundError:
            pass
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("checkpoint manifest %s is unreadable (%s); scanning the folder", self.manifest, exc)
        found = []
        for path in self.dir.glob("ckpt-*.pt") if self.dir.exists() else []:
            m = _NAME.match(path.name)
            if m:
                found.append({"file": path.name, "seq": int(m[1]), "sha256": None})
        return sorted(found, key=lambda e: e["seq"], reverse=True)

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
            except Exception as exc:  # noqa: BLE001 - any unreadable file means: fall back
                log.warning("checkpoint %s is unusable (%s); falling back to the previous one", path, exc)
                continue
            if accept(state):
                return Loaded(state=state, path=path, seq=int(entry["seq"]))
        return None

    # -- writing ---------------------------------------------------------------------------------
    def next_path(self, token: int) -> Path:
        """Where the next checkpoint goes; the token in the name keeps a stale writer's file apart."""
        entries = self._entries()
        seq = (entries[0]["seq"] + 1) if entries else 1
        return self.dir / f"ckpt-{seq:08d}-t{token}.pt"

    def save(self, state: dict[str, Any], *, path: Path, may_promote: Callable[[], bool]) -> Path | None:
        """Write `state` atomically to `path` (from `next_path`), then promote it if `may_promote()`
        (the lease check) allows. Returns `path`, or None when the writer lost its lease."""
        m = _NAME.match(path.name)
        if path.parent != self.dir or not m:
            raise ValueError(f"{path} is not a checkpoint path of {self.dir}; use next_path()")
        self.dir.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        torch.save(state, buf)
        data = buf.getvalue()
        atomic_write_bytes(path, data)
        faults.point("checkpoint-written")
        if not may_promote():
            log.warning("lease lost before promoting %s: discarding it (fencing)", path.name)
            path.unlink(missing_ok=True)
            return None
        entry = {"file": path.name, "seq": int(m[1]), "token": int(m[2]),
                 "sha256": hashlib.sha256(data).hexdigest(), "boundary": state.get("progress") is None}
        entries = [e for e in self._entries() if e["file"] != path.name]
        kept = self._retain([entry, *entries])
        atomic_write_text(self.manifest, json.dumps({"entries": kept}, indent=1) + "\n")
        self._collect(kept)
        return path

    def _retain(self, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The newest `keep`, plus the newest shard-boundary checkpoint (mid-shard resume may need it)."""
        kept = entries[: self.keep]
        if not any(e.get("boundary") for e in kept):
            boundary = next((e for e in entries if e.get("boundary")), None)
            if boundary:
                kept.append(boundary)
        return kept

    def _collect(self, kept: list[dict[str, Any]]) -> None:
        names = {e["file"] for e in kept}
        for path in self.dir.iterdir():
            if _NAME.match(path.name) and path.name not in names:
                path.unlink(missing_ok=True)
            elif path.name.endswith(".tmp") and time.time() - path.stat().st_mtime > 600:
                path.unlink(missing_ok=True)  # left by a writer killed mid-write
