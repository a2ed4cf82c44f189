from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

# torch.optim's first Adam imports torch._dynamo: 2.5 s of a tiny model's 3 s first training. Importing it
# while tests are collected makes each pytest process pay it once, before any test: an xdist worker, and
# above all `make mutation`, whose every mutant runs in a process forked from one that only collected the
# tests. The import starts no thread, so forking after it stays safe.
import torch._dynamo  # noqa: F401
from harness import Cluster, make_dataset

from workload.runtime.redis_server import RedisServer


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
