"""Feature-store cost as days accumulate: seconds per day and bytes per feature entry.

A bank's daily export of a quiet product can be one row a day, for years. Each day's feature entry
records the dataset files its window read (``Dataset.feature_inputs``); if that were every earlier
file, the entries and the work to check them would grow with the number of days (quadratic in all).
This seeds a dataset of N one-row days (bank-shaped: its own IDs as floats, tz-aware times, a
testing tail) through the loader's own calls, publishing then storing every day's features, and
reports seconds per day (all days, and the last tenth alone) and the mean bytes of an entry.

    python -m bench.featurecost [--days 400 4000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd

from workload.data import featurestore, publish, schema
from workload.data.dataset import Dataset
from workload.data.source import LocalSource

TESTING_DAYS = 7


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.featurecost", description=__doc__.split("\n\n")[0])
    p.add_argument("--days", type=int, nargs="+", default=[400, 4000], help="dataset sizes, in one-row days")
    args = p.parse_args(argv)
    print("| days | publish s/day | features s/day (all) | features s/day (last tenth) | entry bytes (mean) | "
          "entry bytes (max) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in args.days:
        r = measure(n)
        print(f"| {n:,} | {r['publish_s_per_day']:.4f} | {r['features_s_per_day']:.4f} | "
              f"{r['last_tenth_s_per_day']:.4f} | {r['entry_bytes_mean']:,.0f} | {r['entry_bytes_max']:,} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
