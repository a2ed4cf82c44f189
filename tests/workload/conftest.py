from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import Cluster, make_dataset

from workload.redis_server import RedisServer


@pytest.fixture(scope="session")
def dataset_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("dataset"))


def _cluster(base: Path, dataset_src: Path) -> Iterator[Cluster]:
    server = RedisServer(base / "redis").start()
    share = base / "share"
    share.mkdir()
    c = Cluster(server=server, share=share, dataset_src=dataset_src)
    try:
        yield c
    finally:
        c.stop()
        server.kill()


@pytest.fixture
def cluster(tmp_path: Path, dataset_src: Path) -> Iterator[Cluster]:
    yield from _cluster(tmp_path, dataset_src)


@pytest.fixture(scope="session")
def reference_state(tmp_path_factory: pytest.TempPathFactory, dataset_src: Path) -> dict:
    """The final checkpoint of one uninterrupted worker: what every disturbed run must reproduce."""
    for c in _cluster(tmp_path_factory.mktemp("reference"), dataset_src):
        c.seed()
        c.start_worker("ref")
        assert c.wait_all() == [0], c.log("ref")
        return c.final_state()
    raise AssertionError("unreachable")
