"""Where a dataset comes from: a local folder or a Cloud Storage prefix (``gs://bucket/prefix``).

A source lists its files (``history/``, ``training/``, ``testing/``, ``scoring/`` directly under it) with what
identifies their content: size and CRC32C (what Cloud Storage reports for every object, computed
here for local files), plus the object generation for the record. ``workload.data.publish`` compares
them with what is already on the share, so only new files are copied: the share is a cache in
front of the bucket. Each copy is checked against the listed checksum, so an object replaced
while it is copied is never published under the old one's identity.

The bucket is read with Google's ``google-cloud-storage`` client: Application Default Credentials
(Workload Identity on GKE), or ``STORAGE_EMULATOR_HOST`` for a local Cloud Storage API server.
"""

from __future__ import annotations

import base64
import logging
import os
import re
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import google_crc32c

from workload.data.dayfile import ROLES, one_line

log = logging.getLogger(__name__)

GS = "gs://"
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")  # Cloud Storage bucket naming rules
_CHUNK = 1 << 20


class SourceError(Exception):
    """The source cannot be read as given (bad URI, no such folder or bucket, no access, unreachable)."""


class SourceUnreachable(SourceError):
    """Cloud Storage did not answer (network, service errors): an infrastructure fault, not the user's input."""


class _AccessPending(Exception):
    """A denial or missing credential that may be a grant or a pod identity not effective yet."""

    def __init__(self, error: SourceError) -> None:
        super().__init__(str(error))
        self.error = error


def access_retry_seconds() -> float:
    """How long a denied or not-yet-authenticated bucket read is retried before it is an error.

    In a pod (KUBERNETES_SERVICE_HOST is set) a new IAM grant can take minutes to take effect, and
    the GKE metadata server answers only some seconds after the pod starts (google-auth-library-python
    issue 1261): the loader runs with backoffLimit 0, so it waits here rather than fail the first
    `pulumi up`. On a laptop a denial is the user's to fix: no wait. SOURCE_ACCESS_RETRY_SECONDS
    overrides both."""
    default = 300.0 if os.environ.get("KUBERNETES_SERVICE_HOST") else 0.0
    return float(os.environ.get("SOURCE_ACCESS_RETRY_SECONDS", default))


@dataclass(frozen=True)
class SourceFile:
    rel: str  # "training/2018-04-01.parquet": where it goes in the dataset
    uri: str  # the user's own name for it, used in every message
    size: int
    crc32c: str  # base64 of the big-endian CRC32C, as Cloud Storage reports it
    generation: str | None = None

    def identity(self) -> dict[str, Any]:
        """What the manifest records of where a published file came from."""
        return {"uri": self.uri, "size": self.size, "crc32c": self.crc32c, "generation": self.generation}

    def same_content(self, recorded: dict[str, Any]) -> bool:
        """Same bytes as a recorded identity. Size and checksum decide: a re-upload of the same
        bytes gets a new generation but changes nothing."""
        return recorded.get("size") == self.size and recorded.get("crc32c") == self.crc32c


class Source(Protocol):
    uri: str  # recorded in the dataset manifest: a dataset is fed by one source

    def files(self) -> list[SourceFile]: ...

    def fetch(self, f: SourceFile, dest: Path) -> None: ...


def _encode(checksum: Any) -> str:
    return base64.b64encode(checksum.digest()).decode("ascii")


def _dataset_rel(parts: list[str], ignored: list[str], name: str) -> str | None:
    """`role/file` for a file directly under a role folder; None (noted in `ignored`) otherwise."""
    if parts and parts[-1] == "":
        return None  # a "folder" placeholder object
    if len(parts) == 2 and parts[0] in ROLES:
        return None if parts[1].startswith(".") else "/".join(parts)
    ignored.append(name)
    return None


def _log_ignored(uri: str, ignored: list[str]) -> None:
    if ignored:
        log.warning("%s: ignoring %d file(s) not directly in %s/ (for example %s)", uri, len(ignored),
                    "/, ".join(ROLES), ", ".join(sorted(ignored)[:3]))


class LocalSource:
    """A folder on this machine (or mounted into the pod)."""

    def __init__(self, folder: Path | str, uri: str | None = None) -> None:
        self.folder = Path(folder)
        self.uri = uri or str(self.folder.resolve())
        self._named = uri is not None  # files are named `uri/rel`, never by a temporary folder's path

    def files(self) -> list[SourceFile]:
        if not self.folder.is_dir():
            raise SourceError(f"{self.folder}: no such folder; --datasets takes a folder with "
                              f"{'/, '.join(ROLES)}/ or a gs://bucket/prefix")
        found, ignored = [], []
        for path in sorted(self.folder.rglob("*")):
            if path.is_symlink():  # never followed: it could read (and echo in an error) any file on the machine
                raise SourceError(f"{path}: a symbolic link in the dataset folder; links are never followed, copy "
                                  "the file itself there")
            if path.is_dir() or any(p.startswith(".") for p in path.relative_to(self.folder).parts[:-1]):
                continue
            name = f"{self.uri}/{path.relative_to(self.folder).as_posix()}" if self._named else str(path)
            rel = _dataset_rel(list(path.relative_to(self.folder).parts), ignored, name)
            if rel is None:
                continue
            checksum = google_crc32c.Checksum()
            with path.open("rb") as f:
                while chunk := f.read(_CHUNK):
                    checksum.update(chunk)
            found.append(SourceFile(rel=rel, uri=name, size=path.stat().st_size, crc32c=_encode(checksum)))
        _log_ignored(str(self.folder), ignored)
        return found

    def fetch(self, f: SourceFile, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.folder / f.rel, dest)
        _verify(f, dest)


