"""The failure classification, pinned as a table: which errnos are the platform's and which the item's,
how wrapped errors (cause and context chains, errnos only in a message, Redis clients' errors) are
followed, and the fault-injection points the crash tests rely on."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis

from workload.core import errors, faults
from workload.core.errors import InfraFault, ItemFault, NonFinite, describe, infra_errno, is_infra

ROOT = Path(__file__).resolve().parents[2]


def chained(outer: BaseException, inner: BaseException, how: str) -> BaseException:
    """`outer` raised while handling `inner` (how="context") or `raise outer from inner` (how="cause")."""
    setattr(outer, f"__{how}__", inner)
    return outer


# The platform failing, full, read-only or refusing us: never the item's fault. Spelled out, not read from
# errors.INFRA_ERRNOS: a code dropped there must fail here.
PLATFORM = [errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ETIMEDOUT,
            errno.ESTALE, errno.EFBIG, errno.ENOLCK, errno.EAGAIN, errno.EBUSY, errno.ENOTCONN, errno.EHOSTDOWN,
            errno.EHOSTUNREACH, errno.ECONNRESET, errno.ECONNREFUSED, errno.ENETDOWN, errno.ENETUNREACH,
            errno.EMFILE, errno.ENFILE, errno.ENOMEM]
# The item's own: a missing or malformed file, a path that is not what it should be. These cost an attempt.
ITEMS = [errno.ENOENT, errno.EINVAL, errno.EISDIR, errno.ENOTDIR, errno.ENOEXEC, errno.EEXIST, errno.ENAMETOOLONG,
         errno.ELOOP, errno.EBADF, errno.ERANGE, errno.EDOM, errno.ENOTEMPTY]


@pytest.mark.parametrize("code", PLATFORM, ids=[errno.errorcode[c] for c in PLATFORM])
def test_every_platform_errno_is_infrastructure_bare_wrapped_or_only_in_the_text(code: int) -> None:
    bare = OSError(code, os.strerror(code))
    assert infra_errno(bare) == code
    assert infra_errno(chained(ValueError("unreadable day.parquet"), OSError(code, "x"), "cause")) == code
    assert infra_errno(chained(RuntimeError("while saving"), OSError(code, "x"), "context")) == code
    assert infra_errno(ValueError(f"day.parquet: [Errno {code}] {os.strerror(code)}")) == code
    assert errno.errorcode[code] in describe(bare)


def test_the_platforms_errnos_are_exactly_these() -> None:
    assert errors.INFRA_ERRNOS == set(PLATFORM)


@pytest.mark.parametrize("code", ITEMS, ids=[errno.errorcode[c] for c in ITEMS])
def test_an_items_own_errno_is_not_infrastructure_wherever_it_sits(code: int) -> None:
    assert infra_errno(OSError(code, os.strerror(code))) is None
    assert infra_errno(chained(ValueError("bad file"), OSError(code, "x"), "cause")) is None
    assert infra_errno(ValueError(f"[Errno {code}] {os.strerror(code)}")) is None


@pytest.mark.parametrize(("exc", "expected"), [
    (PermissionError("denied, no errno"), errno.EACCES),  # a library's PermissionError without an errno
    (TimeoutError("timed out, no errno"), errno.ETIMEDOUT),  # socket.timeout is TimeoutError since 3.10
    (OSError("some OSError without an errno"), None),
    (FileNotFoundError(errno.ENOENT, "No such file"), None),
    (InfraFault("the share is sick"), errno.EIO),
    (ItemFault("bad hyperparameters"), None),
    (NonFinite("loss is NaN"), None),
    (ValueError("no errno anywhere"), None),
    (ValueError("Errno 28 without brackets"), None),
    (chained(ItemFault("day 3 unreadable"), InfraFault("NFS timed out"), "cause"), errno.EIO),
    (chained(ValueError("outer"), chained(KeyError("middle"), OSError(errno.EROFS, "ro"), "context"), "cause"),
     errno.EROFS),  # followed through any number of links, cause and context mixed
    # `raise X from Y` sets both; the explicit cause is the one followed, the context it replaced is not.
    (chained(chained(ValueError("outer"), ValueError("cause"), "cause"), OSError(errno.EIO, "io"), "context"),
     None),
    # The first platform errno met on the way down wins.
    (chained(OSError(errno.ENOSPC, "full"), OSError(errno.EIO, "io"), "cause"), errno.ENOSPC),
    # An item errno on the outside does not stop the walk.
    (chained(OSError(errno.ENOENT, "gone"), OSError(errno.EACCES, "denied"), "context"), errno.EACCES),
], ids=["permission-no-errno", "timeout-no-errno", "oserror-no-errno", "enoent", "infrafault", "itemfault",
        "nonfinite", "plain", "errno-text-unbracketed", "item-caused-by-infra", "deep-mixed-chain",
        "cause-over-context", "first-wins", "item-errno-outside"])
def test_the_classification_table(exc: BaseException, expected: int | None) -> None:
    assert infra_errno(exc) == expected
    assert is_infra(exc) is (expected is not None)


def test_a_chain_that_loops_ends_and_finds_nothing() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert infra_errno(a) is None


def test_a_chain_that_loops_still_finds_the_errno_before_the_loop() -> None:
    a, b, c = ValueError("a"), ValueError("b"), OSError(errno.ESTALE, "stale handle")
    a.__context__, b.__context__, c.__context__ = b, c, a
    assert infra_errno(a) == errno.ESTALE


def test_describe_is_one_line_with_the_errno_name_once() -> None:
    assert describe(OSError(errno.ENOSPC, "No space left on device")) == (
        "OSError: [Errno 28] No space left on device (ENOSPC)")
    assert describe(ItemFault("day 2018-04-03: TX_AMOUNT is negative")) == "day 2018-04-03: TX_AMOUNT is negative"
    assert describe(InfraFault("share timed out")) == "share timed out (EIO)"
    assert describe(ValueError("ENOSPC already named [Errno 28]")) == "ValueError: ENOSPC already named [Errno 28]"
    assert describe(KeyError("x")) == "KeyError: 'x'"
    wrapped = chained(ValueError("cannot read day.parquet"), OSError(errno.EROFS, "ro"), "cause")
    assert describe(wrapped) == "ValueError: cannot read day.parquet (EROFS)"


def test_a_real_redis_client_that_cannot_connect_is_an_infrastructure_fault() -> None:
    """redis-py raises its own ConnectionError (no OSError) while handling the socket's: the context chain
    carries the errno."""
    with socket.socket() as sock:  # a port nobody listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        client = redis.Redis(port=sock.getsockname()[1], socket_connect_timeout=1)
        with pytest.raises(redis.ConnectionError) as caught:
            client.ping()
    assert not isinstance(caught.value, OSError)
    assert infra_errno(caught.value) == errno.ECONNREFUSED


def test_a_real_redis_client_whose_server_never_answers_is_an_infrastructure_fault() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()  # accepts connections (the kernel's backlog) and never answers
        client = redis.Redis(port=server.getsockname()[1], socket_timeout=0.2, socket_connect_timeout=1)
        with pytest.raises(redis.TimeoutError) as caught:
            client.ping()
    assert infra_errno(caught.value) == errno.ETIMEDOUT


def test_a_real_redis_command_refused_for_its_arguments_is_not_infrastructure(redis_server) -> None:
    client = redis_server.client()
    client.set("k", "v")
    with pytest.raises(redis.ResponseError) as caught:
        client.lpush("k", "x")  # WRONGTYPE: the command's fault, not the platform's
    assert infra_errno(caught.value) is None


# -- fault-injection points (workload/core/faults.py) ---------------------------------------------------------

@pytest.fixture
def fresh_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "_hits", {})
    monkeypatch.delenv("WORKLOAD_FAULT", raising=False)
    monkeypatch.delenv("WORKLOAD_FAULT_ACTION", raising=False)


def test_a_point_fires_once_at_its_nth_pass_and_only_for_its_name(fresh_points, monkeypatch) -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda sig, _frame: got.append(sig))
    try:
        faults.point("read")  # unset: inert
        monkeypatch.setenv("WORKLOAD_FAULT", "read:3")
        monkeypatch.setenv("WORKLOAD_FAULT_ACTION", "term")
        passes = []
        for i in range(1, 6):
            faults.point("claimed")  # another point: never counted for this one
            faults.point("read")
            passes.append((i, list(got)))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert passes == [(1, []), (2, []), (3, [signal.SIGTERM]), (4, [signal.SIGTERM]), (5, [signal.SIGTERM])]
    assert faults._hits == {"read": 5}


def test_a_point_without_a_count_fires_at_its_first_pass(fresh_points, monkeypatch) -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda sig, _frame: got.append(sig))
    try:
        monkeypatch.setenv("WORKLOAD_FAULT", "promote")
        monkeypatch.setenv("WORKLOAD_FAULT_ACTION", "term")
        faults.point("promote")
        first = list(got)
        faults.point("promote")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert first == got == [signal.SIGTERM]


def test_an_unknown_action_is_named_in_one_line(fresh_points, monkeypatch) -> None:
    monkeypatch.setenv("WORKLOAD_FAULT", "report")
    monkeypatch.setenv("WORKLOAD_FAULT_ACTION", "explode")
    with pytest.raises(ValueError, match=r"^WORKLOAD_FAULT_ACTION='explode' is not allowed: use one of "
                                         r"\['kill', 'stop', 'term'\] or hang$"):
        faults.point("report")


def test_hang_blocks_the_calling_thread_only(fresh_points, monkeypatch) -> None:
    monkeypatch.setenv("WORKLOAD_FAULT", "read")
    monkeypatch.setenv("WORKLOAD_FAULT_ACTION", "hang")
    entered, returned = threading.Event(), threading.Event()

    def reader() -> None:
        entered.set()
        faults.point("read")
        returned.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    assert entered.wait(10)
    assert not returned.wait(0.5)  # this thread goes on: the point holds the other one
    assert thread.is_alive()  # held there, not ended by an error


@pytest.mark.parametrize(("action", "signum"),
                         [("kill", signal.SIGKILL), ("stop", signal.SIGSTOP), ("", signal.SIGKILL)])
def test_kill_and_stop_act_on_a_real_process(fresh_points, action: str, signum: int) -> None:
    """A real process reaching the point dies (kill, the default) or freezes (stop) there."""
    faults.point("before-ack")  # inert here (unset); the call lets mutation testing map this test to point()
    env = {**os.environ, "WORKLOAD_FAULT": "before-ack", "PYTHONPATH": str(ROOT)}
    if action:
        env["WORKLOAD_FAULT_ACTION"] = action
    else:
        env.pop("WORKLOAD_FAULT_ACTION", None)
    code = "from workload.core import faults; faults.point('claimed'); faults.point('before-ack'); print('went on')"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    try:
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        stopped = os.WSTOPSIG(status) if os.WIFSTOPPED(status) else None
        killed = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        assert (stopped or killed) == signum
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.stdout is not None and proc.stdout.read() == b""
