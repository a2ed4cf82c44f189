"""Scoring transactions with a trained model: the worker's features, the worker's history rules.

A model is only useful if it can be used: tomorrow's transactions, unlabelled, in the dataset's
``scoring/`` folder. `score` reads the days from the same places `seed` does (a local folder or
``gs://bucket/prefix``, published into a temporary folder by the same code: same validation, same
column mapping and date format), or a dataset already on the share, in place. Every scored day gets
its features from the dataset's earlier days with the same label delay as in training, so a
transaction scored tomorrow gets the features it would get in training, and its own label (if
any) never changes its score.

The model is a ``model.safetensors`` written by `export`, or a run's output folder on the share
(its newest shard-boundary checkpoint, read only). Output: one Parquet or CSV file, or one Parquet
file per scored day when ``--out`` ends in ``/`` (``OUT<day file stem>.parquet``), locally or on
``gs://``; columns (``table``) in the bank's own names: transaction and card IDs as given, the
timestamp in the dataset's zone, score, rank within the calendar day, one column per alert rule.
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from workload.data import dataset as ds
from workload.data import features, publish, schema, source
from workload.data.dayfile import SCORING, TESTING, TRAINING, given_ids, one_line, place
from workload.data.manifest import MANIFEST
from workload.data.reading import AS_IS, Reading
from workload.model import lineage, metrics, report
from workload.model.export import load_model
from workload.model.trainer import Trainer
from workload.share.checkpoint import CheckpointStore
from workload.share.fsutil import atomic_write_bytes

log = logging.getLogger(__name__)

DAYS = {"scoring": (SCORING,), "testing": (TESTING,), "all": (TRAINING, TESTING, SCORING)}
SCORE, RANK = "score", "rank"


class ScoreError(Exception):
    """A model or an input that cannot be scored as asked: one line for the user."""


class OutputUnreachable(Exception):
    """The output bucket could not be written (network, service): an infrastructure fault, exit 3."""


@dataclass(frozen=True)
class Scored:
    """One scored day: its transactions in the file's order (time, then ID), their scores and labels; `given`
    holds the transaction and card IDs as the bank gave them (text or numbers)."""

    rel: str
    ids: np.ndarray
    times: np.ndarray  # datetime64[ns], wall-clock in the dataset's zone (UTC unless declared)
    scores: np.ndarray
    labels: np.ndarray
    cards: np.ndarray
    alerts: dict[str, np.ndarray] = field(default_factory=dict)  # metrics.alert_columns of the scores
    given: dict[str, np.ndarray] = field(default_factory=dict)  # schema.TRANSACTION_ID / CUSTOMER_ID -> as given


def _rank(ids: np.ndarray, scores: np.ndarray, times: np.ndarray) -> np.ndarray:
    """1 for the highest score of its calendar day (the dataset's zone); ties by transaction ID, so the same
    input ranks the same way."""
    days = times.astype("datetime64[D]")
    order = np.lexsort((ids, -scores.astype(np.float64), days))
    ranks = np.empty(len(order), dtype=np.int64)
    first = np.r_[True, days[order][1:] != days[order][:-1]]
    starts = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
    ranks[order] = np.arange(len(order)) - starts + 1
    return ranks


def _given(days: list[Scored], column: str, fallback: str) -> pa.Array:
    """A column of IDs as the bank gave them: numbers stay int64; any text makes the whole column text."""
    parts = [d.given.get(column, getattr(d, fallback)) for d in days]
    values = np.concatenate(parts) if parts else np.array([], dtype=np.int64)
    if values.dtype == object:
        return pa.array([str(v) for v in values], pa.string())
    return pa.array(values, pa.int64())


def table(days: list[Scored], reading: Reading = AS_IS) -> pa.Table:
    """What `score` writes, in the bank's names: transaction ID, card ID, timestamp (in the dataset's zone),
    score, rank within the calendar day, then one column per alert rule of the model."""
    cat = (lambda name: np.concatenate([getattr(d, name) for d in days])) if days else (lambda name: np.array([]))
    times, ids, scores = cat("times").astype("datetime64[ns]"), cat("ids").astype(np.int64), cat("scores")
    zone = reading.day_zone()
    stamps = pd.Series(times).dt.tz_localize(zone, ambiguous=True, nonexistent="shift_forward")
    columns = {reading.source_of(schema.TRANSACTION_ID): _given(days, schema.TRANSACTION_ID, "ids"),
               reading.source_of(schema.CUSTOMER_ID): _given(days, schema.CUSTOMER_ID, "cards"),
               reading.source_of(schema.TX_DATETIME): pa.array(stamps, pa.timestamp("ns", tz=zone)),
               SCORE: pa.array(scores.astype(np.float32), pa.float32()),
               RANK: pa.array(_rank(ids, scores, times), pa.int64())}
    alerts = {name: pa.array(np.concatenate([d.alerts[name] for d in days]), pa.bool_())
              for name in (days[0].alerts if days else {})}
    return pa.table({**columns, **alerts})


# -- the model ------------------------------------------------------------------------------------
def load(model: Path) -> Trainer:
    """The exported model file, or the newest shard-boundary checkpoint of a run's output folder."""
    model = Path(model)
    if not model.is_dir():
        return load_model(model)
    loaded = lineage.newest_boundary(CheckpointStore(model))
    if loaded is None:
        raise ScoreError(f"--model {model}: no checkpoint with a finished day under {model / 'checkpoints'}; "
                         "give a run's output folder (SHARE/output/RUN) or an exported model.safetensors")
    return loaded.state.trainer(torch.device("cpu"))


