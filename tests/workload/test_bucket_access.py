"""A bucket read denied (HTTP 403) while an IAM grant propagates: a pod waits it out within its bound, a laptop
is told at once in one line. The Cloud Storage API server is the real one (gcp-storage-emulator); the denials
come from a forwarding proxy in front of it that answers 403, as Cloud Storage does, for a set number of
requests (the emulator has no IAM)."""

from __future__ import annotations

import json
import logging
import socket
import threading
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from workload.data.source import BucketSource, SourceError

pytestmark = pytest.mark.timeout(120)
DENIED = {"error": {"code": 403, "message": "loader@p.iam.gserviceaccount.com does not have storage.objects.list "
                    "access to the Google Cloud Storage bucket. Permission 'storage.objects.list' denied on "
                    "resource (or it may not exist).",
                    "errors": [{"message": "denied", "domain": "global", "reason": "forbidden"}]}}
HOP_BY_HOP = {"connection", "transfer-encoding", "keep-alive", "content-length", "content-encoding"}


class DenyingProxy(ThreadingHTTPServer):
    """Forwards every request to `upstream`, except the next `denials` ones on objects, answered 403
    (`requests` counts those on objects)."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream, self.denials, self.requests, self.denied = upstream, 0, 0, 0
        self.lock = threading.Lock()

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: DenyingProxy

    def log_message(self, *args: object) -> None:
        pass

    def _any(self) -> None:
        with self.server.lock:  # objects only (list, read): what the loader's grant is about
            on_objects = "/o" in self.path.partition("?")[0]
            self.server.requests += on_objects
            deny = on_objects and self.server.denials > 0
            if deny:
                self.server.denials -= 1
                self.server.denied += 1
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if deny:
            return self._send(403, {"Content-Type": "application/json"}, json.dumps(DENIED).encode())
        request = urllib.request.Request(self.server.upstream + self.path, data=body or None, method=self.command,
                                         headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
        try:
            with urllib.request.urlopen(request, timeout=30) as up:
                self._send(up.status, dict(up.headers.items()), up.read())
        except urllib.error.HTTPError as err:
            self._send(err.code, dict(err.headers.items()), err.read())

    def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.send_response(status)
        for k, v in headers.items():
            if k.lower() not in HOP_BY_HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any


@pytest.fixture
def proxy(dataset_src: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[DenyingProxy]:
    """The tiny dataset in gs://data/real on a real Cloud Storage API server, reached through the proxy."""
    from gcp_storage_emulator.server import create_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="data")
    server.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from google.cloud import storage
    bucket = storage.Client(project=None).bucket("data")
    for path in sorted(dataset_src.glob("*/*.parquet")):
        bucket.blob(f"real/{path.parent.name}/{path.name}").upload_from_filename(str(path))
    front = DenyingProxy(f"http://127.0.0.1:{port}")
    threading.Thread(target=front.serve_forever, daemon=True).start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", front.host)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("SOURCE_ACCESS_RETRY_SECONDS", raising=False)
    try:
        yield front
    finally:
        front.shutdown()
        server.stop()


def test_a_403_while_a_grant_propagates_is_waited_out_in_a_pod(proxy: DenyingProxy, dataset_src: Path,
                                                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")  # in a pod: the default wait is minutes
    src = BucketSource("gs://data/real")
    proxy.denials = 1
    with caplog.at_level(logging.WARNING, logger="workload.data.source"):
        files = src.files()
    assert proxy.denied == 1
    assert sorted(f.rel for f in files) == sorted(str(p.relative_to(dataset_src))
                                                  for p in dataset_src.glob("*/*.parquet"))
    assert "gs://data/real: access denied" in caplog.text and "retrying in 2s" in caplog.text
    proxy.denials = 1  # the grant on objects lags the one on listing: the copy is denied once too
    day = next(f for f in files if f.rel.startswith("training/"))
    src.fetch(day, tmp_path / day.rel)
    assert proxy.denied == 2
    assert (tmp_path / day.rel).read_bytes() == (dataset_src / day.rel).read_bytes()


def test_a_403_on_a_laptop_is_one_line_at_once(proxy: DenyingProxy) -> None:
    proxy.denials = 100
    with pytest.raises(SourceError) as caught:
        BucketSource("gs://data/real").files()
    assert proxy.requests == proxy.denied == 1, "no retry: a denial on a laptop is the user's to fix"
    text = str(caught.value)
    assert "\n" not in text and text.startswith("gs://data/real: access denied (")
    assert text.endswith("the loader's identity needs roles/storage.objectViewer on gs://data")


def test_a_403_that_outlasts_the_bound_is_one_line(proxy: DenyingProxy, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("SOURCE_ACCESS_RETRY_SECONDS", "5")
    proxy.denials = 100
    with caplog.at_level(logging.WARNING, logger="workload.data.source"), pytest.raises(SourceError) as caught:
        BucketSource("gs://data/real").files()
    # Tried at once and again after 2 s; the next wait (4 s) would end past the 5 s bound: given up then.
    assert caplog.text.count("retrying in") == 1 and proxy.denied >= 2 and proxy.requests == proxy.denied
    assert "roles/storage.objectViewer on gs://data" in str(caught.value)
