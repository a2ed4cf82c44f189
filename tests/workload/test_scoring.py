"""Scoring tomorrow's transactions: unlabelled scoring/ days (label column absent, or present and empty)
get exactly the scores they would get as labelled testing days, from a local folder, from a dataset on
the share they were appended to, and from gs:// on a real Cloud Storage API server."""

from __future__ import annotations

import socket
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from exports import BANK_COLUMNS, bank_export, copy_files, write_mapping

from workload import cli
from workload.data import dataset as ds
from workload.data import features, publish, schema
from workload.data.reading import Reading
from workload.data.source import LocalSource
from workload.model.export import MODEL_FILE, model_bytes
from workload.model.hparams import HParams
from workload.model.trainer import Trainer

pytestmark = pytest.mark.timeout(300)
TOMORROW = "testing/2018-04-08.parquet"  # scored as a testing day, and as tomorrow's scoring/ day
OUT_COLUMNS = [schema.TRANSACTION_ID, schema.TX_DATETIME, "score", "rank"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory, dataset_src: Path) -> Path:
    """A small model trained on the training days, as `export` writes it."""
    data = ds.Dataset(dataset_src)
    trainer = Trainer("main", HParams(epochs=2, hidden=(8,)), features.FEATURE_NAMES,
                      feature_version=features.FEATURE_VERSION)
    for shard in data.training_shards():
        ex = data.examples([shard])
        trainer.begin_shard(shard, ex.x)
        trainer.train_shard(ex.x, ex.y, lambda: True)
        trainer.finish_shard({})
    path = tmp_path_factory.mktemp("model") / MODEL_FILE
    path.write_bytes(model_bytes(trainer.state_dict()))
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(list(args))
    return code, capsys.readouterr().err


def as_testing(model: Path, dataset_src: Path, tmp_path: Path, capsys) -> pd.DataFrame:
    """Tomorrow's rows scored with their labels, as a testing day of the canonical files."""
    code, err = run(capsys, "score", "--model", str(model), "--datasets", str(dataset_src), "--days", "testing",
                    "--out", str(tmp_path / "testing.parquet"))
    assert code == 0, err
    assert "against the labels in" in err, "labelled days also get AP and CP@100"
    scored = pd.read_parquet(tmp_path / "testing.parquet")
    tomorrow = pd.read_parquet(dataset_src / TOMORROW)[schema.TRANSACTION_ID]
    return scored[scored[schema.TRANSACTION_ID].isin(tomorrow)].reset_index(drop=True)


def tomorrow_as_scoring(rel: str) -> str:
    return "scoring" if rel == TOMORROW else rel.split("/")[0]


