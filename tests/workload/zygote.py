"""Worker processes for the tests without paying their imports each time: a fork server.

Each `python -m workload worker` a test starts used to import torch, torch._dynamo (the first Adam step's
import), pandas, pyarrow and redis before doing anything: about 5 s of CPU a process, and the fault tests start
hundreds of them, on the 2-core CI machine that runs the whole suite. Here one process per pytest process (the
zygote) imports those libraries once and forks a child for each command; the child sets the command's working
folder, environment and standard streams, and runs ``python -m workload ...`` in itself as the interpreter would
(``runpy``, with ``workload/__main__.py``'s own exit). Every child is still a real process of its own: tests kill,
stop and resume it with real signals, and its exit status (``-9`` for a SIGKILL) comes back as ``Popen``'s does.

What a fresh interpreter would do differently, and why it does not matter here: the zygote imports no module of
this repository (those read the environment and the share when imported, so each child imports them itself, in
its own environment); it runs no torch operation before forking, and loads the native libraries without their
threads (``NATIVE_THREADS_OFF``), so that it forks with one thread (it checks); the child's parent is the
zygote, not the test, so a test reads its exit status through this module, never with os.waitpid. ``workload
local`` and the CLI tests still start real interpreters (their own startup is what they test). ``ZYGOTE=0`` in
the environment starts every command as a fresh interpreter again, as before.

Protocol: JSON lines. Request on the zygote's stdin: ``{"id", "argv", "env", "cwd", "out", "err"}`` (``out`` and
``err`` are file paths opened for appending, ``err`` may be ``"out"``). Replies on its stdout: ``{"id", "pid"}``
when forked, ``{"pid", "code"}`` when reaped (``code`` as ``Popen.returncode``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# What `python -m workload worker` and `seed` import that costs: the libraries, never this repository's modules.
# matplotlib's figure and Agg canvas (and PIL's PNG writer) are what a worker drawing its pictures imports: ~0.8 s
# of CPU in each such child, a tenth of a fault test file's CPU before they were here (py-spy, test_late_days.py).
PRELOAD = ("torch", "torch._dynamo", "torch.optim", "torch.nn", "numpy", "pandas", "pyarrow", "pyarrow.parquet",
           "pyarrow.dataset", "redis", "matplotlib.figure", "matplotlib.backends.backend_agg", "PIL.PngImagePlugin")


# Read by the native libraries when they load, so in the zygote and for every child: without them numpy's OpenBLAS
# starts its thread pool and pyarrow's jemalloc its background thread at import, and a fork would copy a process
# with threads. The workers run torch on one thread (TORCH_THREADS=1), so one BLAS thread is what they use anyway;
# jemalloc's background thread only returns freed pages to the system sooner.
NATIVE_THREADS_OFF = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}


def enabled() -> bool:
    return os.environ.get("ZYGOTE", "1") != "0"


# ---------------------------------------------------------------------------------------------- the zygote side


def _serve() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:  # forking a process with threads copies their locks in whatever state they are
        raise SystemExit(f"zygote: {threads} threads after the imports; it forks only with one")
    reply_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)  # nothing the zygote or a library prints can reach the replies
    requests = sys.stdin.buffer
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    pending = b""

    def reply(message: dict[str, Any]) -> None:
        os.write(reply_fd, (json.dumps(message) + "\n").encode())

    while True:
        ready, _, _ = select.select([requests.fileno(), wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(reply)
        if requests.fileno() in ready:
            chunk = os.read(requests.fileno(), 65536)
            if not chunk:
                return  # the test process went away
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(request, (requests.fileno(), reply_fd, wake_r, wake_w, devnull))
                reply({"id": request["id"], "pid": pid})


def _reap(reply) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        reply({"pid": pid, "code": os.waitstatus_to_exitcode(status)})


def _child(request: dict[str, Any], zygote_fds: tuple[int, ...]) -> None:
    """In the forked child: become the command, as `python -m ...` started in ``cwd`` with ``env`` would."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        out = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        err = out if request["err"] == "out" else os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                                                          0o644)
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in {*zygote_fds, out, err, stdin} - {0, 1, 2}:  # the zygote's requests came on 0: now /dev/null
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # `python -m` puts the working folder first, then PYTHONPATH's folders
        extra = [f for f in request["env"].get("PYTHONPATH", "").split(os.pathsep) if f and f not in sys.path]
        sys.path[:1] = [request["cwd"], *extra]
        if request["env"].get("PYTHONUNBUFFERED"):
            sys.stdout.reconfigure(write_through=True)
        import runpy

        module, *args = request["argv"]
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)  # workload/__main__.py ends in os._exit
        code = 0
    except SystemExit as exc:  # as the interpreter: None is 0, a message is printed and is 1
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:  # as the interpreter does: the traceback, then death by SIGINT
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # noqa: BLE001 - an uncaught exception: its traceback and exit 1, as the interpreter
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


