"""A run's results out of the share: report, metrics, pictures and a model file that scores.

The share (Filestore) dies with `pulumi destroy`; a bucket or a local folder does not. `export`
copies one run to `<destination>/<run>/`:

    report.txt, metrics.jsonl   rendered from the same checkpoint as the model (they always agree)
    report.html                 the same, as one self-contained page, with the pictures inline
    metrics.png, pr_curve.png   the pictures the workers drew, as they are
    model.safetensors           what scoring needs, and nothing that runs code when read

The model file is safetensors: tensors and a JSON header, no pickle anywhere. It holds the
checkpoint's entries minus what only training needs (`LineageState.scoring_entries`): every group of
tensors (weights, normalisation statistics) as tensors named `<group>.<name>`, every other entry
(run, hyperparameters, feature names, days applied, metrics history, format) as JSON under the
header key `spot_trainer`. `load_model` rebuilds a `Trainer` through the checkpoint format
(`LineageState.from_scoring_entries`), so the file follows whatever a checkpoint keeps.

Exporting is idempotent: files are rewritten whole (atomically on disk; objects whose MD5 already
matches are not uploaded again), so a worker and a person may both run it, any number of times.
With env `OUTPUT_URI` set, the worker that acks a run's last day exports it there
(`export_finished_run`); a failure is a warning, never a failed or retrained item.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from workload.model import lineage, report, report_html
from workload.model.lineage import LineageState
from workload.model.trainer import Trainer
from workload.share.checkpoint import CheckpointStore
from workload.share.fsutil import atomic_write_bytes
from workload.share.paths import (
    METRICS_JSONL,
    METRICS_PNG,
    PR_CURVE_PNG,
    REPORT_HTML,
    REPORT_TXT,
    check_name,
    share_paths,
)

log = logging.getLogger(__name__)

OUTPUT_URI_ENV = "OUTPUT_URI"  # set by the stack: where a finished run goes
MODEL_FILE = "model.safetensors"
HEADER_KEY = "spot_trainer"
PICTURES = (METRICS_PNG, PR_CURVE_PNG)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")  # Cloud Storage bucket naming rules, loosely
_CONTENT_TYPES = {".txt": "text/plain; charset=utf-8", ".html": "text/html; charset=utf-8",
                  ".jsonl": "application/x-ndjson", ".png": "image/png",
                  ".safetensors": "application/octet-stream"}


class ExportError(Exception):
    """Nothing (complete) to export, or a destination that cannot be used: one line for the user."""


class ModelFileError(ValueError):
    """A file that is not a model written by `export`."""


# -- the model file ---------------------------------------------------------------------------------
def model_bytes(state: dict[str, Any]) -> bytes:
    """A checkpoint's dict (at a shard boundary) as a safetensors file (`lineage.scoring_entries`)."""
    tensors: dict[str, torch.Tensor] = {}
    groups: list[str] = []
    bare: list[str] = []
    meta: dict[str, Any] = {}
    for key, value in lineage.scoring_entries(state).items():
        if isinstance(value, dict) and value and all(isinstance(v, torch.Tensor) for v in value.values()):
            groups.append(key)
            tensors.update({f"{key}.{name}": t.detach().cpu().contiguous().clone() for name, t in value.items()})
        elif isinstance(value, torch.Tensor):
            bare.append(key)
            tensors[key] = value.detach().cpu().contiguous().clone()
        else:
            meta[key] = value
    header = json.dumps({"state": meta, "tensor_groups": groups, "tensors": bare}, sort_keys=True)
    return save_safetensors(tensors, metadata={HEADER_KEY: header})


def model_state(data: bytes, where: str) -> dict[str, Any]:
    """The scoring part of a trainer state, read back from `model_bytes` output."""
    try:
        tensors = load_safetensors(data)
        header = _safetensors_metadata(data).get(HEADER_KEY)
        if header is None:
            raise ModelFileError(f"{where}: a safetensors file without the {HEADER_KEY!r} header; not a model "
                                 f"written by `python -m workload export`")
        parsed = json.loads(header)
        state: dict[str, Any] = dict(parsed["state"])
        for group in parsed["tensor_groups"]:
            prefix = f"{group}."
            state[group] = {k[len(prefix):]: t for k, t in tensors.items() if k.startswith(prefix)}
        for key in parsed.get("tensors", []):
            state[key] = tensors[key]
    except ModelFileError:
        raise
    except Exception as exc:  # noqa: BLE001 - any malformed file gets the same one-line answer
        raise ModelFileError(f"{where}: not a readable model file ({type(exc).__name__}: {exc}); expected the "
                             f"{MODEL_FILE} that `python -m workload export` writes") from exc
    return state


