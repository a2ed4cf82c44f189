"""Benchmark datasets, simulated once and cached under ``build/bench/`` (ignored by git).

Two shapes: *single-shard* datasets whose one training file holds exactly N rows (10k, 100k, 1M:
the training-efficiency ratio), and a *daily* dataset of tutorial-sized days (~10k rows, the
handbook's 5000 customers) long enough that every benchmarked day has its full feature history.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from workload.data import dataset as ds
from workload.data import featurestore, schema, simulator

CACHE = Path(__file__).resolve().parent.parent / "build" / "bench"
# The handbook's population (the tutorial's datasets): ~9.7k transactions a day.
CUSTOMERS, TERMINALS = 5000, 10000
TEST_DAYS = 2


def _publish(root: Path, training: dict[str, pd.DataFrame], testing: dict[str, pd.DataFrame]) -> Path:
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for role, files in (("training", training), ("testing", testing)):
        (tmp / role).mkdir(parents=True)
        for name, frame in files.items():
            frame.reset_index(drop=True).to_parquet(tmp / role / f"{name}.parquet", index=False)
    ds.write_manifest(tmp)
    tmp.rename(root)
    return root


def single_shard(rows: int) -> Path:
    """A dataset whose one training file holds the last `rows` transactions before two test days."""
    root = CACHE / f"single-{rows}"
    if (root / ds.MANIFEST).exists():
        return root
    days = rows // 9000 + 2  # a little more than enough days at ~9.7k rows a day
    spec = simulator.SimulationSpec(customers=CUSTOMERS, terminals=TERMINALS, train_days=days,
                                    test_days=TEST_DAYS, start_date="2018-04-01", seed=11)
    tx = simulator.simulate(spec).transactions
    train = tx[tx[schema.TX_TIME_DAYS] < days]
    if len(train) < rows:
        raise RuntimeError(f"simulated {len(train)} training rows, need {rows}")
    test = tx[tx[schema.TX_TIME_DAYS] >= days]
    testing = {str(d.date()): f for d, f in test.groupby(test[schema.TX_DATETIME].dt.normalize())}
    return _publish(root, {"shard": train.iloc[-rows:]}, testing)


def daily(train_days: int) -> Path:
    """`train_days` tutorial-sized daily shards and two test days (the simulator's own layout)."""
    root = CACHE / f"daily-{train_days}"
    if (root / ds.MANIFEST).exists():
        return root
    spec = simulator.SimulationSpec(customers=CUSTOMERS, terminals=TERMINALS, train_days=train_days,
                                    test_days=TEST_DAYS, start_date="2018-04-01", seed=12)
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    simulator.generate(tmp, spec)
    ds.write_manifest(tmp)
    tmp.rename(root)
    return root


def place(src: Path, share: Path, name: str = "fraud") -> None:
    """Put a copy of a dataset on a share, where `seed` would have laid it out (without any features
    stored next to the cached copy: each benchmark's seed computes its own)."""
    target = share / "datasets" / name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, target, copy_function=shutil.copyfile, ignore=shutil.ignore_patterns(featurestore.FOLDER))


def seed_features(share: Path, name: str = "fraud") -> ds.Dataset:
    """What `seed` does once the dataset is on the share: every day's features, computed and stored."""
    data = ds.Dataset(share / "datasets" / name)
    data.ensure_features()
    return data
