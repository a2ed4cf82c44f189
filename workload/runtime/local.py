"""`make local`: the cluster in miniature. A real Redis server (AOF under the local folder), a
local folder as the share, N worker processes as the Job's pods, a progress bar, a summary.

Running it again resumes what was left, or trains nothing when everything is done. One `make local`
per folder at a time (a lock); the Redis server and the workers die with it, however it ends. The
exit code is the workers' verdict (workload.core.errors): 0 all done, 4 dead letters (listed), 3 or 5 an
infrastructure fault (the worker's last log lines are shown). While it runs,
`python -m workload status --dir <dir>` reads the queue: the Redis address and password are in
`<dir>/redis/connection.json` (owner-only, removed when Redis stops), so they never appear in a
command line or a log. After it ended, `status --dir` starts a Redis of its own on the folder's AOF.

The folder is `local` for the simulated dataset and `local-NAME` for your own (`--datasets .../NAME`):
a dataset has one source, so your data never lands on the simulated one's share. The folder remembers
its dataset's source, mapping and format (`local.json`): run again with `--dir` alone. It holds a
`.gitignore` of `*`, so a folder inside a git checkout never shows a bank's data as untracked files.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from workload.core import preemption
from workload.core.errors import EXIT_BAD_CONFIG, EXIT_DEAD_LETTERS, EXIT_DONE, EXIT_FAILED, EXIT_INFRA, EXIT_STALLED
from workload.data.dayfile import DatasetError
from workload.model import report
from workload.queue import plan
from workload.queue.workqueue import Counts, WorkQueue, connect
from workload.runtime.redis_server import RedisServer, die_with_parent
from workload.share.paths import METRICS_PNG, NAME, PR_CURVE_PNG, REPORT_HTML, REPORT_TXT, share_paths

log = logging.getLogger("workload.runtime.local")

CONNECTION = Path("redis") / "connection.json"  # under --dir
REMEMBERED = "local.json"  # under --dir: the dataset's source, mapping and format, for the next run
READING = ("datasets", "columns", "datetime_format")  # the flags a folder remembers


class LocalNotRunning(Exception):
    """No `local` is running in that folder (never started, finished, or killed)."""


@dataclass(frozen=True)
class Connection:
    url: str
    password: str
    share: Path
    running: bool = True  # False: a finished `local`'s Redis, started from its AOF to be read


def default_dir(datasets: str | None) -> Path:
    """`local` for the simulated dataset; `local-NAME` for `--datasets .../NAME` (a folder or gs:// prefix)."""
    if not datasets:
        return Path("local")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", PurePosixPath(str(datasets).rstrip("/")).name).strip("-.")
    return Path(f"local-{name[:50] or 'data'}")


def recall(args: argparse.Namespace, base: Path) -> dict[str, str]:
    """Fill the reading flags not given from what `base` remembers; what this run reads, to remember."""
    try:
        seen = json.loads((base / REMEMBERED).read_text())
    except FileNotFoundError:
        seen = {}
    except ValueError as exc:
        log.warning("%s is unreadable (%s): remembering this run's flags instead", base / REMEMBERED, exc)
        seen = {}
    filled = {flag: seen[flag] for flag in READING if getattr(args, flag) is None and isinstance(seen.get(flag), str)}
    for flag, value in filled.items():
        setattr(args, flag, value)
    if filled:
        log.info("as %s remembers: %s", base / REMEMBERED,
                 " ".join(f"--{k.replace('_', '-')} {shlex.quote(v)}" for k, v in filled.items()))
    return {flag: absolute(flag, getattr(args, flag)) for flag in READING if getattr(args, flag) is not None}


def absolute(flag: str, value: str) -> str:
    """A local path as an absolute one (the next run may start elsewhere); gs:// and formats as given."""
    if flag == "datetime_format" or "://" in str(value):
        return str(value)
    return str(Path(value).resolve())


def remember(base: Path, reading: dict[str, str]) -> None:
    (base / REMEMBERED).write_text(json.dumps(reading, indent=1, sort_keys=True) + "\n")


def keep_out_of_git(base: Path) -> None:
    """A `.gitignore` of `*` in the folder: inside a checkout, git ignores all of it (bank data included)."""
    ignore = base / ".gitignore"
    if not ignore.exists():
        ignore.write_text("# written by `python -m workload local`: nothing here belongs in git\n*\n")


def write_connection(base: Path, server: RedisServer, share: Path) -> Path:
    """Record how to reach this Redis, readable by the owner only (it holds the password)."""
    path = base / CONNECTION
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": server.url, "password": server.password, "share": str(share), "pid": os.getpid()}, f)
    return path


def read_connection(base: Path) -> Connection:
    """The Redis and share of the `local` running in `base`; LocalNotRunning when there is none."""
    path = Path(base) / CONNECTION
    try:
        data = json.loads(path.read_text())
        pid = int(data["pid"])
        conn = Connection(url=data["url"], password=data["password"], share=Path(data["share"]))
    except FileNotFoundError:
        raise LocalNotRunning(f"--dir {base}: no `python -m workload local` is running there (no {path}); "
                              "start it with `make local`") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise LocalNotRunning(f"--dir {base}: {path} is unreadable ({exc}); restart `make local`") from None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise LocalNotRunning(f"--dir {base}: the `local` that wrote {path} (pid {pid}) is gone; "
                              "run `make local` again to resume") from None
    except PermissionError:
        pass  # alive, someone else's
    return conn


@contextmanager
def reopened(base: Path) -> Iterator[Connection]:
    """The Redis and share of the `local` in `base`: the running one's, or, when it has ended, a Redis of
    our own started from its AOF for as long as the caller reads (under the folder's lock, so no `local`
    starts on it meanwhile). LocalNotRunning when no `local` ever ran there."""
    base = Path(base)
    try:
        conn: Connection | None = read_connection(base)
    except LocalNotRunning:
        conn = None
    if conn is not None:
        yield conn
        return
    if not (base / "redis").is_dir() or not (base / "share").is_dir():
        raise LocalNotRunning(f"--dir {base}: no `python -m workload local` ran there (no {base / 'redis'}); "
                              "start it with `make local`")
    lock = lock_folder(base)
    if lock is None:
        raise LocalNotRunning(f"--dir {base}: a `local` is starting or stopping there; try again in a moment")
    try:
        with RedisServer(base / "redis") as server:
            yield Connection(url=server.url, password=server.password, share=base / "share", running=False)
    finally:
        os.close(lock)


def progress_line(done: int, dead: int, leased: int, total: int, elapsed: float, width: int = 30) -> str:
    finished = done + dead
    filled = int(width * finished / total) if total else width
    return (f"[{'#' * filled}{'.' * (width - filled)}] {finished}/{total} shards "
            f"({done} applied, {dead} dead-lettered, {leased} training) {elapsed:5.0f}s")


def lock_folder(base: Path) -> int | None:
    """Hold `base`'s lock for the life of this process (the kernel drops it however we die); None
    when another `make local` holds it."""
    fd = os.open(base / "local.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def verdict(codes: list[int]) -> int:
    """One exit code for the run from the workers': infrastructure first, then dead letters."""
    for code in (EXIT_INFRA, EXIT_STALLED, EXIT_DEAD_LETTERS):
        if code in codes:
            return code
    return EXIT_DONE if all(c == EXIT_DONE for c in codes) else EXIT_FAILED


def seed_command(args: argparse.Namespace) -> list[str]:
    """`seed` with the data and runs `local` was given."""
    cmd = [sys.executable, "-m", "workload", "seed", "--preset", args.preset]
    for run in args.run or []:
        cmd += ["--run", run]
    for flag, value in (("--runs-file", args.runs_file), ("--datasets", args.datasets), ("--columns", args.columns),
                        ("--datetime-format", args.datetime_format)):
        if value:
            cmd += [flag, str(value)]
    return cmd


def main(args: argparse.Namespace) -> int:
    args.dir = args.dir or default_dir(args.datasets)
    base = args.dir.resolve()
    share, logs = base / "share", base / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    keep_out_of_git(base)
    lock = lock_folder(base)
    if lock is None:
        holder = (base / "local.lock").read_text().strip() or "?"
        log.error("another `make local` (pid %s) is running on %s: wait for it, stop it, or use another --dir",
                  holder, base)
        return EXIT_BAD_CONFIG
    server = RedisServer(base / "redis")
    started = time.monotonic()
    workers: list[subprocess.Popen[bytes]] = []
    interrupted = False
    try:
        server.start()
        write_connection(base, server, share)
        log.info("Redis %s (AOF in %s); share %s", server.url, server.data_dir, share)
        env = worker_env(args, server, share)
        reading = recall(args, base)
        seeded = seed(args, env)
        if seeded != 0:
            log.error("seeding failed (see above)")
            return seeded if seeded > 0 else EXIT_FAILED
        remember(base, reading)
        queue = WorkQueue(connect(server.url, server.password))
        before = requeue_and_count(args, queue, base)
        if not before.drained:
            start_workers(args, env, logs, workers)
        watch(queue, workers, started)
        return finish(queue, share, logs, workers, before)
    except KeyboardInterrupt:
        interrupted = True
        print(file=sys.stderr)
        log.warning("interrupted: workers release their items and stop; run again to resume")
        return 130
    finally:
        stop_workers(workers)
        server.stop()
        (base / CONNECTION).unlink(missing_ok=True)
        if interrupted:
            log.info("stopped cleanly after %.0fs", time.monotonic() - started)


def worker_env(args: argparse.Namespace, server: RedisServer, share: Path) -> dict[str, str]:
    """The environment of the seed and worker processes: what the Jobs' pods get from the stack."""
    return {**os.environ, "REDIS_URL": server.url, "REDIS_PASSWORD": server.password, "SHARE_DIR": str(share),
            "TORCH_THREADS": str(max(1, (os.cpu_count() or 1) // args.workers)),
            "CHECKPOINT_INTERVAL_SECONDS": str(args.checkpoint_interval),
            "LEASE_TTL_SECONDS": str(args.lease_ttl)}


def seed(args: argparse.Namespace, env: dict[str, str]) -> int:
    """`python -m workload seed` as the loader Job runs it; its exit code."""
    return subprocess.run(seed_command(args), env=env, preexec_fn=die_with_parent()).returncode


def requeue_and_count(args: argparse.Namespace, queue: WorkQueue, base: Path) -> Counts:
    """Dead letters back first with --requeue; the queue's counts before any worker starts."""
    if args.requeue:
        ids = queue.requeue()
        log.info("requeued %d dead-lettered shard(s)%s", len(ids), f": {', '.join(ids)}" if ids else "")
    before = queue.counts()
    if before.drained:
        log.info("nothing new to train: %d shard(s) applied, %d dead-lettered (delete %s to start over%s)",
                 before.done, before.dead, base, "; `--requeue` retries the dead-lettered" if before.dead else "")
    return before


def start_workers(args: argparse.Namespace, env: dict[str, str], logs: Path,
                  workers: list[subprocess.Popen[bytes]]) -> None:
    """The Job's pods: `--workers` worker processes, each logging to its own file (appended to
    `workers` one by one, so an interrupt stops those already started)."""
    for i in range(args.workers):
        out = open(logs / f"worker-{i}.log", "ab")  # noqa: SIM115 - handed to the child
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "workload", "worker", "--worker-id", f"local-{i}"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent()))
    log.info("%d workers started; logs in %s", len(workers), logs)
    log.info("queue status from another terminal: %s -m workload status --dir %s",
             shlex.quote(sys.executable), shlex.quote(str(args.dir)))


def watch(queue: WorkQueue, workers: list[subprocess.Popen[bytes]], started: float) -> None:
    """A progress bar while any worker runs (a line every 10 s when stderr is not a terminal)."""
    tty = sys.stderr.isatty()
    last_print = 0.0
    while any(w.poll() is None for w in workers):
        c = queue.counts()
        now = time.monotonic()
        line = progress_line(c.done, c.dead, c.leased, c.total, now - started)
        if tty:
            print("\r" + line, end="", file=sys.stderr, flush=True)
        elif now - last_print >= 10:
            print(line, file=sys.stderr, flush=True)
            last_print = now
        time.sleep(0.5)
    if workers:
        c = queue.counts()
        print(("\r" if tty else "") + progress_line(c.done, c.dead, c.leased, c.total,
                                                    time.monotonic() - started), file=sys.stderr)


def finish(queue: WorkQueue, share: Path, logs: Path, workers: list[subprocess.Popen[bytes]],
           before: Counts) -> int:
    """The run's exit code from the workers' (a failed worker's last log lines shown), and the summary."""
    codes = [w.returncode for w in workers]
    for i, code in enumerate(codes):
        if code not in (EXIT_DONE, EXIT_DEAD_LETTERS):
            tail = (logs / f"worker-{i}.log").read_text(errors="replace").splitlines()[-15:]
            log.error("worker local-%d exited %d; last lines of its log:\n%s", i, code, "\n".join(tail))
    summary(queue, share)
    code = verdict(codes) if workers else (EXIT_DEAD_LETTERS if before.dead else EXIT_DONE)
    if code == EXIT_DEAD_LETTERS:
        log.error("some shards are dead-lettered (listed above with their errors): fix them, then run "
                  "again with --requeue (make local ARGS=--requeue)")
    elif code in (EXIT_INFRA, EXIT_STALLED):
        log.error("workers stopped on an infrastructure fault (above); nothing was dead-lettered for it: "
                  "fix it and run again to resume")
    return code


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to those still running, as a preemption would; killed if still there after the pod's
    grace period."""
    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + preemption.GRACE_PERIOD_S
    for w in workers:
        try:
            w.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.kill()


def share_truth(queue: WorkQueue, share: Path) -> plan.Truth | None:
    """What the share's newest checkpoints record against Redis's done (as `status` shows it); None, with a
    warning, where the share's plan cannot be read."""
    from workload.model import lineage  # torch: only once the workers are done

    try:
        return plan.truth(queue, share, lineage.applied_days)
    except (plan.PlanError, DatasetError) as exc:
        log.warning("cannot compare the queue's done days with the share: %s", exc)
        return None


def summary(queue: WorkQueue, share: Path) -> None:
    """Each run's days applied as the share records them (Redis's done where the share's plan cannot be read),
    its dead letters, figures and where its report is."""
    _, output_dir = share_paths(share)
    snap = queue.snapshot()
    truth = share_truth(queue, share)
    lines = ["", "Summary"]
    for run, r in snap["runs"].items():
        applied = truth.applied.get(run, r["done"]) if truth else r["done"]
        lines.append(f"  run {run}: {applied}/{r['total']} shards applied, {len(r['dead'])} dead-lettered")
        for item, d in r["dead"].items():
            lines.append(f"    dead: {item}: {d['error']}")
        m = report.latest_metrics(output_dir / run) if NAME.match(run) else None  # a hostile name: no path
        if m:
            lines.append(f"    test days: {report.figures_line(m)}")
            if m.get("alerts"):
                lines += ["    alert thresholds:", *(f"  {line}" for line in report.alert_lines(m["alerts"]))]
        lines.append(f"    report:  {output_dir / run / REPORT_TXT}")
        lines.append(f"    page:    {output_dir / run / REPORT_HTML}")
        lines.append(f"    plots:   {output_dir / run / METRICS_PNG}, {output_dir / run / PR_CURVE_PNG}")
    if truth and truth.line():
        lines.append(f"  {truth.line()}")
    print("\n".join(lines))
