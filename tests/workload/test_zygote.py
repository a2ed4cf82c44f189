"""The tests' fork server (zygote.py) gives its children what ``python -m`` would: cwd, environment, streams,
exit codes, and real processes that real signals kill, stop and resume."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import zygote
from harness import ROOT, is_stopped

PROBE = "tests.workload.zygote_probe"


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


@pytest.fixture(autouse=True)
def _forked() -> None:
    if not zygote.enabled():
        pytest.skip("ZYGOTE=0: every command is a fresh interpreter")


def test_a_child_runs_in_its_own_folder_and_environment_and_exits_with_its_code(tmp_path: Path) -> None:
    out = zygote.run([PROBE, "exit", "3"], env(PROBE="seen"), tmp_path, 60)
    assert out.returncode == 3
    assert out.stdout == f"cwd={tmp_path} probe=seen argv=['exit', '3']\n"
    assert out.stderr == "to stderr\n"
    again = zygote.run([PROBE, "exit", "0"], env(PROBE="other"), ROOT, 60)  # nothing kept from the last child
    assert (again.returncode, again.stdout) == (0, f"cwd={ROOT} probe=other argv=['exit', '0']\n")


def test_a_child_reads_an_empty_stdin_and_a_message_exits_1(tmp_path: Path) -> None:
    out = zygote.run([PROBE, "stdin"], env(), tmp_path, 60)
    assert (out.returncode, out.stdout.splitlines()[-1]) == (0, "stdin=''"), out.stderr
    out = zygote.run([PROBE, "message"], env(), tmp_path, 60)
    assert (out.returncode, out.stderr) == (1, "to stderr\na message\n")


def test_an_uncaught_exception_is_exit_1_with_its_traceback(tmp_path: Path) -> None:
    out = zygote.run([PROBE, "raise"], env(), tmp_path, 60)
    assert out.returncode == 1
    assert "ValueError: uncaught" in out.stderr and "Traceback" in out.stderr


def test_real_signals_stop_resume_and_kill_a_child(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = zygote.Zygote.get().start([PROBE, "sleep"], env(), tmp_path, log, None)
    deadline = time.monotonic() + 60
    while "to stderr" not in (log.read_text() if log.exists() else ""):
        assert child.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(0.2)
    child.send_signal(signal.SIGSTOP)
    while not is_stopped(child):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert child.poll() is None
    child.send_signal(signal.SIGCONT)
    child.send_signal(signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL
    child.send_signal(signal.SIGKILL)  # as Popen: a reaped child's pid is never signalled again
