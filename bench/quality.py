"""Model quality on the Fraud Detection Handbook's protocol, at three training sizes, against four baselines.

The handbook (chapter 3) trains on 2018-07-25..31, leaves a 7-day delay (labels of those days are
not known before 2018-08-08), and tests on 2018-08-08..14 with the cards already known compromised
removed; it reports AUC, AP and Card Precision@100 (cards found on a test day leave the later days:
``metrics.evaluate(..., known=...)``). Here the data is the simulator's ``cluster`` preset (the
handbook's size and start date), the features are the project's (strict 7-day delay, to the second),
and every model sees the same rows. Three training sizes, all ending 2018-07-31 and tested on the
same week, so only the amount of labelled data differs:

- ``4days``: 2018-07-28..31, what a bank has after a month of history and four labelled days (the
  features read at most 37 days back, so a longer history changes none of them);
- ``week``: the handbook's week, 2018-07-25..31;
- ``all``: every day whose labels are known before the test week and whose features have their full
  history, 2018-05-08..07-31 (12 weeks).

Models: the project's default run, trained as the workers train it (day by day, in order, warm
started, each day on its window); logistic regression (``baselines.logistic_regression_baseline``); random forest
(scikit-learn, 100 trees, each on a bootstrap sample of at most ``FOREST_ROWS`` rows); LightGBM and
XGBoost (100 trees, ``hist``). Each with seeds 0, 1, 2 (the mean and the range are shown); the
logistic regression and the boosted trees (no subsampling) use no randomness: fitted once (``SEEDLESS``).

The ensemble under trial (issue 33; a preset only if it lifts CP@100 at the three sizes): ``--ensemble K`` trains
the default run as K members (seeds), packed as a packed worker trains them, each calibrated on the calibration days
as the worker calibrates, scored as their calibrated mean (``ensemble_run``); recorded as the variant "ensemble of K".

Every figure is kept in ``build/bench/quality/<size>.json`` as it is measured, so a size, a model or a
variant of the default run can be run alone (``--size``, ``--models``, ``--variant``/``--hparams``)
and the table is printed from everything measured so far:

    nice -n 10 python -m bench.quality --size 4days
    nice -n 10 python -m bench.quality --models mlp --ensemble 4   # K members, packed, their calibrated mean
    nice -n 10 python -m bench.quality --size week --models mlp --seeds 0,1 --variant wide \\
        --hparams '{"hidden": [128, 64]}'
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bench import baselines
from bench import data as bench_data
from workload.data import dataset as ds
from workload.data import features, simulator
from workload.data.manifest import MANIFEST, write_manifest
from workload.model import calibration, metrics, packed
from workload.model.trainer import HParams, Trainer, shard_seed

TEST = ("2018-08-08", "2018-08-14")
SIZES = {
    "4days": ("4 days after a month of history (2018-07-28..31)", "2018-07-28", "2018-07-31"),
    "week": ("the handbook's week (2018-07-25..31)", "2018-07-25", "2018-07-31"),
    "all": ("all known days, 12 weeks (2018-05-08..07-31)", "2018-05-08", "2018-07-31"),
}
SEEDS = (0, 1, 2)
DEFAULT = "default run"
BASELINES = ("logistic regression", "random forest", "LightGBM", "XGBoost")
MODELS = {"mlp": DEFAULT, "lr": BASELINES[0], "rf": BASELINES[1], "lgbm": BASELINES[2], "xgb": BASELINES[3]}
# Fits that use no randomness (no subsampling): fitted once, their figures stand for every seed.
SEEDLESS = ("logistic regression", "LightGBM", "XGBoost")
FOREST_ROWS = 210_000
# `python -m bench.run --mini`: the same protocol on a small population over 25 days, seconds in all; it
# proves the benchmark runs to its end, its figures mean nothing.
MINI_SPEC = simulator.SimulationSpec(customers=300, terminals=600, train_days=24, test_days=1,
                                     start_date="2018-04-01", seed=0)
MINI_TEST = ("2018-04-21", "2018-04-24")
MINI_SIZES = {"mini": ("mini week (2018-04-06..12)", "2018-04-06", "2018-04-12")}


@dataclass(frozen=True)
class Where:
    """Which dataset and which results file: the real benchmark, or `bench.run --mini`'s miniature."""

    cache: Path = bench_data.CACHE
    mini: bool = False

    @property
    def sizes(self) -> dict[str, tuple[str, str, str]]:
        return MINI_SIZES if self.mini else SIZES

    @property
    def test(self) -> tuple[str, str]:
        return MINI_TEST if self.mini else TEST

    def results(self, size: str) -> Path:
        return self.cache / "quality" / f"{size}.json"


