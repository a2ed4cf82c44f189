"""Temporary folders of writers that are gone are swept; a live writer's folder never is.

A seeder builds a dataset in ``tmp_dir_for(final)`` (named for its host and pid) and publishes it with
one rename; one killed mid-way leaves the folder behind. ``clean_stale_tmp`` removes it: at once when
its process is known dead (this host), else only after it has been idle for long (another pod's pid
means nothing here). Real folders, real processes, real mtimes.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from workload.share import fsutil
from workload.share.fsutil import STALE_TMP_IDLE_S, clean_stale_tmp, tmp_dir_for

HOST = socket.gethostname()


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(proc.stdout)


def folder(parent: Path, name: str, age_s: float = 0.0, files: dict[str, float] | None = None) -> Path:
    """A temporary folder `name` whose entries (``files``: name -> age in s) and itself are `age_s` old."""
    path = parent / name
    path.mkdir(parents=True)
    now = time.time()
    for rel, age in (files or {}).items():
        f = path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"part of a dataset")
        os.utime(f, (now - age, now - age))
        if f.parent != path:
            os.utime(f.parent, (now - age, now - age))
    os.utime(path, (now - age_s, now - age_s))
    return path


def test_the_temporary_folder_is_named_for_this_host_and_process(tmp_path: Path) -> None:
    final = tmp_path / "datasets" / "fraud"
    assert tmp_dir_for(final) == tmp_path / "datasets" / f".fraud.tmp-{HOST}-{os.getpid()}"
    assert tmp_dir_for(str(final)) == tmp_dir_for(final)


def test_a_dead_writer_on_this_host_is_swept_at_once(tmp_path: Path, caplog) -> None:
    pid = dead_pid()
    plain = folder(tmp_path, f".fraud.tmp-{HOST}-{pid}", files={"training/day.parquet": 0})
    suffixed = folder(tmp_path, f".other.tmp-{HOST}-{pid}-k3x_9", files={"x": 0})  # TemporaryDirectory's suffix
    with caplog.at_level("WARNING", logger="workload.share.fsutil"):
        removed = clean_stale_tmp(tmp_path)
    assert sorted(removed) == sorted([plain, suffixed])
    assert list(tmp_path.iterdir()) == []
    assert f"removed {plain}, left behind by a writer that is gone" in [r.getMessage() for r in caplog.records]


@pytest.fixture(autouse=True)
def no_signal_to_this_process() -> Iterator[None]:
    """The sweep asks after this process's own folders too: a SIGHUP sent to it (a liveness probe that is not
    signal 0) fails the test here, instead of ending the whole test process (which mutmut calls suspicious)."""
    hit: list[int] = []
    previous = signal.signal(signal.SIGHUP, lambda signum, frame: hit.append(signum))
    yield
    signal.signal(signal.SIGHUP, previous)
    assert not hit, f"the sweep sent this process signal {hit}"


def test_a_live_writer_is_left_alone_and_not_signalled(tmp_path: Path) -> None:
    """Liveness is asked with signal 0: a live writer (here a real child process) is neither removed nor hit."""
    # SIGHUP may be ignored where the tests run (a nohup'ed CI step); the writer takes any signal's default.
    # It says when it is ready: a signal that arrived before SIG_DFL was set could be ignored, unseen.
    writer = ("import signal, time; signal.signal(signal.SIGHUP, signal.SIG_DFL); print('ready', flush=True); "
              "time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        mine = folder(tmp_path, f".fraud.tmp-{HOST}-{os.getpid()}", files={"a": 0})
        theirs = folder(tmp_path, f".fraud.tmp-{HOST}-{child.pid}", files={"a": 0})
        assert clean_stale_tmp(tmp_path) == []
        assert mine.is_dir() and theirs.is_dir()
        time.sleep(0.2)
        assert child.poll() is None, f"the live writer was signalled: exit {child.poll()}"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def test_a_live_writer_idle_for_too_long_is_swept(tmp_path: Path) -> None:
    stuck = folder(tmp_path, f".fraud.tmp-{HOST}-{os.getpid()}", age_s=7200, files={"a": 7200})
    assert clean_stale_tmp(tmp_path) == [stuck]


def test_another_hosts_folder_goes_only_after_it_is_idle(tmp_path: Path) -> None:
    """Its pid is no process here: only time says its writer is gone."""
    pid = dead_pid()
    busy = folder(tmp_path, f".fraud.tmp-other-pod-7c9f-{pid}", age_s=7200, files={"a": 7200, "sub/b": 5})
    old = folder(tmp_path, f".feat.tmp-other-pod-7c9f-{pid}", age_s=7200, files={"a": 7200, "sub/b": 7200})
    assert clean_stale_tmp(tmp_path) == [old]  # `busy` was written to 5 s ago, deep inside
    assert busy.is_dir()
    assert clean_stale_tmp(tmp_path, idle_s=1) == [busy]


def test_the_idle_limit_is_an_hour_by_default(tmp_path: Path) -> None:
    pid = dead_pid()
    recent = folder(tmp_path, f".a.tmp-other-{pid}", age_s=STALE_TMP_IDLE_S - 60, files={"f": STALE_TMP_IDLE_S - 60})
    stale = folder(tmp_path, f".b.tmp-other-{pid}", age_s=STALE_TMP_IDLE_S + 60, files={"f": STALE_TMP_IDLE_S + 60})
    assert STALE_TMP_IDLE_S == 3600.0
    assert clean_stale_tmp(tmp_path) == [stale] and recent.is_dir()


def test_an_empty_folder_is_judged_by_its_own_time(tmp_path: Path) -> None:
    pid = dead_pid()
    fresh = folder(tmp_path, f".a.tmp-other-{pid}")
    old = folder(tmp_path, f".b.tmp-other-{pid}", age_s=7200)
    assert clean_stale_tmp(tmp_path, idle_s=60) == [old] and fresh.is_dir()


def test_only_temporary_folders_are_touched(tmp_path: Path) -> None:
    pid = dead_pid()
    kept = [
        folder(tmp_path, "fraud", age_s=7200, files={"a": 7200}),  # a published dataset
        folder(tmp_path, f"fraud.tmp-{HOST}-{pid}", age_s=7200),  # not hidden: not ours
        folder(tmp_path, f".fraud.TMP-{HOST}-{pid}", age_s=7200),
    ]
    for i in range(8):  # files named like a writer's folder: not folders, not ours
        f = tmp_path / f".f{i}.tmp-{HOST}-{pid}"
        f.write_text("a file")
        os.utime(f, (0, 0))
        kept.append(f)
    stale = folder(tmp_path, f".g.tmp-{HOST}-{pid}")
    assert clean_stale_tmp(tmp_path) == [stale]  # the files before it in the listing did not end the sweep
    assert all(p.exists() for p in kept)


def test_a_name_that_is_not_host_and_pid_is_judged_by_idle_time_only(tmp_path: Path) -> None:
    odd = folder(tmp_path, ".fraud.tmp-nopid", files={"a": 0})
    assert clean_stale_tmp(tmp_path) == [] and odd.is_dir()
    assert clean_stale_tmp(tmp_path, idle_s=-1) == [odd]


def test_the_host_is_the_part_before_the_last_tmp_marker(tmp_path: Path) -> None:
    """A dataset named like a temp folder (``x.tmp-y``) keeps its writer's host and pid readable."""
    pid = dead_pid()
    gone = folder(tmp_path, f".x.tmp-y.tmp-{HOST}-{pid}", files={"a": 0})
    assert clean_stale_tmp(tmp_path) == [gone]