def same_scores(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert list(got.columns) == OUT_COLUMNS
    got = got.sort_values(schema.TRANSACTION_ID, ignore_index=True)
    expected = expected.sort_values(schema.TRANSACTION_ID, ignore_index=True)
    np.testing.assert_array_equal(got[schema.TRANSACTION_ID], expected[schema.TRANSACTION_ID])
    np.testing.assert_array_equal(got["score"].to_numpy(), expected["score"].to_numpy())  # bit for bit
    pd.testing.assert_series_equal(got[schema.TX_DATETIME], expected[schema.TX_DATETIME])


@pytest.mark.parametrize("label", ["absent", "empty"])
def test_an_unlabelled_day_scores_as_it_would_as_a_testing_day(model: Path, dataset_src: Path, tmp_path: Path,
                                                               capsys, label: str) -> None:
    expected = as_testing(model, dataset_src, tmp_path, capsys)
    export = bank_export(dataset_src, tmp_path / "export", role_of=tomorrow_as_scoring, label=label)
    header = (export / "scoring" / "2018-04-08.csv").read_text().splitlines()[0].split(",")
    assert ("is_fraud" in header) == (label == "empty")
    code, err = run(capsys, "score", "--model", str(model), "--datasets", str(export), "--columns",
                    str(write_mapping(tmp_path / "columns.yaml")), "--out", str(tmp_path / "out" / "scores.parquet"))
    assert code == 0, err
    got = pd.read_parquet(tmp_path / "out" / "scores.parquet")
    same_scores(got, expected)
    assert str(got[schema.TX_DATETIME].dt.tz) == "UTC"
    assert "against the labels" not in err, "no labels, no figures"
    assert sorted(p.name for p in export.rglob("*")) == sorted(p.name for p in export.rglob("*")
                                                               if p.suffix == ".csv" or p.is_dir()), "nothing written"
    top = got.loc[got["score"].idxmax()]
    assert top["rank"] == 1 and sorted(got["rank"]) == list(range(1, len(got) + 1))


def test_a_scoring_day_appended_on_the_share_scores_in_place_and_per_day(model: Path, dataset_src: Path,
                                                                         tmp_path: Path, capsys) -> None:
    expected = as_testing(model, dataset_src, tmp_path, capsys)
    reading = Reading(columns=tuple(sorted(BANK_COLUMNS.items())))
    folder = bank_export(dataset_src, tmp_path / "export", keep=lambda rel: rel != TOMORROW)
    root = tmp_path / "share" / "datasets" / "bank"
    publish.publish(root, LocalSource(folder), reading)
    bank_export(dataset_src, folder, keep=lambda rel: rel == TOMORROW, role_of=tomorrow_as_scoring, label="absent")
    grown = publish.publish(root, LocalSource(folder), reading)
    assert grown.copied == ["scoring/2018-04-08.csv"], "tomorrow is appended like any new day"
    manifest = ds.read_manifest(root)
    entry = next(e for e in manifest["files"] if e["role"] == "scoring")
    assert (entry["frauds"], entry["rows"]) == (0, len(expected))
    assert manifest["reading"]["columns"] == BANK_COLUMNS, "the mapping is part of the dataset on the share"
    code, err = run(capsys, "score", "--model", str(model), "--datasets", str(root), "--out", f"{tmp_path}/per-day/")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "per-day").iterdir()) == ["2018-04-08.parquet"]
    same_scores(pd.read_parquet(tmp_path / "per-day" / "2018-04-08.parquet"), expected)
    assert ds.Dataset(root).training_shards() == [f"training/2018-04-0{d}.csv" for d in range(1, 7)], \
        "a scoring day is never trained on"


# -- from and to a bucket, on a real Cloud Storage API server -------------------------------------------
@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    from gcp_storage_emulator.server import create_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="acme")
    server.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from google.cloud import storage
    try:
        yield storage.Client(project=None).bucket("acme")
    finally:
        server.stop()


def test_scoring_days_in_a_bucket_are_scored_into_the_bucket(model: Path, dataset_src: Path, tmp_path: Path,
                                                             capsys, bucket) -> None:
    expected = as_testing(model, dataset_src, tmp_path, capsys)
    export = bank_export(dataset_src, tmp_path / "export", role_of=tomorrow_as_scoring, label="empty")
    for path in sorted(export.glob("*/*")):
        bucket.blob(f"exports/{path.parent.name}/{path.name}").upload_from_filename(str(path))
    code, err = run(capsys, "score", "--model", str(model), "--datasets", "gs://acme/exports", "--columns",
                    str(write_mapping(tmp_path / "columns.yaml")), "--out", "gs://acme/scores/")
    assert code == 0, err
    (tmp_path / "got.parquet").write_bytes(bucket.blob("scores/2018-04-08.parquet").download_as_bytes())
    same_scores(pd.read_parquet(tmp_path / "got.parquet"), expected)
    assert "/tmp" not in err.replace(str(tmp_path), ""), "messages name the bucket, never the staging copy"


def test_score_errors_name_the_users_file_never_the_staging_copy(model: Path, dataset_src: Path, tmp_path: Path,
                                                                capsys) -> None:
    export = bank_export(dataset_src, tmp_path / "export", role_of=tomorrow_as_scoring, label="absent")
    bad = export / "scoring" / "2018-04-08.csv"
    bad.write_text(bad.read_text().replace("+02:00", "+02:00 CEST", 1))
    code, err = run(capsys, "score", "--model", str(model), "--datasets", str(export), "--columns",
                    str(write_mapping(tmp_path / "columns.yaml")), "--out", str(tmp_path / "s.parquet"))
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert code == 2 and len(errors) == 1, err
    assert f"dataset problem: {bad}: column TX_DATETIME has an unparseable timestamp" in errors[0]
    assert "score-" not in errors[0] and not (tmp_path / "s.parquet").exists()


