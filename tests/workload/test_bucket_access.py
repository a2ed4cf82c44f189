"""A bucket read denied (HTTP 403) while an IAM grant propagates: a pod waits it out within its bound, a laptop
is told at once in one line. The Cloud Storage API server is the real one (gcp-storage-emulator); the denials
come from a forwarding proxy in front of it that answers 403, as Cloud Storage does, for a set number of
requests (the emulator has no IAM). The same proxy shows what the loader asks for (the listed generation),
corrupts a download in transit, and answers what Cloud Storage or a network path may answer instead (a bad
request, a redirect loop); credentials that fail are real google-auth ones."""

from __future__ import annotations

import json
import logging
import socket
import threading
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from workload.data.source import BucketSource, SourceError, SourceUnreachable

pytestmark = pytest.mark.timeout(120)
DENIED = {"error": {"code": 403, "message": "loader@p.iam.gserviceaccount.com does not have storage.objects.list "
                    "access to the Google Cloud Storage bucket. Permission 'storage.objects.list' denied on "
                    "resource (or it may not exist).",
                    "errors": [{"message": "denied", "domain": "global", "reason": "forbidden"}]}}
HOP_BY_HOP = {"connection", "transfer-encoding", "keep-alive", "content-length", "content-encoding"}


class DenyingProxy(ThreadingHTTPServer):
    """Forwards every request to `upstream`, except the next `denials` ones on objects, answered with `answer`
    (403 unless set; `requests` counts those on objects), and changes a byte of the next `corrupt` downloads.
    `seen` lists every request's path and query."""

    daemon_threads = True

    def __init__(self, upstream: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream, self.denials, self.requests, self.denied, self.corrupt = upstream, 0, 0, 0, 0
        self.answer: tuple[int, dict[str, str], bytes] = (403, {"Content-Type": "application/json"},
                                                          json.dumps(DENIED).encode())
        self.seen: list[str] = []
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
            self.server.seen.append(self.path)
            on_objects = "/o" in self.path.partition("?")[0]
            self.server.requests += on_objects
            deny = on_objects and self.server.denials > 0
            if deny:
                self.server.denials -= 1
                self.server.denied += 1
            corrupt = "alt=media" in self.path and self.server.corrupt > 0
            self.server.corrupt -= corrupt
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if deny:
            return self._send(*self.server.answer)
        request = urllib.request.Request(self.server.upstream + self.path, data=body or None, method=self.command,
                                         headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
        try:
            with urllib.request.urlopen(request, timeout=30) as up:
                data = up.read()
                self._send(up.status, dict(up.headers.items()), bytes([data[0] ^ 1]) + data[1:] if corrupt else data)
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
    assert "loader@p.iam.gserviceaccount.com does not have storage.objects.list access" in text, "what was denied"
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


def test_a_copy_asks_cloud_storage_for_the_listed_generation(proxy: DenyingProxy, dataset_src: Path,
                                                             tmp_path: Path) -> None:
    """An object replaced after the listing is never copied in its new version: the download names the listed
    generation, which Cloud Storage serves (a versioned bucket) or answers 404 for. The emulator ignores the
    parameter, so the request itself is checked."""
    day = next(f for f in BucketSource("gs://data/real").files() if f.rel.startswith("training/"))
    proxy.seen.clear()
    BucketSource("gs://data/real").fetch(day, tmp_path / day.rel)
    downloads = [urllib.parse.urlsplit(p) for p in proxy.seen if "alt=media" in p]
    assert len(downloads) == 1 and urllib.parse.unquote(downloads[0].path).endswith(f"/o/real/{day.rel}")
    assert urllib.parse.parse_qs(downloads[0].query)["generation"] == [day.generation]
    assert (tmp_path / day.rel).read_bytes() == (dataset_src / day.rel).read_bytes()


def test_a_download_corrupted_in_transit_is_refused_and_leaves_no_copy(proxy: DenyingProxy, tmp_path: Path) -> None:
    """The bytes are checked against the CRC32C Cloud Storage sends with them while they arrive: a corrupted
    transfer is refused and no file is left where the copy was to be."""
    day = next(f for f in BucketSource("gs://data/real").files() if f.rel.startswith("training/"))
    proxy.corrupt = 1
    with pytest.raises(SourceUnreachable) as caught:  # a fault of the transfer, not of the user's data
        BucketSource("gs://data/real").fetch(day, tmp_path / day.rel)
    text = str(caught.value)
    assert "\n" not in text and text.startswith("gs://data/real: a download arrived corrupted (Checksum mismatch ")
    assert text.endswith("); run seed again")
    assert proxy.corrupt == 0, "the download went through the proxy"
    assert not (tmp_path / day.rel).exists()


def test_a_request_cloud_storage_refuses_is_one_line_naming_the_uri(proxy: DenyingProxy) -> None:
    proxy.answer = (400, {"Content-Type": "application/json"},
                    json.dumps({"error": {"code": 400, "message": "Invalid argument.",
                                          "errors": [{"message": "Invalid argument.", "reason": "invalid"}]}}).encode())
    proxy.denials = 1
    with pytest.raises(SourceError) as caught:
        BucketSource("gs://data/real").files()
    text = str(caught.value)
    assert type(caught.value) is SourceError, "the request was answered: not an infrastructure fault"
    assert "\n" not in text and text.startswith("gs://data/real: cannot read Cloud Storage: 400 GET http://")
    assert text.endswith(": Invalid argument.")


def test_a_network_path_that_never_reaches_cloud_storage_is_unreachable_in_one_line(proxy: DenyingProxy) -> None:
    """A redirect loop (a captive portal, a misconfigured proxy): an infrastructure fault, not the user's input."""
    proxy.answer = (302, {"Location": "/storage/v1/b/data/o"}, b"")
    proxy.denials = 100
    with pytest.raises(SourceUnreachable) as caught:
        BucketSource("gs://data/real").files()
    assert str(caught.value) == "gs://data/real: cannot reach Cloud Storage: Exceeded 30 redirects."


class _TokenRefused(BaseHTTPRequestHandler):
    """An OAuth token endpoint that refuses the refresh token, as Google's does for a revoked grant."""

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"error": "invalid_grant", "error_description": "Token has been expired or revoked."})
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())


