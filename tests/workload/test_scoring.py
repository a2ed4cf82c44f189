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
from workload.data.dayfile import read_transactions
from workload.data.manifest import read_manifest
from workload.data.reading import Reading
from workload.data.rules import history_shortfall
from workload.data.source import LocalSource
from workload.model.export import MODEL_FILE, model_bytes
from workload.model.hparams import HParams
from workload.model.lineage import checkpoint_of
from workload.model.trainer import Trainer

pytestmark = pytest.mark.timeout(300)
TOMORROW = "testing/2018-04-08.parquet"  # scored as a testing day, and as tomorrow's scoring/ day
OUT_COLUMNS = [schema.TRANSACTION_ID, schema.CUSTOMER_ID, schema.TX_DATETIME, "score", "rank"]


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
    path.write_bytes(model_bytes(checkpoint_of(trainer)))
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
    got = got.rename(columns=BANK_COLUMNS)  # a bank's export is scored under its own names
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
    assert list(got.columns) == ["tx_id", "card_id", "ts", "score", "rank"]  # the bank's own names
    same_scores(got, expected)
    assert str(got["ts"].dt.tz) == "UTC"
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
    manifest = read_manifest(root)
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
    assert f"dataset problem: {bad}: column ts has an unparseable timestamp" in errors[0]  # the bank's name
    assert "score-" not in errors[0] and not (tmp_path / "s.parquet").exists()


def test_score_warnings_name_the_users_folder_never_the_staging_copy(model: Path, dataset_src: Path, tmp_path: Path,
                                                                    capsys) -> None:
    """A folder with no history/ days: the shortened feature windows are the user's to fix, in their folder. The
    warning named the temporary copy's folder ("dataset dataset: ..."), which told them nothing."""
    folder = copy_files(dataset_src, tmp_path / "export")
    code, err = run(capsys, "score", "--model", str(model), "--datasets", str(folder), "--days", "testing",
                    "--out", str(tmp_path / "s.parquet"))
    assert code == 0, err
    shortfall = history_shortfall(ds.Dataset(dataset_src).files)
    assert shortfall and shortfall.endswith("put earlier days in history/ to give them full history")
    assert said(err, "WARNING", publish.__name__) == [f"{folder}: {shortfall}"]


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
    assert store.save(checkpoint_of(trainer), path=store.next_path(1), may_promote=lambda: True, boundary=True)
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

    frames = [read_transactions(p) for p in sorted(dataset_src.glob("*/*.parquet"))]
    everything = pd.concat(frames).sort_values([schema.TX_DATETIME, schema.TRANSACTION_ID], ignore_index=True)
    tomorrow = everything[schema.TRANSACTION_ID].isin(pd.read_parquet(dataset_src / TOMORROW)[schema.TRANSACTION_ID])
    everything.loc[tomorrow, schema.TX_FRAUD] = 0
    computed = features.compute(everything, tomorrow.to_numpy())
    expected = pd.DataFrame({schema.TRANSACTION_ID: computed["ids"], "score": load_model(model).score(computed["x"])})
    export = bank_export(dataset_src, tmp_path / "export", role_of=tomorrow_as_scoring, label="absent")
    code, err = run(capsys, "score", "--model", str(model), "--datasets", str(export), "--columns",
                    str(write_mapping(tmp_path / "columns.yaml")), "--out", str(tmp_path / "s.parquet"))
    assert code == 0, err
    got = pd.read_parquet(tmp_path / "s.parquet").rename(columns=BANK_COLUMNS)
    got = got.sort_values(schema.TRANSACTION_ID, ignore_index=True)
    expected = expected.sort_values(schema.TRANSACTION_ID, ignore_index=True)
    np.testing.assert_array_equal(got[schema.TRANSACTION_ID], expected[schema.TRANSACTION_ID])
    np.testing.assert_array_equal(got["score"].to_numpy(), expected["score"].to_numpy())


# -- in this process, so `make mutation` selects them for score.py's code ----------------------------------
def said(err: str, level: str = "INFO", logger: str = "workload.model.score") -> list[str]:
    """The messages `logger` logged at `level` (first lines), in order."""
    mark = f" {level} {logger}: "
    return [line.split(mark, 1)[1] for line in err.splitlines() if mark in line]


def error_line(err: str) -> str:
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert len(errors) == 1, err
    return errors[0].split(": ", 1)[1]