@dataclass(frozen=True)
class Score:
    size: str
    model: str
    seed: int
    auc: float
    ap: float
    cp100: float
    seconds: float


def cluster_dataset(cache: Path = bench_data.CACHE, mini: bool = False) -> Path:
    """The ``cluster`` preset on disk (cached under build/bench), as ``seed`` lays it out."""
    root = cache / ("cluster-mini" if mini else "cluster")
    if (root / MANIFEST).exists():
        return root
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    simulator.generate(tmp, MINI_SPEC if mini else simulator.PRESETS["cluster"])
    write_manifest(tmp)
    tmp.rename(root)
    return root


def _days(data: ds.Dataset, first: str, last: str) -> list[str]:
    return [f["path"] for f in sorted(data.files, key=lambda f: f["first"])
            if f["role"] == "training" and first <= f["first"] and f["last"] <= last]


def default_run(parts: list[tuple[str, ds.Examples]], x_test: np.ndarray, seed: int,
                hp: HParams | None = None) -> np.ndarray:
    """The project's model as the workers train it: day by day, in order, warm-started, each day on its window."""
    hp = dataclasses.replace(hp or HParams(), seed=seed)
    trainer = Trainer("quality", hp, features.FEATURE_NAMES, torch.device("cpu"),
                      feature_version=features.FEATURE_VERSION)
    days = dict(parts)
    for rel, ex in parts:
        window = [days[d] for d in trainer.window(rel)]  # the worker's read_day: earlier applied days, then this one
        trainer.begin_shard(rel, ex.x)
        trainer.train_shard(np.concatenate([w.x for w in window]), np.concatenate([w.y for w in window]),
                            lambda: True)
        trainer.finish_shard({})
    return trainer.score(x_test)


def ensemble_run(parts: list[tuple[str, ds.Examples]], x_test: np.ndarray, seed: int, members: int,
                 hp: HParams | None = None, calibrate_on: ds.Examples | None = None) -> np.ndarray:
    """The ensemble under trial (issue 33, not a preset until it pays): `members` runs of seeds `seed * members`
    onwards, trained packed as a packed worker trains them (`packed.Pack`, day by day, each day on its window), each
    calibrated on `calibrate_on` (the calibration days' rows: Platt, as the worker's `calibration.refit`), scored as
    the mean of their calibrated probabilities. One member is the default run, bit for bit."""
    hp = hp or HParams()
    trainers = [Trainer(f"quality-{i}", dataclasses.replace(hp, seed=seed * members + i), features.FEATURE_NAMES,
                        torch.device("cpu"), feature_version=features.FEATURE_VERSION) for i in range(members)]
    days = dict(parts)
    for rel, ex in parts:
        window = [days[d] for d in trainers[0].window(rel)]  # every member applied the same days: one window
        x, y = np.concatenate([w.x for w in window]), np.concatenate([w.y for w in window])
        for t in trainers:
            t.begin_shard(rel, ex.x)
        if members == 1:
            trainers[0].train_shard(x, y, lambda: True)
        else:
            packed.Pack(trainers, shard_seed).train_shard(x, y, lambda r: True)
        for t in trainers:
            t.finish_shard({})
    if calibrate_on is not None:
        for t in trainers:
            t.set_calibration(*calibration.fit_platt(t.logits(calibrate_on.x), calibrate_on.y))
    return np.mean([t.score(x_test) for t in trainers], axis=0, dtype=np.float64).astype(np.float32)


