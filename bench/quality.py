"""Model quality on the Fraud Detection Handbook's own protocol, against its baselines.

The handbook (chapter 3) trains on 2018-07-25..31, leaves a 7-day delay (labels of those days are
not known before 2018-08-08), and tests on 2018-08-08..14 with the cards already known compromised
removed; it reports AUC, AP and Card Precision@100. Here the data is the simulator's ``cluster``
preset (the handbook's size and start date), the features are the project's (strict 7-day delay,
to the second), and every model sees the same rows:

- the project's model, trained as the workers train it: day by day, in order, warm-started;
- logistic regression (class-weighted, Newton: ``metrics.logistic_regression_baseline``);
- random forest (scikit-learn, 100 trees, ``random_state=0``; each tree on a bootstrap sample of at
  most ``FOREST_ROWS`` rows, which is all of them on the handbook's week);
- gradient-boosted trees (LightGBM, its ``hist`` algorithm, 100 trees, ``random_state=0``).

Two training periods: the handbook's week, and every day whose labels are known before the test
period and whose features have their full history (2018-05-08..07-31), an option the issue names.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bench import data as bench_data
from workload.data import dataset as ds
from workload.data import features, simulator
from workload.model import metrics
from workload.model.trainer import HParams, Trainer

TEST = ("2018-08-08", "2018-08-14")
PERIODS = {
    "handbook week (2018-07-25..31)": ("2018-07-25", "2018-07-31"),
    "all known days (2018-05-08..07-31)": ("2018-05-08", "2018-07-31"),
}
MODEL = "project MLP (default run)"
# `python -m bench.run --mini`: the same protocol on a small population over 25 days, seconds in all; it
# proves the benchmark runs to its end, its figures mean nothing.
MINI_SPEC = simulator.SimulationSpec(customers=300, terminals=600, train_days=24, test_days=1,
                                     start_date="2018-04-01", seed=0)
MINI_TEST = ("2018-04-21", "2018-04-24")
MINI_PERIODS = {"mini week (2018-04-06..12)": ("2018-04-06", "2018-04-12")}
FOREST_ROWS = 210_000


@dataclass(frozen=True)
class Score:
    period: str
    model: str
    auc: float
    ap: float
    cp100: float
    seconds: float


def cluster_dataset(cache: Path = bench_data.CACHE, mini: bool = False) -> Path:
    """The ``cluster`` preset on disk (cached under build/bench), as ``seed`` lays it out."""
    root = cache / ("cluster-mini" if mini else "cluster")
    if (root / ds.MANIFEST).exists():
        return root
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    simulator.generate(tmp, MINI_SPEC if mini else simulator.PRESETS["cluster"])
    ds.write_manifest(tmp)
    tmp.rename(root)
    return root


def _days(data: ds.Dataset, first: str, last: str) -> list[str]:
    return [f["path"] for f in sorted(data.files, key=lambda f: f["first"])
            if f["role"] == "training" and first <= f["first"] and f["last"] <= last]


def _baselines(x: np.ndarray, y: np.ndarray, x_test: np.ndarray) -> dict[str, tuple[np.ndarray, float]]:
    import lightgbm
    from sklearn.ensemble import RandomForestClassifier

    out = {}
    started = time.perf_counter()
    out["logistic regression"] = (metrics.logistic_regression_baseline(x, y, x_test), time.perf_counter() - started)
    started = time.perf_counter()
    # Each tree on a bootstrap sample of at most FOREST_ROWS rows: the whole week (68k rows) as scikit-learn's
    # default does, a quarter of the all-days period (833k rows), whose full forest takes ~30 min on 2 cores.
    forest = RandomForestClassifier(n_estimators=100, random_state=0, n_jobs=-1,
                                    max_samples=min(1.0, FOREST_ROWS / len(y))).fit(x, y)
    out["random forest"] = (forest.predict_proba(x_test)[:, 1], time.perf_counter() - started)
    started = time.perf_counter()
    boosted = lightgbm.LGBMClassifier(n_estimators=100, random_state=0, n_jobs=2, verbose=-1,
                                      deterministic=True, force_col_wise=True).fit(x, y)
    out["gradient-boosted trees (LightGBM)"] = (boosted.predict_proba(x_test)[:, 1], time.perf_counter() - started)
    return out


def run(hp: HParams | None = None, mini: bool = False,
        cache: Path = bench_data.CACHE) -> tuple[list[Score], dict[str, float]]:
    """Every model on every period; and how long the features took (computed once, stored)."""
    hp = hp or HParams()
    root = cluster_dataset(cache, mini)
    test_days, periods = (MINI_TEST, MINI_PERIODS) if mini else (TEST, PERIODS)
    started = time.perf_counter()
    computed, _ = ds.Dataset(root).ensure_features()
    info = {"feature_days": float(computed), "feature_s": time.perf_counter() - started}
    data = ds.Dataset(root)
    test = data.examples(_days(data, *test_days))
    scores = []

    def note(period: str, model: str, s: np.ndarray, seconds: float) -> None:
        m = metrics.evaluate(s, test.y, test.day, test.card, test.known)
        scores.append(Score(period, model, m["roc_auc"], m["average_precision"], m["card_precision_top100"], seconds))
        print(f"  {period}: {model}: AUC {m['roc_auc']:.3f} AP {m['average_precision']:.3f} "
              f"CP@100 {m['card_precision_top100']:.3f} ({seconds:.0f}s)", flush=True)

    for period, (first, last) in periods.items():
        days = _days(data, first, last)
        parts = [(rel, data.examples([rel])) for rel in days]
        started = time.perf_counter()
        trainer = Trainer("quality", hp, features.FEATURE_NAMES, torch.device("cpu"),
                          feature_version=features.FEATURE_VERSION)
        for rel, ex in parts:
            trainer.begin_shard(rel, ex.x)
            trainer.train_shard(ex.x, ex.y, lambda: True)
            trainer.finish_shard({})
        note(period, MODEL, trainer.score(test.x), time.perf_counter() - started)
        x = np.concatenate([ex.x for _, ex in parts])
        y = np.concatenate([ex.y for _, ex in parts])
        for name, (s, seconds) in _baselines(x, y, test.x).items():
            note(period, name, s, seconds)
    info["test_rows"] = float(len(test.y))
    info["test_rows_kept"] = float((~test.known).sum())
    return scores, info