def expected_figures(scored: pd.DataFrame, src: Path) -> dict[str, float]:
    """`metrics.evaluate` of the written scores against the day files' labels, days and cards."""
    from workload.model import metrics

    truth = pd.concat(read_transactions(p) for p in sorted(src.glob("*/*.parquet")))
    rows = scored.merge(truth[[schema.TRANSACTION_ID, schema.TX_FRAUD]], on=schema.TRANSACTION_ID,
                        how="left", validate="one_to_one")
    return metrics.evaluate(rows["score"].to_numpy(), rows[schema.TX_FRAUD].to_numpy(),
                            rows[schema.TX_DATETIME].dt.tz_convert(None).to_numpy().astype("datetime64[D]"),
                            rows[schema.CUSTOMER_ID].to_numpy())


def test_score_dataset_scores_the_scoring_days_by_default_and_needs_no_testing_days(model: Path, dataset_src: Path,
                                                                                     tmp_path: Path) -> None:
    """A user's folder of training history and tomorrow's day (no testing/): the default scores tomorrow only,
    and the figures returned are `metrics.evaluate`'s against tomorrow's labels."""
    from workload.model import score

    folder = copy_files(dataset_src, tmp_path / "export", keep=lambda rel: rel != "testing/2018-04-07.parquet",
                        role_of=tomorrow_as_scoring)
    assert sorted(p.name for p in folder.iterdir()) == ["scoring", "training"]
    figures = score.score_dataset(model, str(folder), str(tmp_path / "s.parquet"))
    scored = pd.read_parquet(tmp_path / "s.parquet")
    tomorrow = pd.read_parquet(dataset_src / TOMORROW)[schema.TRANSACTION_ID]
    assert sorted(scored[schema.TRANSACTION_ID]) == sorted(tomorrow)
    want = expected_figures(scored, dataset_src)
    assert sorted(figures) == sorted(want)
    np.testing.assert_equal(figures, want)
    with pytest.raises(score.ScoreError) as refused:
        score.score_dataset(model, str(folder), str(tmp_path / "t.parquet"), days="training")
    assert str(refused.value) == "--days 'training' is not allowed; allowed: scoring, testing, all"
    assert not (tmp_path / "t.parquet").exists()


