from __future__ import annotations

import fcntl
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# torch.optim's first Adam imports torch._dynamo: 2.5 s of a tiny model's 3 s first training. Importing it
# while tests are collected makes each pytest process pay it once, before any test: an xdist worker, and
# above all `make mutation`, whose every mutant runs in a process forked from one that only collected the
# tests. The import starts no thread, so forking after it stays safe.
import torch._dynamo  # noqa: F401
from harness import Cluster, make_dataset

from workload.runtime.redis_server import RedisServer
from workload.share.checkpoint import CheckpointStore


def built_for_the_session(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A read-only folder that `build(folder)` fills once per test session, whatever its number of processes.

    Under pytest-xdist (`make test`) each process has its own session fixtures, but all share the session's base
    folder: the first process to get there builds the folder under an exclusive lock, the others wait for it and
    read it (a simulated dataset costs ~4 s of CPU, the reference run ~12 s, each process paid them). Alone, the
    process builds it in its own temporary folder."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    root = tmp_path_factory.getbasetemp().parent
    folder, done = root / name, root / f"{name}.built"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed, or when a killed process exits
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # half built by a process that failed
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def dataset_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(built_for_the_session(tmp_path_factory, "dataset", make_dataset))


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

    def run(folder: Path) -> None:
        for c in _cluster(folder, dataset_src):
            c.seed()
            c.start_worker("ref")
            assert c.wait_all() == [0], c.log("ref")

    folder = built_for_the_session(tmp_path_factory, "reference", run)
    loaded = CheckpointStore(folder / "share" / "output" / "main").load()
    assert loaded is not None, "the reference run left no checkpoint"
    return loaded.state
