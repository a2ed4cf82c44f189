"""Feature-store cost as days accumulate: seconds per day and bytes per feature entry.

A bank's daily export of a quiet product can be one row a day, for years. Each day's feature entry
records the dataset files its window read (``Dataset.feature_inputs``); if that were every earlier
file, the entries and the work to check them would grow with the number of days (quadratic in all).
This seeds a dataset of N one-row days (bank-shaped: its own IDs as floats, tz-aware times, a
testing tail) through the loader's own calls, publishing then storing every day's features, and
reports seconds per day (all days, and the last tenth alone) and the mean bytes of an entry.

    python -m bench.featurecost [--days 400 4000] [--write]   # --write: into docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from workload.data import featurestore, publish, schema
from workload.data.dataset import Dataset
from workload.data.source import LocalSource

TESTING_DAYS = 7
DOCS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- featurecost:begin -->", "<!-- featurecost:end -->"


def one_row_days(folder: Path, days: int) -> None:
    """`days` daily exports of one transaction each; the last `TESTING_DAYS` are testing days."""
    start = pd.Timestamp("2015-01-01 09:30", tz="Europe/Paris")
    for i in range(days):
        role = "testing" if i >= days - TESTING_DAYS else "training"
        at = start + pd.Timedelta(days=i)
        frame = pd.DataFrame({
            schema.TRANSACTION_ID: [float(10_000_000 - i)], schema.TX_DATETIME: [at],
            schema.CUSTOMER_ID: [float(i % 13)], schema.TERMINAL_ID: [float(i % 7)],
            schema.TX_AMOUNT: [12.5 + i % 50], schema.TX_FRAUD: [int(i % 97 == 0)],
            # The simulator's columns, as long as the schema requires them.
            schema.TX_TIME_SECONDS: [i * 86400 + 34200], schema.TX_TIME_DAYS: [i], schema.TX_FRAUD_SCENARIO: [0]})
        (folder / role).mkdir(parents=True, exist_ok=True)
        frame.to_parquet(folder / role / f"{at:%Y-%m-%d}.parquet", index=False)


def measure(days: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="featurecost-") as tmp:
        src, root = Path(tmp) / "export", Path(tmp) / "datasets" / "bank"
        one_row_days(src, days)
        started = time.perf_counter()
        publish.publish(root, LocalSource(src))
        published = time.perf_counter() - started
        dataset = Dataset(root)
        stored = [f["path"] for f in sorted(dataset.files, key=lambda f: f["first"])
                  if f["role"] in featurestore.STORED_ROLES]
        tail = stored[-max(1, len(stored) // 10):]
        started = time.perf_counter()
        for rel in stored[:-len(tail)]:
            dataset.day_features(rel)
        middle = time.perf_counter()
        for rel in tail:
            dataset.day_features(rel)
        ended = time.perf_counter()
        entry_bytes = [featurestore.paths(root, rel)[1].stat().st_size for rel in stored]
        return {"days": days, "publish_s_per_day": published / days, "features_s_per_day": (ended - started) / days,
                "last_tenth_s_per_day": (ended - middle) / len(tail),
                "entry_bytes_mean": sum(entry_bytes) / len(entry_bytes), "entry_bytes_max": max(entry_bytes)}


def table(rows: list[dict[str, float]]) -> list[str]:
    out = ["| days | publish s/day | features s/day (all days) | features s/day (last tenth) | entry bytes (mean) | "
           "entry bytes (max) |", "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['days']:,} | {r['publish_s_per_day']:.4f} | {r['features_s_per_day']:.4f} | "
                   f"{r['last_tenth_s_per_day']:.4f} | {r['entry_bytes_mean']:,.0f} | {r['entry_bytes_max']:,} |")
    return out


def write(rows: list[dict[str, float]], wall_s: float) -> None:
    """The block in docs/benchmarks.md (replaced, or added at the end); `make bench` carries it over."""
    block = "\n".join([
        BEGIN, "## Feature-store cost as days accumulate", "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by `python -m bench.featurecost --write` in "
        f"{wall_s / 60:.1f} min ({os.cpu_count()} cores, {platform.processor() or platform.machine()}, shared with "
        "other work: compare rows, not machines). One-row days, published then featurised through the loader's "
        "own calls; an entry is a day's `features/<version>/<role>/<day>.json`.", "", *table(rows), "",
        "Flat in the number of days: a day's window (itself and `features.LOOKBACK_DAYS` before it) is found by "
        "bisection on first day, so neither its entry nor its cost grows with the days before it.", END])
    text = DOCS.read_text()
    if BEGIN in text and END in text:
        text = text.partition(BEGIN)[0] + block + text.partition(END)[2]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    DOCS.write_text(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.featurecost", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("--days", type=int, nargs="+", default=[400, 4000], help="dataset sizes, in one-row days")
    p.add_argument("--write", action="store_true", help="record the table in docs/benchmarks.md")
    args = p.parse_args(argv)
    started, rows = time.monotonic(), []
    for n in args.days:
        rows.append(measure(n))
        print(table(rows)[-1], flush=True)
    print("\n".join(table(rows)))
    if args.write:
        write(rows, time.monotonic() - started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