def test_score_says_what_it_scored_and_wrote_and_its_figures_against_the_labels(model: Path, dataset_src: Path,
                                                                                 tmp_path: Path, capsys) -> None:
    """`--days testing` on a dataset on the share, into a folder that does not exist yet: one line of what was
    scored, one of the figures; a file anyone may read; ranks 1.. within each day, ties by transaction ID."""
    import stat

    from workload.model import report

    out = tmp_path / "new" / "deeper" / "scores.parquet"
    code, err = run(capsys, "score", "--model", str(model), "--datasets", str(dataset_src), "--days", "testing",
                    "--out", str(out))
    assert code == 0, err
    scored = pd.read_parquet(out)
    testing = [pd.read_parquet(p) for p in sorted((dataset_src / "testing").glob("*.parquet"))]
    assert sorted(scored[schema.TRANSACTION_ID]) == sorted(pd.concat(testing)[schema.TRANSACTION_ID])
    assert said(err) == [
        f"scored {len(scored)} transactions of 2 day(s) with the model of run 'main' (6 day(s) trained); wrote {out}",
        f"against the labels in {dataset_src}: {report.figures_line(expected_figures(scored, dataset_src))}"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert scored[schema.TX_DATETIME].dtype == "datetime64[ns, UTC]" and scored["rank"].dtype == np.int64
    for day in scored.groupby(scored[schema.TX_DATETIME].dt.date):
        frame = day[1].assign(negative=-day[1]["score"].astype(np.float64))
        ranked = frame.sort_values(["negative", schema.TRANSACTION_ID])["rank"]
        assert list(ranked) == list(range(1, len(frame) + 1))


def test_a_model_with_alert_rules_adds_a_boolean_column_per_rule(model: Path, dataset_src: Path, tmp_path: Path,
                                                                  capsys) -> None:
    """The newest history entry's thresholds, as the report gives them: a transaction alerts when its score
    is at or above the rule's threshold; the rules are printed; one file per day has them too."""
    from workload.model import metrics, report
    from workload.model.export import load_model

    code, err = run(capsys, "score", "--model", str(model), "--datasets", str(dataset_src), "--days", "testing",
                    "--out", str(tmp_path / "plain.parquet"))
    assert code == 0, err
    plain = pd.read_parquet(tmp_path / "plain.parquet")
    assert list(plain.columns) == OUT_COLUMNS, "a model without alert rules: no alert columns"
    truth = pd.concat(read_transactions(p) for p in sorted((dataset_src / "testing").glob("*.parquet")))
    rows = plain.merge(truth, on=schema.TRANSACTION_ID, suffixes=("", "_truth"))
    alerts = metrics.alert_thresholds(rows["score"].to_numpy(), rows[schema.TX_FRAUD].to_numpy(),
                                      rows[schema.TX_DATETIME].dt.tz_convert(None).to_numpy(),
                                      rows[schema.CUSTOMER_ID].to_numpy())
    state = checkpoint_of(load_model(model))
    state["history"][-1] = {**state["history"][-1], "alerts": alerts}
    alerting = tmp_path / "alerting" / MODEL_FILE
    alerting.parent.mkdir()
    alerting.write_bytes(model_bytes(state))
    code, err = run(capsys, "score", "--model", str(alerting), "--datasets", str(dataset_src), "--days", "testing",
                    "--out", f"{tmp_path}/per-day/")
    assert code == 0, err
    assert "alert columns, from the model's test days:\n" + "\n".join(report.alert_lines(alerts)) in err
    days = [pd.read_parquet(tmp_path / "per-day" / f"2018-04-0{d}.parquet") for d in (7, 8)]
    for got in days:
        assert list(got.columns) == [*OUT_COLUMNS, "alert_top100_cards", "alert_1pct_fpr"]
        for rule, column in (("top100_cards", "alert_top100_cards"), ("fpr_1pct", "alert_1pct_fpr")):
            assert got[column].dtype == bool
            expected = got["score"].astype(np.float64) >= alerts[rule]["threshold"]
            assert list(got[column]) == list(expected), column
    every = pd.concat(days)
    assert every["alert_top100_cards"].any() and not every["alert_top100_cards"].all(), "a threshold that splits"
    pd.testing.assert_frame_equal(every[OUT_COLUMNS].sort_values(schema.TRANSACTION_ID, ignore_index=True),
                                  plain.sort_values(schema.TRANSACTION_ID, ignore_index=True), check_exact=True)


def test_an_empty_table_has_the_output_columns() -> None:
    from workload.model import score

    empty = score.table([])
    assert empty.num_rows == 0
    assert [(f.name, str(f.type)) for f in empty.schema] == [
        (schema.TRANSACTION_ID, "int64"), (schema.CUSTOMER_ID, "int64"), (schema.TX_DATETIME, "timestamp[ns, tz=UTC]"),
        ("score", "float"), ("rank", "int64")]


def test_a_run_folder_scores_with_its_newest_finished_day_never_one_in_progress(model: Path, dataset_src: Path,
                                                                                 tmp_path: Path, capsys) -> None:
    """A run folder holding only an untrained checkpoint is refused; a newer checkpoint taken mid-day (training
    progress, other weights) is passed over for the newest one that finished a day."""
    import torch

    from workload.model import score
    from workload.model.export import load_model
    from workload.share.checkpoint import CheckpointStore

    folder = tmp_path / "output" / "main"
    store = CheckpointStore(folder)
    assert store.fence(1)
    untrained = checkpoint_of(Trainer("main", HParams(epochs=2, hidden=(8,)), features.FEATURE_NAMES,
                                      feature_version=features.FEATURE_VERSION, device=torch.device("cpu")))
    assert untrained["progress"] is None and untrained["applied"] == []
    assert store.save(untrained, path=store.next_path(1), may_promote=lambda: True, boundary=True)
    args = ["--datasets", str(dataset_src), "--days", "testing"]
    code, err = run(capsys, "score", "--model", str(folder), *args, "--out", str(tmp_path / "none.parquet"))
    assert code == 2 and error_line(err) == (
        f"--model {folder}: no checkpoint with a finished day under {folder / 'checkpoints'}; give a run's output "
        "folder (SHARE/output/RUN) or an exported model.safetensors"), err
    assert not (tmp_path / "none.parquet").exists()
    finished = checkpoint_of(load_model(model))
    assert store.save(finished, path=store.next_path(1), may_promote=lambda: True, boundary=True)
    midway = {**finished, "progress": {"shard": "testing/2018-04-07.parquet", "epoch": 1, "batch": 3},
              "model": {k: v + 1 for k, v in finished["model"].items()},
              "averaged": {k: v + 1 for k, v in finished["averaged"].items()}}
    assert store.save(midway, path=store.next_path(1), may_promote=lambda: True, boundary=False)
    assert score.load(folder).device == torch.device("cpu"), "read like an exported model: on the CPU"
    code, err = run(capsys, "score", "--model", str(folder), *args, "--out", str(tmp_path / "a.parquet"))
    assert code == 0, err
    code, err = run(capsys, "score", "--model", str(model), *args, "--out", str(tmp_path / "b.parquet"))
    assert code == 0, err
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "a.parquet"), pd.read_parquet(tmp_path / "b.parquet"))