class BucketSource:
    """Objects under ``gs://bucket/prefix/``."""

    def __init__(self, uri: str, client: Any = None) -> None:
        bucket, _, prefix = uri[len(GS):].partition("/")
        if not _BUCKET.match(bucket):
            raise SourceError(f"{uri}: {bucket!r} is not a Cloud Storage bucket name; expected gs://bucket/prefix")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.uri = f"{GS}{bucket}/{self.prefix}".rstrip("/")
        self._client = client

    def client(self) -> Any:
        if self._client is None:
            with warnings.catch_warnings():  # google.api_core warns about Python versions at import
                warnings.simplefilter("ignore", FutureWarning)
                from google.cloud import storage
            self._client = self._call(lambda: storage.Client(project=None))  # reading needs no project
        return self._client

    def _call(self, fn: Any) -> Any:
        """Run a client call; whatever goes wrong becomes one line naming the URI and what to do.
        Access and credential errors are retried for `access_retry_seconds()` first (see there)."""
        deadline = time.monotonic() + access_retry_seconds()
        delay = 2.0
        while True:
            try:
                return self._once(fn)
            except _AccessPending as pending:
                if time.monotonic() + delay > deadline:
                    raise pending.error from None
                log.warning("%s; IAM grants and a new pod's identity can take minutes to take effect: retrying in "
                            "%.0fs", pending.error, delay)
                time.sleep(delay)
                delay = min(delay * 2, 30.0)

    def _once(self, fn: Any) -> Any:
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth
        from google.cloud.storage.exceptions import DataCorruption

        try:
            return fn()
        except (auth.RefreshError, auth.TransportError) as exc:
            raise _AccessPending(SourceError(f"{self.uri}: cannot get a token for the pod's identity "
                                             f"({one_line(exc)})")) from None
        except api.NotFound as exc:
            raise SourceError(f"{self.uri}: not found ({one_line(exc)})") from None
        except (api.Forbidden, api.Unauthorized) as exc:
            raise _AccessPending(SourceError(f"{self.uri}: access denied ({one_line(exc)}); the loader's identity "
                                             f"needs roles/storage.objectViewer on gs://{self.bucket}")) from None
        except auth.DefaultCredentialsError as exc:
            raise _AccessPending(SourceError(f"{self.uri}: no Google credentials ({one_line(exc)}); on GKE bind the "
                                             "pod's service account through Workload Identity, locally run "
                                             "`gcloud auth application-default login`")) from None
        except (api.GoogleAPIError, auth.GoogleAuthError) as exc:
            raise SourceError(f"{self.uri}: cannot read Cloud Storage: {one_line(exc)}") from None
        except DataCorruption as exc:  # the bytes did not match the checksum Cloud Storage sent with them
            raise SourceUnreachable(f"{self.uri}: a download arrived corrupted ({one_line(exc)}); run seed "
                                    "again") from None
        except OSError as exc:  # requests' ConnectionError and timeouts are OSErrors
            raise SourceUnreachable(f"{self.uri}: cannot reach Cloud Storage: {one_line(exc)}") from None

    def files(self) -> list[SourceFile]:
        client = self.client()
        prefix = f"{self.prefix}/" if self.prefix else ""
        blobs = self._call(lambda: list(client.list_blobs(self.bucket, prefix=prefix)))
        found, ignored = [], []
        for blob in blobs:
            uri = f"{GS}{self.bucket}/{blob.name}"
            rel = _dataset_rel(blob.name[len(prefix):].split("/"), ignored, uri)
            if rel is not None:
                found.append(SourceFile(rel=rel, uri=uri, size=int(blob.size), crc32c=blob.crc32c,
                                        generation=str(blob.generation)))
        _log_ignored(self.uri, ignored)
        return found

    def fetch(self, f: SourceFile, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        name = f"{self.prefix}/{f.rel}" if self.prefix else f.rel
        blob = self.client().bucket(self.bucket).blob(name, generation=int(f.generation) if f.generation else None)
        self._call(lambda: blob.download_to_filename(str(dest), checksum="crc32c"))
        _verify(f, dest)


def _verify(f: SourceFile, copy: Path) -> None:
    """The copy has the listed size and checksum, or the source changed under us: refuse the copy."""
    checksum = google_crc32c.Checksum()
    with copy.open("rb") as data:
        while chunk := data.read(_CHUNK):
            checksum.update(chunk)
    if copy.stat().st_size != f.size or _encode(checksum) != f.crc32c:
        raise SourceError(f"{f.uri}: changed while it was being copied (listed {f.size} bytes, crc32c {f.crc32c}); "
                          "run seed again")


def open_source(text: str) -> Source:
    """`--datasets` as given: ``gs://bucket/prefix`` or a local folder."""
    if text.startswith(GS):
        return BucketSource(text)
    if "://" in text:
        raise SourceError(f"--datasets {text!r}: unsupported scheme; use a local folder or gs://bucket/prefix")
    return LocalSource(Path(text))
