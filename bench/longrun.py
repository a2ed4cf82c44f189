"""A run of thousands of days: does a day cost the same at day 2,000 as at day 100?

A bank's quiet product can train one run for years of daily files. Whatever a worker carries or scans per
applied day (the history in each checkpoint, the manifest of kept checkpoints, the report) makes each day
dearer than the one before, and the run quadratic in all. This seeds one run over N tiny days (a few rows
each) through `seed`'s own calls, drains it with one in-process `Worker` against a real redis-server, and
records, at day 100 and at day N: the seconds (wall and CPU) the 100 acks up to it took, the newest
checkpoint's bytes, and the checkpoint files kept. Flat: the later CPU time and size within `TOLERANCE` of the
earlier ones, and no more files than retention's ladder keeps (logarithmic in the days, by design).

    python -m bench.longrun [--days 2000] [--write]   # --write: into docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from bench.inprocess import seed
from workload.data import publish, schema
from workload.data.source import LocalSource
from workload.model.hparams import HParams
from workload.queue.workqueue import Lease, WorkQueue, connect
from workload.runtime.redis_server import RedisServer
from workload.runtime.worker import Worker, WorkerConfig
from workload.share import checkpoint
from workload.share.checkpoint import CheckpointStore
from workload.share.paths import share_paths

DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- longrun:begin -->", "<!-- longrun:end -->"
TESTING_DAYS = 3
HISTORY_DAYS = 40  # before the first training day: every day's features see their whole look-back from day 1
ROWS_PER_DAY = 4
EARLY, SPAN = 100, 100  # the early mark (day 100) and the acks each time figure covers
TOLERANCE = 1.2  # day N's figures over day 100's, at most
# Small on purpose: the figures are the worker's per-day bookkeeping, not training.
HP = HParams(hidden=(8,), epochs=1, batch_size=64, window_days=2, full_window_days=0, ema_decay=0.0)


def tiny_days(folder: Path, days: int, rows: int = ROWS_PER_DAY) -> None:
    """`days` daily exports of `rows` transactions each, after `HISTORY_DAYS` of history (the features' look-back:
    so day 100 costs what any day does, not less for a shorter window); the last `TESTING_DAYS` are testing
    days, one fraud a day there and every fifth day before."""
    start = pd.Timestamp("2015-01-01 09:30", tz="UTC")
    for i in range(-HISTORY_DAYS, days):
        role = "history" if i < 0 else "testing" if i >= days - TESTING_DAYS else "training"
        at = [start + pd.Timedelta(days=i, minutes=7 * r) for r in range(rows)]
        fraud = int(role == "testing" or i % 5 == 0)
        ids = [float(10_000_000 + (i + HISTORY_DAYS) * rows + r) for r in range(rows)]
        frame = pd.DataFrame({
            schema.TRANSACTION_ID: ids, schema.TX_DATETIME: at,
            schema.CUSTOMER_ID: [float((i + r) % 13) for r in range(rows)],
            schema.TERMINAL_ID: [float((i * r) % 7) for r in range(rows)],
            schema.TX_AMOUNT: [12.5 + (i + 3 * r) % 50 for r in range(rows)],
            schema.TX_FRAUD: [fraud] + [0] * (rows - 1),
            schema.TX_TIME_SECONDS: [(i + HISTORY_DAYS) * 86400 + 34200 + 420 * r for r in range(rows)],
            schema.TX_TIME_DAYS: [i + HISTORY_DAYS] * rows, schema.TX_FRAUD_SCENARIO: [0] * rows})
        (folder / role).mkdir(parents=True, exist_ok=True)
        frame.to_parquet(folder / role / f"{at[0]:%Y-%m-%d}.parquet", index=False)


@dataclass
class Mark:
    """What the run looked like at one applied day."""

    day: int
    wall_s: float  # the SPAN acks up to this day
    cpu_s: float
    checkpoint_bytes: int  # the newest checkpoint file
    files: int  # checkpoint files kept (manifests and temp files not counted)


class MarkingQueue(WorkQueue):
    """A `WorkQueue` that notes the wall and CPU clocks at each ack, and the checkpoint folder at the marks."""

    def __init__(self, *args: Any, store: CheckpointStore, marks: tuple[int, ...], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.store, self.marks = store, marks
        self.clocks: list[tuple[float, float]] = []
        self.seen: list[Mark] = []

    def ack(self, lease: Lease) -> Any:
        res = super().ack(lease)
        self.clocks.append((time.perf_counter(), time.process_time()))
        n = len(self.clocks)
        if n in self.marks:
            first = max(1, n - SPAN)  # the first ack's clock: imports and first-day costs are not a day's
            scale = SPAN / (n - first)
            (w1, c1), (w0, c0) = self.clocks[-1], self.clocks[first - 1]
            newest = self.store.dir / sorted(self.store.retained())[-1]
            files = sum(1 for p in self.store.dir.iterdir() if p.suffix == ".pt")
            self.seen.append(Mark(n, (w1 - w0) * scale, (c1 - c0) * scale, newest.stat().st_size, files))
        return res


@dataclass
class Result:
    days: int
    marks: list[Mark] = field(default_factory=list)
    setup_s: float = 0.0
    wall_s: float = 0.0

    def ratio(self, attr: str) -> float:
        early, late = self.marks[0], self.marks[-1]
        return getattr(late, attr) / max(getattr(early, attr), 1e-9)

    @property
    def files_bound(self) -> int:
        """What retention may keep at day N: the newest `keep`, the recent boundaries, about two a doubling."""
        return 3 + checkpoint.RECENT_BOUNDARIES + 2 * math.ceil(math.log2(max(self.days, 2))) + 2

    @property
    def flat(self) -> bool:
        return (all(self.ratio(a) <= TOLERANCE for a in ("cpu_s", "checkpoint_bytes"))
                and self.marks[-1].files <= self.files_bound)


def measure(days: int, early: int = EARLY) -> Result:
    """Seed one run over `days` tiny days, drain it with one in-process worker; the marks at `early` and `days`."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="longrun-") as tmp, RedisServer(Path(tmp) / "redis") as server:
        share = Path(tmp) / "share"
        root = share_paths(share)[0] / "bank"
        tiny_days(Path(tmp) / "export", days + TESTING_DAYS)
        publish.publish(root, LocalSource(Path(tmp) / "export"))
        store = CheckpointStore(share_paths(share)[1] / "long")
        queue = MarkingQueue(connect(server.url, server.password), "longrun", store=store, marks=(early, days))
        seed(queue, share, "bank", {"long": HP})
        cfg = WorkerConfig(share=share, redis_url=server.url, redis_password=server.password, prefix="longrun",
                           worker_id="longrun", plot_interval_s=1e9, checkpoint_interval_s=1e9)
        setup = time.monotonic() - started
        code = Worker(cfg, queue).run()
        if code != 0 or len(queue.clocks) != days:
            raise RuntimeError(f"in-process worker exited {code} after {len(queue.clocks)}/{days} acks")
        return Result(days, queue.seen, setup, time.monotonic() - started)