@pytest.mark.parametrize(("args", "message"), [
    (["--days", "testing", "--out", "{tmp}/scores.json"],
     "--out {tmp}/scores.json: give a file ending in .parquet or .csv, or a folder ending in / (one Parquet file "
     "per day)"),
    (["--days", "testing", "--out", "{tmp}/file/scores.parquet"],
     "--out {tmp}/file/scores.parquet: cannot write it (File exists)"),
    (["--days", "testing", "--out", "gs://Bad_Bucket/scores.parquet"],
     "--out 'gs://Bad_Bucket/scores.parquet': 'Bad_Bucket' is not a bucket name; expected gs://BUCKET[/PREFIX] "
     "with a bucket of lowercase letters, digits, '-', '_', '.'"),
    (["--out", "{tmp}/scores.parquet"], "--datasets {data}: no scoring/ days to score"),
    (["--days", "all", "--out", "{tmp}/scores.parquet"],
     "--datasets {history}: no training/ or testing/ or scoring/ days to score"),
    (["--days", "testing", "--columns", "{columns}", "--out", "{tmp}/scores.parquet"],
     "--datasets {data}: a dataset on the share is read as published ({published}); leave out --columns and "
     "--datetime-format"),
], ids=["not-parquet", "parent-is-a-file", "bad-bucket", "no-scoring-days", "only-history", "share-and-columns"])
def test_score_refuses_in_one_line_naming_the_flag_and_what_it_saw(model: Path, dataset_src: Path, tmp_path: Path,
                                                                   capsys, args: list[str], message: str) -> None:
    (tmp_path / "file").write_text("a file, not a folder\n")
    history = tmp_path / "history-only"
    where = {"tmp": tmp_path, "data": dataset_src, "history": history, "columns": tmp_path / "columns.yaml",
             "published": ds.Dataset(dataset_src).reading.describe()}
    src = history if "all" in args else dataset_src
    if src == history:
        copy_files(dataset_src, history, keep=lambda rel: rel.startswith("training/"), role_of=lambda rel: "history")
    write_mapping(where["columns"])
    code, err = run(capsys, "score", "--model", str(model), "--datasets", str(src),
                    *(a.format(**where) for a in args))
    assert code == 2 and error_line(err) == message.format(**where), err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["file", "columns.yaml", *(
        ["history-only"] if src == history else [])]), "nothing written"


def test_per_day_scores_go_to_the_bucket_as_binary_objects(model: Path, dataset_src: Path, tmp_path: Path, capsys,
                                                           bucket, monkeypatch: pytest.MonkeyPatch,
                                                           request: pytest.FixtureRequest) -> None:
    """From a bucket to a bucket, one object per testing day, each what a local run writes for that day. With
    LOG_LEVEL=DEBUG the reads from the bucket are logged too (only the staging copy's own lines are held back)."""
    import functools
    import logging

    from workload.model import report

    for path in sorted(dataset_src.glob("*/*.parquet")):
        bucket.blob(f"exports/{path.parent.name}/{path.name}").upload_from_filename(str(path))
    code, err = run(capsys, "score", "--model", str(model), "--datasets", str(dataset_src), "--days", "testing",
                    "--out", f"{tmp_path}/local/")
    assert code == 0, err
    root = logging.getLogger()
    request.addfinalizer(functools.partial(root.setLevel, root.level))  # the level this run sets
    monkeypatch.setenv("LOG_LEVEL", "DEBUG")
    code, err = run(capsys, "score", "--model", str(model), "--datasets", "gs://acme/exports", "--days", "testing",
                    "--out", "gs://acme/scores/")
    assert code == 0, err
    names = [f"scores/2018-04-0{d}.parquet" for d in (7, 8)]
    objects = {b.name: b for b in bucket.client.list_blobs(bucket, prefix="scores/")}
    assert sorted(objects) == names
    for name in names:
        assert objects[name].content_type == "application/octet-stream", "Parquet is binary, not the client's text"
        (tmp_path / "got.parquet").write_bytes(objects[name].download_as_bytes())
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "got.parquet"),
                                      pd.read_parquet(tmp_path / "local" / name.split("/")[1]), check_exact=True)
    every = pd.concat(pd.read_parquet(tmp_path / "local" / name.split("/")[1]) for name in names)
    assert said(err) == [
        "read 8 file(s) from gs://acme/exports",
        f"scored {len(every)} transactions of 2 day(s) with the model of run 'main' (6 day(s) trained); wrote "
        "gs://acme/scores/2018-04-07.parquet, gs://acme/scores/2018-04-08.parquet",
        f"against the labels in gs://acme/exports: {report.figures_line(expected_figures(every, dataset_src))}"]
    requests = "\n".join(said(err.split("read 8 file(s) from")[0], "DEBUG", "urllib3.connectionpool"))
    for path in sorted(dataset_src.glob("*/*.parquet")):
        assert f"exports%2F{path.parent.name}%2F{path.name}" in requests, "each object read is logged"
    assert said(err, "INFO", "workload.data.publish") == [], "publish's lines name the staging copy"


