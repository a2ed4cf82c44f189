"""Benchmark datasets, simulated once and cached under ``build/bench/`` (ignored by git).

Two shapes: *single-shard* datasets whose one training file holds exactly N rows (10k, 100k, 1M:
the training-efficiency ratio), and *daily* datasets of tutorial-sized days (~10k rows, the
handbook's 5000 customers) whose earliest days sit in ``history/``, so that every trained day has
its full feature history and `seed` enqueues only the days a benchmark times.

A miniature (``python -m bench.run --mini``) simulates a small population into its own cache.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from workload.data import dataset as ds
from workload.data import featurestore, schema, simulator
from workload.data.dayfile import HISTORY, TRAINING
from workload.data.manifest import MANIFEST, write_manifest

CACHE = Path(__file__).resolve().parent.parent / "build" / "bench"
TEST_DAYS = 2


@dataclass(frozen=True)
class Population:
    """Who transacts in a simulated dataset, and where its datasets are cached."""

    customers: int = 5000  # the handbook's population (the tutorial's datasets): ~9.7k transactions a day
    terminals: int = 10000
    cache: Path = CACHE

    def folder(self, name: str) -> Path:
        suffix = "" if (self.customers, self.terminals) == (5000, 10000) else f"-{self.customers}c{self.terminals}t"
        return self.cache / (name + suffix)


HANDBOOK = Population()


def _publish(root: Path, training: dict[str, pd.DataFrame], testing: dict[str, pd.DataFrame]) -> Path:
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for role, files in (("training", training), ("testing", testing)):
        (tmp / role).mkdir(parents=True)
        for name, frame in files.items():
            frame.reset_index(drop=True).to_parquet(tmp / role / f"{name}.parquet", index=False)
    write_manifest(tmp)
    tmp.rename(root)
    return root


def single_shard(rows: int, pop: Population = HANDBOOK) -> Path:
    """A dataset whose one training file holds the last `rows` transactions before two test days."""
    root = pop.folder(f"single-{rows}")
    if (root / MANIFEST).exists():
        return root
    per_day = 1.8 * pop.customers  # under the simulator's mean rate (~1.95 a customer a day)
    days = int(rows // per_day) + 2  # a little more than enough days
    spec = simulator.SimulationSpec(customers=pop.customers, terminals=pop.terminals, train_days=days,
                                    test_days=TEST_DAYS, start_date="2018-04-01", seed=11)
    tx = simulator.simulate(spec).transactions
    train = tx[tx[schema.TX_TIME_DAYS] < days]
    if len(train) < rows:
        raise RuntimeError(f"simulated {len(train)} training rows, need {rows}")
    test = tx[tx[schema.TX_TIME_DAYS] >= days]
    testing = {str(d.date()): f for d, f in test.groupby(test[schema.TX_DATETIME].dt.normalize())}
    root.parent.mkdir(parents=True, exist_ok=True)
    return _publish(root, {"shard": train.iloc[-rows:]}, testing)


def daily(train_days: int, history_days: int = 0, pop: Population = HANDBOOK) -> Path:
    """`history_days` then `train_days` daily shards (the simulator's own layout) and two test days.
    History days feed the feature windows only: `seed` enqueues no item for them."""
    root = pop.folder(f"daily-{history_days}h{train_days}")
    if (root / MANIFEST).exists():
        return root
    spec = simulator.SimulationSpec(customers=pop.customers, terminals=pop.terminals,
                                    train_days=history_days + train_days, test_days=TEST_DAYS,
                                    start_date="2018-04-01", seed=12)
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    days = sorted(p for p in simulator.generate(tmp, spec) if p.parent.name == TRAINING)
    if history_days:
        (tmp / HISTORY).mkdir()
        for path in days[:history_days]:
            path.rename(tmp / HISTORY / path.name)
    write_manifest(tmp)
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