def _safetensors_metadata(data: bytes) -> dict[str, str]:
    """The `__metadata__` of a safetensors header (8-byte little-endian length, then JSON)."""
    size = int.from_bytes(data[:8], "little")
    if size <= 0 or size > len(data) - 8:
        raise ValueError("truncated safetensors header")
    return dict(json.loads(data[8:8 + size]).get("__metadata__") or {})


def load_model(path: Path) -> Trainer:
    """A trainer that scores exactly like the one that was exported (weights and normalisation); the
    training-only entries the file leaves out are filled in by `LineageState.from_scoring_entries`."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelFileError(f"--model {path}: cannot read it ({exc.strerror or exc})") from exc
    state = model_state(data, f"--model {path}")
    try:
        return LineageState.from_scoring_entries(state, f"--model {path}").trainer(torch.device("cpu"))
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ModelFileError(f"--model {path}: cannot rebuild the model from it ({type(exc).__name__}: {exc})") \
            from exc


# -- what a run's export holds ----------------------------------------------------------------------
@dataclass(frozen=True)
class RunExport:
    """The files of one run's export, by name, ready to write anywhere."""

    run: str
    files: dict[str, bytes]
    days_applied: int
    applied: tuple[str, ...] = ()  # the days, in the order the exported model applied them


def collect(share: Path, run: str) -> RunExport:
    """Read a run's newest shard-boundary checkpoint and its pictures from the share."""
    check_name(run, "--run")
    _, output_dir = share_paths(share)
    run_dir = output_dir / run
    if not run_dir.is_dir():
        known = sorted(p.name for p in output_dir.iterdir() if p.is_dir()) if output_dir.is_dir() else []
        raise ExportError(f"--run {run}: no such run under {output_dir} (runs with output: {known or 'none'})")
    store = CheckpointStore(run_dir)
    loaded = lineage.newest_boundary(store)
    if loaded is None:
        raise ExportError(f"--run {run}: no checkpoint with a finished day under {run_dir / 'checkpoints'}; "
                          "nothing trained to export yet")
    state = loaded.state
    files = {
        REPORT_TXT: report.render(state.run, state.hparams, list(state.history), run_dir, store.retained(),
                                   list(state.reapplied)).encode(),
        METRICS_JSONL: report.metrics_jsonl(list(state.history)).encode(),
        MODEL_FILE: model_bytes(state.to_checkpoint()),
    }
    for picture in PICTURES:
        try:
            files[picture] = (run_dir / picture).read_bytes()
        except FileNotFoundError:
            log.warning("run %s has no %s yet; exporting without it", run, picture)
    files[REPORT_HTML] = report_html.render(state.run, state.hparams, list(state.history),
                                            {p: files[p] for p in PICTURES if p in files},
                                            list(state.reapplied)).encode()
    return RunExport(run=run, files=files, days_applied=len(state.applied), applied=tuple(state.applied))


# -- destinations -----------------------------------------------------------------------------------
def parse_gs_uri(uri: str) -> tuple[str, str]:
    """gs://bucket[/prefix] -> (bucket, prefix without slashes at either end)."""
    rest = uri[len("gs://"):]
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket):
        raise ExportError(f"{uri!r}: {bucket!r} is not a bucket name; expected gs://BUCKET[/PREFIX] with a "
                          "bucket of lowercase letters, digits, '-', '_', '.'")
    prefix = prefix.strip("/")
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise ExportError(f"{uri!r}: the prefix {prefix!r} has an empty, '.' or '..' part")
    return bucket, prefix


def write_dir(export: RunExport, to: Path) -> str:
    """Write to `<to>/<run>/`, each file atomically and readable by the group (a results folder is shared)."""
    folder = Path(to) / export.run
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in export.files.items():
            atomic_write_bytes(folder / name, data)
            os.chmod(folder / name, 0o644)
    except OSError as exc:
        raise ExportError(f"--to {to}: cannot write {folder} ({exc.strerror or exc})") from exc
    return str(folder)