def baseline(name: str, x: np.ndarray, y: np.ndarray, x_test: np.ndarray, seed: int) -> np.ndarray:
    """One baseline fitted on all the period's rows at once."""
    if name == "logistic regression":
        return baselines.logistic_regression_baseline(x, y, x_test)
    if name == "random forest":
        from sklearn.ensemble import RandomForestClassifier

        # At most FOREST_ROWS rows a tree: all of a week, a quarter of 12 weeks (whose full forest takes ~30 min).
        forest = RandomForestClassifier(n_estimators=100, random_state=seed, n_jobs=-1,
                                        max_samples=min(1.0, FOREST_ROWS / len(y))).fit(x, y)
        return forest.predict_proba(x_test)[:, 1]
    if name == "LightGBM":
        import lightgbm

        return lightgbm.LGBMClassifier(n_estimators=100, random_state=seed, n_jobs=2, verbose=-1, deterministic=True,
                                       force_col_wise=True).fit(x, y).predict_proba(x_test)[:, 1]
    if name == "XGBoost":
        import xgboost

        return xgboost.XGBClassifier(n_estimators=100, tree_method="hist", random_state=seed,
                                     n_jobs=2).fit(x, y).predict_proba(x_test)[:, 1]
    raise ValueError(f"unknown baseline {name!r}; known: {BASELINES}")


def _load(size: str, where: Where) -> dict[str, dict[str, dict]]:
    path = where.results(size)
    return json.loads(path.read_text()) if path.exists() else {}


def _record(size: str, model: str, seed: int, figures: dict, where: Where) -> None:
    """Add one fit's figures to the size's file, read afresh (another size or variant may be running)."""
    results = _load(size, where)
    results.setdefault(model, {})[str(seed)] = figures
    path = where.results(size)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(results, indent=1, sort_keys=True))
    tmp.replace(path)


def measure(size: str, models: list[str], seeds: tuple[int, ...] = SEEDS, variant: str = DEFAULT,
            hp: HParams | None = None, redo: bool = False, where: Where = Where(), ensemble: int = 1) -> None:
    """Fit each of `models` (names of MODELS' values; the default run as `variant` with `hp`, as an `ensemble` of
    that many members when more than 1: `ensemble_run`) with each seed on `size` not measured yet (all of them with
    `redo`), and keep every figure in its results file as soon as it is measured."""
    data = ds.Dataset(cluster_dataset(where.cache, where.mini))
    data.ensure_features()
    test = data.examples(_days(data, *where.test))
    parts = [(rel, data.examples([rel])) for rel in _days(data, *where.sizes[size][1:])]
    x = np.concatenate([ex.x for _, ex in parts])
    y = np.concatenate([ex.y for _, ex in parts])
    calibrate_on = data.examples(calibration.eligible_days(data, [rel for rel, _ in parts])) if ensemble > 1 else None
    for model in models:
        name = variant if model == DEFAULT else model
        fit: Callable[[int], np.ndarray] = (
            (lambda s: ensemble_run(parts, test.x, s, ensemble, hp, calibrate_on)) if model == DEFAULT and ensemble > 1
            else (lambda s: default_run(parts, test.x, s, hp)) if model == DEFAULT else
            (lambda s, model=model: baseline(model, x, y, test.x, s)))
        for seed in seeds:
            if str(seed) in _load(size, where).get(name, {}) and not redo:
                continue  # measured already: `--redo` measures it again
            if model in SEEDLESS and seed != seeds[0]:  # the same fit again: its figures, not its CPU time
                _record(size, name, seed, _load(size, where)[name][str(seeds[0])], where)
                continue
            started = time.perf_counter()
            scores = fit(seed)
            seconds = time.perf_counter() - started
            m = metrics.evaluate(scores, test.y, test.day, test.card, test.known)
            _record(size, name, seed, {
                "auc": m["roc_auc"], "ap": m["average_precision"], "cp100": m["card_precision_top100"],
                "seconds": seconds, "hparams": (hp or HParams()).to_dict() if model == DEFAULT else None,
                **({"ensemble": ensemble} if model == DEFAULT and ensemble > 1 else {})}, where)
            print(f"  {size}: {name} seed {seed}: AP {m['average_precision']:.3f} "
                  f"CP@100 {m['card_precision_top100']:.3f} ({seconds:.0f}s)", flush=True)