# -- the data -------------------------------------------------------------------------------------
def open_dataset(src: str, tmp: Path, reading: Reading) -> ds.Dataset:
    """The dataset at `src`: read in place when it is one on the share (it has a manifest), else
    published from the folder or bucket into `tmp` by `seed`'s code (the user's folder is never
    written to); errors name the user's files, never `tmp`."""
    if not src.startswith(source.GS) and (Path(src) / MANIFEST).is_file():
        data = ds.Dataset(Path(src))
        if reading != AS_IS and reading != data.reading:
            raise ScoreError(f"--datasets {src}: a dataset on the share is read as published "
                             f"({data.reading.describe()}); leave out --columns and --datetime-format")
        return data
    publishing = logging.getLogger(publish.__name__)
    level = publishing.level
    publishing.setLevel(logging.WARNING)  # "published into <tmp>" would name the temporary copy
    try:  # its warnings name `src`, never the copy ("dataset dataset: ..." told the user nothing)
        outcome = publish.publish(tmp / "dataset", source.open_source(src), reading, required=(), called=src)
    finally:
        publishing.setLevel(level)
    log.info("read %d file(s) from %s", len(outcome.copied), src)
    return ds.Dataset(outcome.root)


def score_days(trainer: Trainer, data: ds.Dataset, roles: tuple[str, ...], src: str) -> list[Scored]:
    """Every day of `roles`, in time order, featurised over the whole dataset's history and scored."""
    targets = [f["path"] for f in sorted(data.files, key=lambda f: (place(f), f["path"])) if f["role"] in roles]
    if not targets:
        raise ScoreError(f"--datasets {src}: no {' or '.join(r + '/' for r in roles)} days to score")
    out = []
    for rel in targets:
        examples = data.examples([rel])
        rows = data.transactions(rel).set_index(schema.TRANSACTION_ID).loc[examples.ids]
        given = {c: given_ids(rows.reset_index(), c) for c in (schema.TRANSACTION_ID, schema.CUSTOMER_ID)
                 if schema.AS_GIVEN[c] in rows.reset_index().columns}
        scores = trainer.score(examples.x)
        out.append(Scored(rel=rel, ids=examples.ids, times=rows[schema.TX_DATETIME].to_numpy(), scores=scores,
                          labels=examples.y, cards=examples.card,
                          alerts=metrics.alert_columns(trainer.history, scores), given=given))
    return out


def check_history(data: ds.Dataset, roles: tuple[str, ...], allow_short: bool) -> None:
    """A scored day gets its features from the LOOKBACK_DAYS before it: with less history its scores are not
    the ones it would get in training (tomorrow's file alone scored AP 0.31 against 0.77 with its history).
    No earlier day at all is refused unless --allow-short-history; a shorter history than the window is
    warned of in one line naming the shortfall."""
    first = min((pd.Timestamp(f["first"]) for f in data.files), default=None)
    targets = sorted(pd.Timestamp(place(f)) for f in data.files if f["role"] in roles)
    if first is None or not targets or (targets[0] - first).days >= features.LOOKBACK_DAYS:
        return
    have = (targets[0] - first).days
    message = (f"the first scored day {targets[0].date()} has {have} day(s) of history before it; its features look "
               f"back {features.LOOKBACK_DAYS} days (features.LOOKBACK_DAYS): give the dataset's earlier days "
               "(history/, training/) with the days to score")
    if have == 0 and not allow_short:
        raise ScoreError(f"--datasets: {message}, or pass --allow-short-history to score it anyway")
    log.warning("scoring with short history: %s", message)


