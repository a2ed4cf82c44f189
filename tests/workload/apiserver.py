"""An HTTPS server on loopback standing in for the Kubernetes API server: a self-signed certificate that the pod's
CA file names, a service-account folder (namespace, token, ca.crt) and KUBERNETES_SERVICE_HOST/PORT pointing at it.
It records every Job POSTed and answers what the test sets (test_launch_inprocess.py, test_cli_units.py): the
statuses queued in ``answers`` first (each with its headers), then ``status``. A GET of one Job answers from
``jobs`` (200 with the body, 404 without), after ``answers`` too. ``host="::1"`` serves on IPv6 loopback."""

from __future__ import annotations

import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


@dataclass
class ApiServer:
    """What the API server saw, and what it answers next."""

    sa_dir: Path
    url: str
    status: int = 201
    text: str = "{}"
    delay_s: float = 0.0
    posts: list[tuple[str, str, dict]] = field(default_factory=list)
    # Answers before ``status``, in order: (status, headers), e.g. (429, {"Retry-After": "2"}).
    answers: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    # The Jobs a GET finds, by name, and the paths GET asked for.
    jobs: dict[str, dict] = field(default_factory=dict)
    gets: list[str] = field(default_factory=list)


@contextmanager
def api_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, host: str = "127.0.0.1") -> Iterator[ApiServer]:
    key, crt = tmp_path / "key.pem", tmp_path / "crt.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(crt), "-days", "1", "-subj", "/CN=api",
                    "-addext", f"subjectAltName=IP:{host}"], check=True, capture_output=True)
    sa_dir = tmp_path / "serviceaccount"
    sa_dir.mkdir()
    (sa_dir / "namespace").write_text("fraud\n")
    (sa_dir / "token").write_text("pod-token\n")
    shutil.copy(crt, sa_dir / "ca.crt")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.posts.append((self.path, self.headers["Authorization"], body))
            time.sleep(state.delay_s)
            status, headers = state.answers.pop(0) if state.answers else (state.status, {})
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(state.text.encode())

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            state.gets.append(self.path)
            name = self.path.rsplit("/", 1)[-1]
            status, headers = state.answers.pop(0) if state.answers else (200 if name in state.jobs else 404, {})
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(json.dumps(state.jobs.get(name, {"kind": "Status", "code": status})).encode())

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = Server((host, 0), Handler)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(crt, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    port = server.server_address[1]
    where = f"[{host}]" if ":" in host else host
    state = ApiServer(sa_dir, f"https://{where}:{port}/apis/batch/v1/namespaces/fraud/jobs")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(port))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