def scores(size: str, where: Where = Where()) -> list[Score]:
    """Everything measured so far on `size`."""
    return [Score(size, model, int(seed), r["auc"], r["ap"], r["cp100"], r["seconds"])
            for model, by_seed in _load(size, where).items() for seed, r in sorted(by_seed.items())]


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} [{min(values):.3f}..{max(values):.3f}]"


def verdict(size: str, where: Where = Where(), model: str = DEFAULT) -> tuple[bool, str]:
    """Whether `model`'s mean AP and mean CP@100 are at least those of the best baseline, in words."""
    by_model: dict[str, list[Score]] = {}
    for s in scores(size, where):
        by_model.setdefault(s.model, []).append(s)
    if model not in by_model or not any(b in by_model for b in BASELINES):
        return False, "not measured"
    mean = {m: (statistics.mean(s.ap for s in v), statistics.mean(s.cp100 for s in v)) for m, v in by_model.items()}
    best_ap = max((b for b in BASELINES if b in mean), key=lambda b: mean[b][0])
    best_cp = max((b for b in BASELINES if b in mean), key=lambda b: mean[b][1])
    ap, cp = mean[model]
    wins = ap >= mean[best_ap][0] and cp >= mean[best_cp][1]
    return wins, (f"{'wins' if wins else 'loses'}: AP {ap:.3f} vs {mean[best_ap][0]:.3f} ({best_ap}), "
                  f"CP@100 {cp:.3f} vs {mean[best_cp][1]:.3f} ({best_cp})")


def table(sizes: list[str]) -> str:
    """The quality table: size x model, AP and CP@100 as mean [min..max] over seeds, and a verdict per size."""
    lines = ["| size | model | seeds | AP mean [range] | CP@100 mean [range] | AUC mean | s/fit |",
             "|---|---|---|---|---|---|---|"]
    for size in sizes:
        by_model: dict[str, list[Score]] = {}
        for s in scores(size):
            by_model.setdefault(s.model, []).append(s)
        order = [DEFAULT, *BASELINES, *sorted(set(by_model) - {DEFAULT, *BASELINES})]  # then the variants tried
        for model, v in ((m, by_model[m]) for m in order if m in by_model):
            lines.append(f"| {size} | {model} | {len(v)} | {spread([s.ap for s in v])} | "
                         f"{spread([s.cp100 for s in v])} | {statistics.mean(s.auc for s in v):.3f} | "
                         f"{statistics.mean(s.seconds for s in v):.0f} |")
        lines.append(f"| {size} | **verdict** (default run vs best baseline) | | {verdict(size)[1]} | | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quality", description=__doc__.split("\n\n")[0],
                                     allow_abbrev=False)
    parser.add_argument("--size", choices=[*SIZES, "every"], default="every")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="comma-separated seeds")
    parser.add_argument("--variant", default=DEFAULT, help="name a variant of the default run (with --hparams)")
    parser.add_argument("--hparams", default="{}", help="the variant's hyperparameters, JSON")
    parser.add_argument("--ensemble", type=int, default=1, help="the default run as K members (seeds) trained packed, "
                        "scored as their calibrated mean (a variant under trial; name it with --variant)")
    parser.add_argument("--table", action="store_true", help="only print what was measured so far")
    parser.add_argument("--redo", action="store_true", help="measure again what was measured already")
    args = parser.parse_args(argv)
    sizes = list(SIZES) if args.size == "every" else [args.size]
    if args.ensemble < 1:
        parser.error(f"--ensemble {args.ensemble}: members must be a whole number >= 1")
    variant = f"ensemble of {args.ensemble}" if args.ensemble > 1 and args.variant == DEFAULT else args.variant
    if not args.table:
        hp = HParams.from_dict(json.loads(args.hparams), where="--hparams")
        models = [MODELS[m] for m in args.models.split(",")]
        for size in sizes:
            measure(size, models, tuple(int(x) for x in args.seeds.split(",")), variant, hp, args.redo,
                    ensemble=args.ensemble)
    print(table(sizes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