# -- the output -----------------------------------------------------------------------------------
def _parquet(t: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(t, buf)
    return buf.getvalue()


FORMATS = (".parquet", ".csv")


def check_out(out: str) -> None:
    """--out is a .parquet or .csv file, or a folder ending in / (checked before any work)."""
    if not out.endswith("/") and not out.lower().endswith(FORMATS):
        raise ScoreError(f"--out {out}: give a file ending in .parquet or .csv, or a folder ending in / (one Parquet "
                         "file per day)")


def _encode(t: pa.Table, where: str, reading: Reading) -> bytes:
    if where.lower().endswith(".csv"):
        dialect = reading.dialect
        return t.to_pandas().to_csv(index=False, sep=dialect.separator, decimal=dialect.decimal).encode(
            dialect.encoding)
    return _parquet(t)


def outputs(out: str, days: list[Scored], reading: Reading = AS_IS) -> dict[str, bytes]:
    """Where each file goes: `out` itself, or one file per day under a folder (`out` ends in '/')."""
    check_out(out)
    if out.endswith("/"):
        return {f"{out}{PurePosixPath(d.rel).stem}.parquet": _parquet(table([d], reading)) for d in days}
    return {out: _encode(table(days, reading), out, reading)}


def write(files: dict[str, bytes]) -> None:
    """Each file atomically on disk, or as one object upload each on gs://."""
    for where, data in files.items():
        if where.startswith(source.GS):
            _upload(where, data)
            continue
        try:
            Path(where).parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(Path(where), data)
            os.chmod(where, 0o644)
        except OSError as exc:
            raise ScoreError(f"--out {where}: cannot write it ({exc.strerror or exc})") from None


def _upload(uri: str, data: bytes) -> None:
    from google.api_core import exceptions as gexc

    from workload.model.export import ExportError, parse_gs_uri, storage_client

    try:
        bucket, name = parse_gs_uri(uri)
        storage_client().bucket(bucket).blob(name).upload_from_string(data, content_type="application/octet-stream")
    except ExportError as exc:
        raise ScoreError(f"--out {exc}") from None
    except (gexc.Forbidden, gexc.Unauthorized, gexc.NotFound) as exc:
        raise ScoreError(f"--out {uri}: Cloud Storage refused it ({type(exc).__name__}: "
                         f"{getattr(exc, 'message', exc)}); the scorer needs objectCreator on that prefix") from None
    except Exception as exc:  # noqa: BLE001 - network, service: the bucket is unreachable, not the input wrong
        raise OutputUnreachable(f"--out {uri}: cannot upload ({type(exc).__name__}: {one_line(exc)})") from None


def score_dataset(model: Path, src: str, out: str, days: str = "scoring", reading: Reading = AS_IS,
                  allow_short_history: bool = False) -> dict[str, float]:
    """Score `days` of the dataset at `src` with `model`; write `out`. Returns the figures of
    `metrics.evaluate` against the labels of the scored days (empty when they have none)."""
    if days not in DAYS:
        raise ScoreError(f"--days {days!r} is not allowed; allowed: {', '.join(DAYS)}")
    check_out(str(out))
    trainer = load(model)
    if trainer.feature_names != features.FEATURE_NAMES:
        raise ScoreError(f"--model {model} was trained on features {list(trainer.feature_names)}; this code "
                         f"computes {list(features.FEATURE_NAMES)}: score with the code version that trained it")
    if trainer.feature_version != features.FEATURE_VERSION:  # same names, other arithmetic: scores would be wrong
        raise ScoreError(f"--model {model} was trained on feature version {trainer.feature_version!r}; this "
                         f"code computes version {features.FEATURE_VERSION!r}: score with the code version that "
                         "trained it")
    with tempfile.TemporaryDirectory(prefix="score-") as tmp:
        data = open_dataset(str(src), Path(tmp), reading)
        check_history(data, DAYS[days], allow_short_history)
        scored = score_days(trainer, data, DAYS[days], str(src))
    files = outputs(str(out), scored, data.reading)
    write(files)
    rows = sum(len(d.ids) for d in scored)
    log.info("scored %d transactions of %d day(s) with the model of run %r (%d day(s) trained); wrote %s", rows,
             len(scored), trainer.run, len(trainer.applied), ", ".join(files) if len(files) <= 3 else
             f"{len(files)} files under {out}")
    if scored and scored[0].alerts:  # the rules' thresholds, with their precision and recall on the test days
        log.info("alert columns, from the model's test days:\n%s",
                 "\n".join(report.alert_lines(trainer.history[-1]["alerts"])))
    labels = np.concatenate([d.labels for d in scored])
    if labels.sum() == 0:
        return {}
    figures = metrics.evaluate(np.concatenate([d.scores for d in scored]), labels,
                               np.concatenate([d.times for d in scored]).astype("datetime64[D]"),
                               np.concatenate([d.cards for d in scored]))
    log.info("against the labels in %s: %s", src, report.figures_line(figures))
    return figures