def table(res: Result) -> list[str]:
    out = ["| applied days | s per 100 acks (wall) | CPU s per 100 acks | newest checkpoint bytes | checkpoint files |",
           "|---:|---:|---:|---:|---:|"]
    out += [f"| {m.day:,} | {m.wall_s:.2f} | {m.cpu_s:.2f} | {m.checkpoint_bytes:,} | {m.files} |" for m in res.marks]
    out.append(f"| day {res.days:,} / day {res.marks[0].day} | {res.ratio('wall_s'):.2f} | {res.ratio('cpu_s'):.2f} | "
               f"{res.ratio('checkpoint_bytes'):.2f} | {res.ratio('files'):.2f} |")
    return out


def verdict(res: Result) -> str:
    what = (f"CPU time and checkpoint size within {TOLERANCE - 1:.0%} of day {res.marks[0].day}'s, checkpoint files "
            f"at most {res.files_bound} (retention's ladder: logarithmic in the days, by design)")
    return f"flat: {what}" if res.flat else f"NOT flat; wanted {what}"


def write(res: Result) -> None:
    """The block in docs/benchmarks.md (replaced, or added at the end); `make bench` carries it over."""
    block = "\n".join([
        BEGIN, f"## A run of {res.days:,} days", "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by `python -m bench.longrun --write` in "
        f"{res.wall_s / 60:.1f} min ({os.cpu_count()} cores, {platform.processor() or platform.machine()}, shared "
        f"with other work: CPU seconds are the figure judged, wall time is noisy there). One run over "
        f"{res.days:,} training days of {ROWS_PER_DAY} rows each, drained by one in-process worker against a real "
        "redis-server (pictures drawn only after the last day, no mid-day checkpoints: both are periodic, not "
        "per day). A figure per 100 acks covers the 100 acks up to that day (at day 100, from the first ack's "
        "return, scaled).", "", *table(res), "", f"Verdict: {verdict(res)}.", "",
        "Flat because a checkpoint carries the run's history as references to immutable history segments on the "
        "share (plus the entries since the last one), superseded day-boundary checkpoints are pruned to the "
        "newest few plus a ladder (docs/architecture.md, 'Where each rule lives'), and the report appends to "
        "metrics.jsonl rather than rewriting it.", END])
    text = DOCS.read_text()
    if BEGIN in text and END in text:
        text = text.partition(BEGIN)[0] + block + text.partition(END)[2]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    DOCS.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.longrun", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("--days", type=int, default=2000, help="training days of the run (at least 2 x 100)")
    p.add_argument("--early", type=int, default=EARLY, help="the early mark, in applied days")
    p.add_argument("--write", action="store_true", help="record the table in docs/benchmarks.md")
    args = p.parse_args(argv)
    if args.days < 2 * args.early or args.early < 2:
        p.error(f"--days {args.days} must be at least twice --early {args.early} (and --early at least 2)")
    res = measure(args.days, args.early)
    print("\n".join(table(res)))
    print(verdict(res))
    if args.write:
        write(res)
    return 0 if res.flat else 1


if __name__ == "__main__":
    raise SystemExit(main())
