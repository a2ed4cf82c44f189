"""The failure classes, in one place: what a fault costs the item, and what the process exits with.

Two kinds of failure reach the worker, and they must never be confused:

* an **item fault** (`ItemFault`): the item can never succeed as it is (an unreadable or invalid data
  file, bad hyperparameters, a checkpoint from other features, a malformed queue item, training that
  diverged to NaN). It is dead-lettered at once with its error, and the other items go on.
* an **infrastructure fault** (`InfraFault`): the platform is sick, not the item (disk full, a
  read-only or permission-denied share, an I/O error or timeout on the share, Redis unreachable). It
  never costs an attempt: the item is released for later, the worker backs off, and if the fault
  persists the worker exits `EXIT_INFRA`, so Kubernetes shows a failing pod instead of the queue
  silently dead-lettering every remaining day.

`OSError` is classified by errno, never by its type alone: a corrupt Parquet file and a full disk
both arrive as `OSError` from some library, and only the errno tells them apart.

The exit codes below are defined here only: the Jobs' pod failure policy (infra/jobs.py imports this
stdlib-only module), `make local` and the tests read them.
"""

from __future__ import annotations

import errno
import re

EXIT_DONE = 0  # every item applied
EXIT_FAILED = 1  # an unexpected error (a bug): the traceback is in the log
EXIT_BAD_CONFIG = 2  # a flag, variable or runs file is wrong; the message names it
EXIT_INFRA = 3  # an infrastructure fault persisted (share or Redis): nothing was dead-lettered for it
EXIT_DEAD_LETTERS = 4  # the queue is drained but some items are dead-lettered: `status` shows why
EXIT_STALLED = 5  # the watchdog: stuck in I/O (a hung mount, a FIFO) longer than the bound; lease given up
EXIT_GPU_UNUSABLE = 6  # given a GPU that CUDA cannot use (driver too old for the image): a new pod cannot help
EXIT_TERMINATED = 143  # 128 + SIGTERM: preempted; not success, so a Job never mistakes it for completion
# A fresh process may do better after these (a new pod, another node): the Jobs retry them free.
# Bad config and dead letters are the work's own outcome: retrying cannot change them. EXIT_INFRA comes
# only after the pod rode the fault out for its whole retry budget (REDIS_RETRY_SECONDS,
# INFRA_GIVE_UP_SECONDS): the Jobs fail on it rather than re-create GPU pods for a day.
RETRYABLE_EXIT_CODES = (EXIT_STALLED, EXIT_TERMINATED)

# The share (NFS) or the local disk failing, full, read-only, or refusing us: never the item's fault.
INFRA_ERRNOS = frozenset({
    errno.EIO, errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ETIMEDOUT,
    errno.ESTALE, errno.EFBIG, errno.ENOLCK, errno.EAGAIN, errno.EBUSY, errno.ENOTCONN, errno.EHOSTDOWN,
    errno.EHOSTUNREACH, errno.ECONNRESET, errno.ECONNREFUSED, errno.ENETDOWN, errno.ENETUNREACH,
    errno.EMFILE, errno.ENFILE, errno.ENOMEM,
})
_ERRNO_IN_TEXT = re.compile(r"\[Errno (\d+)\]")


class ItemFault(Exception):
    """This item can never succeed as it is: dead-letter it now with this message."""


class InfraFault(Exception):
    """The platform failed (share, Redis, timeouts): costs the item nothing; retried after a backoff."""


class NonFinite(ItemFault):
    """Training produced NaN or infinity: the item fails and nothing is promoted."""


def infra_errno(exc: BaseException) -> int | None:
    """The infrastructure errno behind `exc` (its cause chain included), or None when there is none.

    Libraries wrap OS errors (pyarrow, torch, our own "unreadable file" messages); the errno may sit
    on a cause, or only in the text ("[Errno 28] No space left on device")."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, InfraFault):
            return errno.EIO
        if isinstance(cur, OSError):
            if cur.errno in INFRA_ERRNOS:
                return cur.errno
            if cur.errno is None and isinstance(cur, PermissionError | TimeoutError):
                return errno.EACCES if isinstance(cur, PermissionError) else errno.ETIMEDOUT
        m = _ERRNO_IN_TEXT.search(str(cur))
        if m and int(m[1]) in INFRA_ERRNOS:
            return int(m[1])
        cur = cur.__cause__ or cur.__context__
    return None


def is_infra(exc: BaseException) -> bool:
    return infra_errno(exc) is not None


def describe(exc: BaseException) -> str:
    """One line: what failed and why (the errno's name, so `ENOSPC` is greppable)."""
    code = infra_errno(exc)
    text = f"{type(exc).__name__}: {exc}" if not isinstance(exc, ItemFault | InfraFault) else str(exc)
    if code is not None and errno.errorcode.get(code, "") not in text:
        text += f" ({errno.errorcode.get(code, code)})"
    return text
