"""Scoring transactions with an exported model: the worker's features, the worker's history rules.

A model is only useful if it can be used. `score` reads a dataset folder exactly as the worker
does (the same reader and validation, the same `Dataset.examples` windows over earlier days, so a
transaction's features are the ones it would have had in training or evaluation), scores the
chosen days with the model file `export` wrote, and writes a Parquet of `TRANSACTION_ID, score`.

By default the `testing/` days are scored and every other day only feeds the feature windows;
`days="all"` scores every training and testing day.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from workload.data import dataset as ds
from workload.data import features, schema
from workload.model import metrics, report
from workload.model.export import load_model
from workload.share.fsutil import atomic_write_bytes

log = logging.getLogger(__name__)

DAYS = ("testing", "all")
SCORE = "score"


class ScoreError(Exception):
    """A model or an input that cannot be scored as asked: one line for the user."""


def stage(src: Path, tmp: Path) -> ds.Dataset:
    """The dataset at `src` as the worker reads it: a folder with a manifest (a dataset on the share)
    is read in place; any other folder is copied (the user's folder is never written to) and
    validated by the same code `seed` uses."""
    if str(src).startswith("gs://"):
        raise ScoreError(f"--datasets {src}: score reads a local folder; copy the days first "
                         f"(gcloud storage cp -r {src} ./data) and pass that folder")
    if (src / ds.MANIFEST).is_file():
        return ds.Dataset(src)
    if not src.is_dir():
        raise ScoreError(f"--datasets {src}: no such folder")
    for role in ds.ROLES:
        folder = src / role
        if not folder.is_dir():
            continue
        (tmp / role).mkdir(parents=True)
        for f in sorted(folder.iterdir()):
            if f.is_file() and not f.name.startswith("."):
                ds.check_suffix(f)
                shutil.copyfile(f, tmp / role / f.name)
    ds.write_manifest(tmp)
    return ds.Dataset(tmp)


def score_dataset(model_path: Path, src: Path, out: Path, days: str = "testing") -> dict[str, float]:
    """Score `days` of the dataset at `src` with the model at `model_path`; write `out`.

    Returns the figures of `metrics.evaluate` against the labels in the files (meaningful when
    they hold real labels, as the test days of a dataset do)."""
    if days not in DAYS:
        raise ScoreError(f"--days {days!r} is not allowed; allowed: {', '.join(DAYS)}")
    trainer = load_model(model_path)
    if trainer.feature_names != features.FEATURE_NAMES:
        raise ScoreError(f"--model {model_path} was trained on features {list(trainer.feature_names)}; this code "
                         f"computes {list(features.FEATURE_NAMES)}: score with the code version that trained it")
    with tempfile.TemporaryDirectory(prefix="score-") as tmp:
        data = stage(Path(src), Path(tmp))
        roles = ("testing",) if days == "testing" else ("training", "testing")
        targets = [f["path"] for f in data.files if f["role"] in roles]
        if not targets:
            raise ScoreError(f"--datasets {src}: no {' or '.join(roles)} days to score")
        examples = data.examples(targets)
    scores = trainer.score(examples.x)
    alerts = metrics.alert_columns(trainer.history, scores)  # the newest model's alert rules, per row
    table = pa.table({schema.TRANSACTION_ID: pa.array(examples.ids, pa.int64()),
                      SCORE: pa.array(scores, pa.float32()), **{k: pa.array(v) for k, v in alerts.items()}})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    try:
        atomic_write_bytes(out, buf.getvalue())
        os.chmod(out, 0o644)
    except OSError as exc:
        raise ScoreError(f"--out {out}: cannot write it ({exc.strerror or exc})") from exc
    figures = metrics.evaluate(scores, examples.y, examples.day, examples.card)
    log.info("scored %d transactions of %d file(s) with run %r's model (%d day(s) trained); wrote %s", len(scores),
             len(targets), trainer.run, len(trainer.applied), out)
    if examples.y.sum() > 0:
        log.info("against the labels in %s: %s", src, report.figures_line(figures))
    return figures