def test_a_refused_or_unreachable_bucket_gets_one_line_and_its_exit_code(model: Path, dataset_src: Path,
                                                                         tmp_path: Path, capsys, bucket,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket that refuses the object (here: none by that name) is the user's to fix (2), quoting the service;
    a service that cannot be reached is an infrastructure fault (3). Either way no object is left."""
    from google.api_core import exceptions as gexc

    args = ["score", "--model", str(model), "--datasets", str(dataset_src), "--days", "testing"]
    with pytest.raises(gexc.NotFound) as refusal:  # what the service says to anyone writing there
        bucket.client.bucket("no-such-bucket").blob("scores.parquet").upload_from_string(b"PAR1")
    code, err = run(capsys, *args, "--out", "gs://no-such-bucket/scores.parquet")
    assert code == 2 and error_line(err) == (
        f"--out gs://no-such-bucket/scores.parquet: Cloud Storage refused it (NotFound: {refusal.value.message}); "
        "the scorer needs objectCreator on that prefix"), err
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "ftp://127.0.0.1:1")  # no HTTP adapter for it: fails at once
    code, err = run(capsys, *args, "--out", "gs://acme/scores.parquet")
    assert code == 3 and error_line(err) == (
        "--out gs://acme/scores.parquet: cannot upload (InvalidSchema: No connection adapters were found for "
        "'ftp://127.0.0.1:1/upload/storage/v1/b/acme/o?uploadType=multipart')"), err
    assert list(bucket.client.list_blobs(bucket)) == []


def test_a_day_scored_without_any_history_is_refused_unless_allowed(model: Path, dataset_src: Path, tmp_path: Path,
                                                                    capsys) -> None:
    """Tomorrow's file alone scored AP 0.31 against 0.77 with its history, and nothing was said."""
    alone = bank_export(dataset_src, tmp_path / "alone", keep=lambda rel: rel == TOMORROW,
                        role_of=tomorrow_as_scoring, label="absent")
    mapping = str(write_mapping(tmp_path / "columns.yaml"))
    code, err = run(capsys, "score", "--model", str(model), "--datasets", str(alone), "--columns", mapping,
                    "--out", str(tmp_path / "s.parquet"))
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert code == 2 and len(errors) == 1, err
    assert errors[0].endswith(
        "--datasets: the first scored day 2018-04-08 has 0 day(s) of history before it; its features look back 37 "
        "days (features.LOOKBACK_DAYS): give the dataset's earlier days (history/, training/) with the days to "
        "score, or pass --allow-short-history to score it anyway")
    assert not (tmp_path / "s.parquet").exists()
    code, err = run(capsys, "score", "--model", str(model), "--datasets", str(alone), "--columns", mapping,
                    "--out", str(tmp_path / "s.csv"), "--allow-short-history")
    assert code == 0 and "scoring with short history: the first scored day 2018-04-08 has 0 day(s)" in err
    written = pd.read_csv(tmp_path / "s.csv")
    assert list(written.columns) == ["tx_id", "card_id", "ts", "score", "rank"]