def test_a_missing_parent_is_nothing_to_clean(tmp_path: Path) -> None:
    assert clean_stale_tmp(tmp_path / "absent") == []
    (tmp_path / "file").write_text("x")
    assert clean_stale_tmp(tmp_path / "file") == []


def test_a_part_removed_while_it_is_looked_at_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer removes a part between the listing and the look at its time: that part is skipped,
    and the fresh file after it still counts (the folder is in use)."""
    pid = dead_pid()
    busy = folder(tmp_path, f".a.tmp-other-{pid}", age_s=7200, files={"gone/x": 7200, "fresh": 0})
    real_lstat = os.lstat
    gone = str(busy / "gone")

    def lstat(path, *args, **kwargs):
        if str(path) == gone:  # the writer moves it away right now (folders come before files)
            os.rename(path, tmp_path / "moved")
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(fsutil.os, "lstat", lstat)
    assert clean_stale_tmp(tmp_path, idle_s=60) == []
    assert busy.is_dir() and (tmp_path / "moved").is_dir()


def test_a_folder_published_while_it_is_looked_at_does_not_stop_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer publishes (renames) its folder between the listing and the look at its time: it is
    skipped, and the sweep goes on with the others."""
    pid = dead_pid()
    both = {str(folder(tmp_path, f".{n}.tmp-other-{pid}", age_s=7200)) for n in "ab"}
    real_stat = os.stat
    published: list[str] = []

    def stat(path, *args, follow_symlinks=True, **kwargs):
        if not follow_symlinks and not published and str(path) in both:  # the first one looked at
            published.append(str(path))
            os.rename(path, tmp_path / "published")
        return real_stat(path, *args, follow_symlinks=follow_symlinks, **kwargs)

    monkeypatch.setattr(fsutil.os, "stat", stat)
    removed = clean_stale_tmp(tmp_path, idle_s=60)
    assert published and [str(p) for p in removed] == sorted(both - set(published))
    assert (tmp_path / "published").is_dir() and not any(Path(p).exists() for p in both)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_a_writer_of_another_user_counts_as_alive() -> None:
    """Signal 0 to another user's process fails with EPERM: it exists, so its folder stays."""
    base = Path(tempfile.mkdtemp(prefix="stale-tmp-"))  # pytest's tmp_path is closed to other users
    try:
        base.chmod(0o755)
        theirs = folder(base, f".fraud.tmp-{HOST}-1", files={"a": 0})  # pid 1: root's, never this user's
        assert clean_stale_tmp(base) == []  # as root: pid 1 answers signal 0
        child = os.fork()
        if child == 0:  # pragma: no cover - the child reports through its exit code
            code = 3
            try:
                os.setuid(65534)  # nobody
                code = 0 if clean_stale_tmp(base) == [] else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0 and theirs.is_dir()
    finally:
        shutil.rmtree(base)


def test_a_folder_the_share_cannot_delete_yet_does_not_stop_the_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On NFS a file still open elsewhere becomes `.nfsXXXX` and refuses deletion (EBUSY) until closed:
    the sweep leaves what it cannot delete for a later run and goes on."""
    pid = dead_pid()
    busy = folder(tmp_path, f".a.tmp-{HOST}-{pid}", files={".nfs000000001": 0})
    other = folder(tmp_path, f".b.tmp-{HOST}-{pid}", files={"x": 0})
    real_unlink = os.unlink

    def unlink(path, *args, **kwargs):
        if str(path).startswith(".nfs") or Path(str(path)).name.startswith(".nfs"):
            raise OSError(16, "Device or resource busy", str(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink)
    assert sorted(clean_stale_tmp(tmp_path)) == sorted([busy, other])
    assert not other.exists() and (busy / ".nfs000000001").exists()
