"""Atomic writes: a crash mid-write leaves the old file whole, the new file replaces the old one rather
than rewriting it, and both the data and the folder reach the disk in the order that makes it durable.

End-to-end tests cannot see these: the checkpoint manifest falls back to scanning its folder, so a
torn or lost file is papered over. Here a real writer process is SIGKILLed half-way through, inodes
are compared, and every os.fsync / os.replace call is recorded around the real functions.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from workload.share import fsutil

ROOT = Path(__file__).resolve().parents[2]
OLD = b"old checkpoint " * 70_000  # ~1 MiB: big enough that a write is not one syscall's worth of luck
NEW = b"new checkpoint!" * 90_000

WRITER = "import sys; from pathlib import Path; from workload.share import fsutil; " \
         "fsutil.atomic_write_bytes(Path(sys.argv[1]), sys.stdin.buffer.read())"


def test_a_writer_killed_mid_write_leaves_the_old_file_whole(tmp_path: Path) -> None:
    target = tmp_path / "state.pt"
    target.write_bytes(OLD)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WORKLOAD_FAULT": "mid-write"}
    proc = subprocess.run([sys.executable, "-c", WRITER, str(target)], input=NEW, env=env, cwd=ROOT,
                          capture_output=True, timeout=60)
    # Killed at the fault point between the two halves of the data (not a writer that finished).
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert target.read_bytes() == OLD


def test_the_new_file_replaces_the_old_one_instead_of_rewriting_it(tmp_path: Path) -> None:
    target = tmp_path / "state.pt"
    target.write_bytes(OLD)
    before = target.stat().st_ino
    with target.open("rb") as reader:  # a reader that opened the old file before the write began
        fsutil.atomic_write_bytes(target, NEW)
        assert reader.read() == OLD  # still sees the whole old file, never a mix
    assert target.stat().st_ino != before
    assert target.read_bytes() == NEW
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]  # no temp file left behind


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "state.pt"
    target.write_bytes(OLD)

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        fsutil.atomic_write_bytes(target, NEW)
    assert target.read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


def test_data_is_fsynced_before_the_rename_and_the_folder_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rename before the data is on disk can leave an empty file after a power cut; a rename whose
    folder is never fsynced can vanish. Recorded around the real calls, so the write still happens."""
    events: list[tuple[str, int, bool, int]] = []  # (call, inode, is a folder, size at the call)
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        events.append(("fsync", st.st_ino, stat.S_ISDIR(st.st_mode), st.st_size))
        real_fsync(fd)

    temps: list[Path] = []

    def moved(real):
        def call(src, dst, *args, **kwargs):
            st = os.stat(src)
            events.append(("replace", st.st_ino, False, st.st_size))
            temps.append(Path(src))
            return real(src, dst, *args, **kwargs)
        return call

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", moved(real_replace))
    monkeypatch.setattr(os, "rename", moved(real_rename))
    folder = tmp_path / "checkpoints" / "main"
    target = folder / "state.pt"
    fsutil.atomic_write_bytes(target, NEW)

    assert target.read_bytes() == NEW
    file_ino, folder_ino = target.stat().st_ino, folder.stat().st_ino
    calls = [(call, ino, is_dir) for call, ino, is_dir, _ in events]
    renamed = calls.index(("replace", file_ino, False))
    data_synced = [i for i, (call, ino, is_dir, size) in enumerate(events)
                   if (call, ino, is_dir) == ("fsync", file_ino, False) and size == len(NEW)]
    assert data_synced and data_synced[0] < renamed, f"the data is not fsynced before the rename: {events}"
    assert ("fsync", folder_ino, True) in calls[renamed + 1:], f"the folder is not fsynced after the rename: {events}"
    # The temp file lives beside the target (a rename across file systems fails, and the folder fsync must
    # cover it), hidden and named so that the checkpoint store's sweep of stale "*.tmp" files finds it.
    (temp,) = temps
    assert temp.parent == folder and temp.name.startswith(".state.pt.") and temp.name.endswith(".tmp")


def test_the_crash_window_holds_half_the_data_in_the_temp_file_and_the_old_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a writer SIGKILLed at the "mid-write" fault point leaves, seen in-process at that point."""
    target = tmp_path / "state.pt"
    target.write_bytes(OLD)
    seen: list[tuple[str, bytes, list[bytes]]] = []

    def point(name: str) -> None:
        temps = [p.read_bytes() for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        seen.append((name, target.read_bytes(), temps))

    monkeypatch.setattr(fsutil.faults, "point", point)
    fsutil.atomic_write_bytes(target, NEW)
    ((name, old, (partial,)),) = seen
    assert name == "mid-write" and old == OLD
    assert 0 < len(partial) < len(NEW) and NEW.startswith(partial)
    assert target.read_bytes() == NEW


def test_text_writes_take_the_same_path(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    target.write_text("{}")
    before = target.stat().st_ino
    fsutil.atomic_write_text(target, '{"entries": []}\n')
    assert target.read_text() == '{"entries": []}\n' and target.stat().st_ino != before


@pytest.mark.parametrize(("fault", "errno_", "strerror"), [
    (OSError(28, "No space left on device"), 28, "No space left on device"),
    (OSError("the disk went away"), None, "the disk went away"),  # no errno, no strerror: its text
])
def test_a_write_error_names_the_file_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: OSError, errno_: int | None, strerror: str
) -> None:
    """write()/fsync() errors carry no file name: the one raised names the target, so the user's one-line
    error says which file could not be written (and the errno still classifies the fault)."""
    target = tmp_path / "state.pt"

    def failing(fd: int) -> None:
        raise fault

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError) as caught:
        fsutil.atomic_write_bytes(target, NEW)
    assert (caught.value.errno, caught.value.strerror, caught.value.filename) == (errno_, strerror, str(target))
    assert caught.value.__cause__ is fault and list(tmp_path.iterdir()) == []


def test_an_error_that_names_its_files_is_passed_on_as_it_is(tmp_path: Path) -> None:
    target = tmp_path / "state.pt"
    (target / "busy").mkdir(parents=True)  # the rename cannot replace a folder
    with pytest.raises(IsADirectoryError) as caught:
        fsutil.atomic_write_bytes(target, NEW)
    assert caught.value.filename2 == str(target) and Path(caught.value.filename).name.endswith(".tmp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"]


def test_an_interrupted_write_leaves_no_temp_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "state.pt"
    target.write_bytes(OLD)

    def interrupted(name: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(fsutil.faults, "point", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fsutil.atomic_write_bytes(target, NEW)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.pt"] and target.read_bytes() == OLD