@pytest.fixture
def no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A laptop outside any pod, whose Application Default Credentials file is not one."""
    creds = tmp_path / "creds.json"
    creds.write_text("not json")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(creds))
    for name in ("STORAGE_EMULATOR_HOST", "KUBERNETES_SERVICE_HOST", "SOURCE_ACCESS_RETRY_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    return creds


def test_missing_credentials_on_a_laptop_are_one_line_saying_what_to_run(no_credentials: Path) -> None:
    with pytest.raises(SourceError) as caught:
        BucketSource("gs://data/real").files()
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(f"gs://data/real: no Google credentials (('File {no_credentials} is not a valid json file.'")
    assert text.endswith("); on GKE bind the pod's service account through Workload Identity, locally run "
                         "`gcloud auth application-default login`")


def test_a_token_refused_is_one_line_and_the_given_client_is_the_one_used(no_credentials: Path) -> None:
    """A client handed to BucketSource is the one it reads with (no credentials of its own are looked up: here they
    would fail otherwise); its real OAuth credentials fail to refresh at a token endpoint that refuses them."""
    from google.oauth2.credentials import Credentials

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from google.cloud import storage
    endpoint = ThreadingHTTPServer(("127.0.0.1", 0), _TokenRefused)
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{endpoint.server_address[1]}"
        creds = Credentials(token=None, refresh_token="revoked", client_id="loader", client_secret="secret",
                            token_uri=f"{url}/token")
        client = storage.Client(project=None, credentials=creds, client_options={"api_endpoint": url})
        with pytest.raises(SourceError) as caught:
            BucketSource("gs://data/real", client=client).files()
    finally:
        endpoint.shutdown()
        endpoint.server_close()
    assert str(caught.value) == ("gs://data/real: cannot get a token for the pod's identity (('invalid_grant: Token "
                                 "has been expired or revoked.', {'error': 'invalid_grant', 'error_description': "
                                 "'Token has been expired or revoked.'}))")