def test_score_refuses_a_symbolic_link_in_the_folder(model: Path, dataset_src: Path, tmp_path: Path, capsys) -> None:
    folder = copy_files(dataset_src, tmp_path / "export", role_of=tomorrow_as_scoring)
    secret = tmp_path / "secret.csv"
    secret.write_text("password,hunter2\n")
    (folder / "scoring" / "2018-04-09.csv").symlink_to(secret)
    code, err = run(capsys, "score", "--model", str(model), "--datasets", str(folder), "--out",
                    str(tmp_path / "s.parquet"))
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert code == 2 and len(errors) == 1, err
    assert f"{folder / 'scoring' / '2018-04-09.csv'}: a symbolic link in the dataset folder" in errors[0]
    assert "hunter2" not in err


def test_a_model_from_a_runs_output_folder_scores_like_its_export(model: Path, dataset_src: Path,
                                                                  tmp_path: Path, capsys) -> None:
    """A run folder on the share: its newest finished checkpoint is read, nothing is written there."""
    from workload.model.export import load_model
    from workload.share.checkpoint import CheckpointStore

    trainer = load_model(model)
    store = CheckpointStore(tmp_path / "output" / "main")
    assert store.fence(1)
    assert store.save(trainer.state_dict(), path=store.next_path(1), may_promote=lambda: True)
    before = sorted(str(p) for p in (tmp_path / "output").rglob("*"))
    code, err = run(capsys, "score", "--model", str(tmp_path / "output" / "main"), "--datasets", str(dataset_src),
                    "--days", "testing", "--out", str(tmp_path / "a.parquet"))
    assert code == 0, err
    code, err = run(capsys, "score", "--model", str(model), "--datasets", str(dataset_src), "--days", "testing",
                    "--out", str(tmp_path / "b.parquet"))
    assert code == 0, err
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a.parquet"), pd.read_parquet(tmp_path / "b.parquet"))
    assert sorted(str(p) for p in (tmp_path / "output").rglob("*")) == before


def test_an_unlabelled_days_features_read_every_earlier_day_with_the_label_delay(model: Path, dataset_src: Path,
                                                                                 tmp_path: Path, capsys) -> None:
    """Checked without the dataset's windows: every day's rows at once, the feature code alone, tomorrow's
    labels unknown (zero). What `score` writes for tomorrow is that, bit for bit."""
    from workload.model.export import load_model

    frames = [ds.read_transactions(p) for p in sorted(dataset_src.glob("*/*.parquet"))]
    everything = pd.concat(frames).sort_values([schema.TX_DATETIME, schema.TRANSACTION_ID], ignore_index=True)
    tomorrow = everything[schema.TRANSACTION_ID].isin(pd.read_parquet(dataset_src / TOMORROW)[schema.TRANSACTION_ID])
    everything.loc[tomorrow, schema.TX_FRAUD] = 0
    computed = features.compute(everything, tomorrow.to_numpy())
    expected = pd.DataFrame({schema.TRANSACTION_ID: computed["ids"], "score": load_model(model).score(computed["x"])})
    export = bank_export(dataset_src, tmp_path / "export", role_of=tomorrow_as_scoring, label="absent")
    code, err = run(capsys, "score", "--model", str(model), "--datasets", str(export), "--columns",
                    str(write_mapping(tmp_path / "columns.yaml")), "--out", str(tmp_path / "s.parquet"))
    assert code == 0, err
    got = pd.read_parquet(tmp_path / "s.parquet").sort_values(schema.TRANSACTION_ID, ignore_index=True)
    expected = expected.sort_values(schema.TRANSACTION_ID, ignore_index=True)
    np.testing.assert_array_equal(got[schema.TRANSACTION_ID], expected[schema.TRANSACTION_ID])
    np.testing.assert_array_equal(got["score"].to_numpy(), expected["score"].to_numpy())