# ------------------------------------------------------------------------------------------------ the test side


def run(argv: list[str], env: dict[str, str] | None, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([python, "-m", *argv], capture_output=True, text=True, ...)``, forked from the zygote."""
    env = dict(os.environ if env is None else env)
    if not enabled():
        return subprocess.run([sys.executable, "-m", *argv], env=env, cwd=cwd, capture_output=True, text=True,
                              timeout=timeout)
    with tempfile.TemporaryDirectory(prefix="zygote-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        child = Zygote.get().start(argv, env, cwd, out, err)
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise
        return subprocess.CompletedProcess(child.args, code, out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))



class ForkedProcess:
    """The part of ``subprocess.Popen`` the tests use, for a child of the zygote."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]) -> None:
        self._zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._zygote.pump(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 0.05 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._zygote.pump(min(left, 0.05))  # short: another thread may be waiting on another child
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never signal a pid already reaped (it may be another process's now)
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Zygote:
    """The test process's handle on its zygote (one per pytest process, started on first use)."""

    _one: Zygote | None = None
    _lock = threading.Lock()

    @classmethod
    def get(cls) -> Zygote:
        with cls._lock:
            # A process forked from one that had a zygote (mutmut forks a pytest process per mutant) starts its
            # own: the pipes it inherited are its parent's conversation.
            one = cls._one
            if one is None or one._owner != os.getpid() or one._proc.poll() is not None:
                cls._one = cls()
            return cls._one

    def __init__(self) -> None:
        root = Path(__file__).resolve().parents[2]
        env = {**{k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}, **NATIVE_THREADS_OFF}
        self._proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, cwd=root, env=env)
        self._owner = os.getpid()
        self._buffer = b""
        self._next_id = 0
        self._started: dict[int, int] = {}
        self._by_pid: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}  # exit codes that arrived before their pid's ForkedProcess existed
        self._io = threading.RLock()

    def start(self, argv: list[str], env: dict[str, str], cwd: Path, out: Path, err: Path | None) -> ForkedProcess:
        with self._io:
            self._next_id += 1
            ident = self._next_id
            request = {"id": ident, "argv": argv, "env": env, "cwd": str(cwd), "out": str(out),
                       "err": "out" if err is None else str(err)}
            assert self._proc.stdin is not None
            self._proc.stdin.write((json.dumps(request) + "\n").encode())
            self._proc.stdin.flush()
            deadline = time.monotonic() + 120  # the first request waits for the zygote's imports
            while ident not in self._started:
                assert time.monotonic() < deadline, "the test's zygote did not fork in 120 s"
                assert self._proc.poll() is None, f"the test's zygote exited {self._proc.returncode}"
                self.pump(1.0)
            child = ForkedProcess(self, self._started.pop(ident), ["python", "-m", *argv])
            self._by_pid[child.pid] = child
            if child.pid in self._early:
                child.returncode = self._early.pop(child.pid)
            return child

    def pump(self, timeout: float | None) -> None:
        """Read the zygote's replies that are there, waiting up to ``timeout`` s for the first."""
        with self._io:
            assert self._proc.stdout is not None
            fd = self._proc.stdout.fileno()
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                return
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the test's zygote exited {self._proc.wait()}: its children's exits are lost")
            self._buffer += chunk
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                message = json.loads(line)
                if "id" in message:
                    self._started[message["id"]] = message["pid"]
                elif message["pid"] in self._by_pid:
                    self._by_pid.pop(message["pid"]).returncode = message["code"]
                else:
                    self._early[message["pid"]] = message["code"]


if __name__ == "__main__":
    _serve()