def _google() -> tuple[Any, Any]:
    """(google.cloud.storage, google.api_core.exceptions), imported only when a bucket is used."""
    import warnings

    with warnings.catch_warnings():  # google.api_core's notice about the Python version, at import
        warnings.simplefilter("ignore", FutureWarning)
        from google.api_core import exceptions
        from google.cloud import storage
    return storage, exceptions


def storage_client() -> Any:
    """A Cloud Storage client from the environment: Workload Identity on GKE, application-default
    credentials elsewhere, the emulator when STORAGE_EMULATOR_HOST is set."""
    storage, _ = _google()
    return storage.Client()


def write_gs(export: RunExport, uri: str, client: Any | None = None) -> str:
    """Upload to gs://bucket/prefix/<run>/; objects whose MD5 already matches are left alone.

    Writing needs create and delete (an object is replaced by delete + create) on the prefix:
    roles/storage.objectUser. Listing is only an optimisation: without it, everything is uploaded."""
    _, gexc = _google()
    bucket_name, prefix = parse_gs_uri(uri)
    folder = f"{prefix}/{export.run}/" if prefix else f"{export.run}/"
    try:
        client = client or storage_client()
        bucket = client.bucket(bucket_name)
        try:
            present = {b.name: b.md5_hash for b in client.list_blobs(bucket, prefix=folder)}
        except gexc.Forbidden as exc:
            log.info("gs://%s/%s: cannot list objects (%s); uploading every file", bucket_name, folder, exc.message)
            present = {}
        uploaded = 0
        for name, data in export.files.items():
            key = folder + name
            md5 = base64.b64encode(hashlib.md5(data).digest()).decode()  # noqa: S324 - GCS's own checksum
            if present.get(key) == md5:
                continue
            bucket.blob(key).upload_from_string(data, content_type=_CONTENT_TYPES.get(Path(name).suffix))
            uploaded += 1
    except gexc.GoogleAPIError as exc:
        raise ExportError(f"{uri}: Cloud Storage refused the export of run {export.run} "
                          f"({type(exc).__name__}: {getattr(exc, 'message', exc)})") from exc
    except ExportError:
        raise
    except Exception as exc:  # noqa: BLE001 - credentials, network: still one line naming the destination
        raise ExportError(f"{uri}: cannot export run {export.run} ({type(exc).__name__}: {exc})") from exc
    log.info("gs://%s/%s: %d object(s) uploaded, %d already there", bucket_name, folder, uploaded,
             len(export.files) - uploaded)
    return f"gs://{bucket_name}/{folder}"


def export_run(share: Path, run: str, to: str, days: list[str] | None = None) -> str | None:
    """Export `run` to a local folder or gs://bucket/prefix; returns where it went. With `days` (the run's plan,
    in date order), only a newest checkpoint that records exactly them is exported: None, and one line, when the
    share holds less (a rewind under way, an output folder restored from an older backup)."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/", to) and not to.startswith("gs://"):
        raise ExportError(f"--to {to}: only gs://bucket/prefix or a local folder is supported")
    export = collect(share, run)
    if days is not None and list(export.applied) != days:
        log.warning("run %s: not exported to %s: the share's newest checkpoint records %d of the run's %d day(s) "
                    "(a rewind under way, or the output restored from an older backup?); the worker that applies "
                    "the last day exports it", run, to, len(set(export.applied) & set(days)), len(days))
        return None
    where = write_gs(export, to) if to.startswith("gs://") else write_dir(export, Path(to))
    log.info("exported run %s (%d day(s) applied: %s) to %s", run, export.days_applied,
             ", ".join(export.files), where)
    return where


def export_finished_run(share: Path, run: str, days: list[str] | None = None) -> None:
    """The worker's hook, called after it acked a run's last day: export to $OUTPUT_URI if set, the share's
    newest state, only when it records every one of `days` (the run's plan; `export_run`).

    A failure here is an infrastructure problem (bucket permissions, network), never the item's:
    the day is trained and acked already. It is logged with the command that retries it by hand."""
    uri = os.environ.get(OUTPUT_URI_ENV)
    if not uri:
        return
    try:
        export_run(share, run, uri, days)
    except Exception as exc:  # noqa: BLE001 - whatever it is, training must not pay for it
        log.warning("run %s is trained, but exporting it to %s (%s) failed: %s. Retry by hand: "
                    "python -m workload export --run %s --to %s", run, uri, OUTPUT_URI_ENV, exc, run, uri)
