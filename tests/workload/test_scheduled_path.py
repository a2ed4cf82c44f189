"""The scheduled path end to end, with the stack's own command lines (infra/contract.py): a new day in the
bucket is loaded, trained, and the bucket's scoring/ days are scored by the run's newest model, the scores
landing in the output bucket, all against a real Cloud Storage API server (gcp-storage-emulator).

The data is a bank's export (shuffled rows, offset timestamps, float IDs: tests/workload/exports.py), and
the scoring day is a later day without its labels.
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest
import zygote
from exports import real_export
from harness import HPARAMS, ROOT, Cluster

from infra import contract

pytestmark = pytest.mark.timeout(600)
LABELS = ("TX_FRAUD", "TX_FRAUD_SCENARIO")


@pytest.fixture
def storage(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, object]]:
    from gcp_storage_emulator.server import create_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="bank-data")
    server.start()
    host = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from google.cloud import storage as gcs
    client = gcs.Client(project=None)
    client.create_bucket("bank-results")
    try:
        yield host, client
    finally:
        server.stop()


def _upload(client: object, folder: Path, prefix: str, keep: Callable[[str], bool] = lambda rel: True) -> None:
    bucket = client.bucket("bank-data")
    for path in sorted(folder.glob("*/*")):
        rel = f"{path.parent.name}/{path.name}"
        if keep(rel):
            bucket.blob(f"{prefix}/{rel}").upload_from_filename(str(path))


def _run(cluster: Cluster, host: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    local = [a.replace(contract.SHARE_DIR, str(cluster.share)) for a in argv]
    return zygote.run(["workload", *local], cluster.env(STORAGE_EMULATOR_HOST=host), ROOT, 300)


def _load_and_train(cluster: Cluster, host: str, runs_file: Path) -> None:
    """What the schedule runs: the loader's command (sync, publish, enqueue), then a training Job."""
    seed = contract.loader_args("exports", "small", "gs://bank-data/exports")
    seed[seed.index(contract.RUNS_FILE)] = str(runs_file)
    out = _run(cluster, host, seed)
    assert out.returncode == 0, out.stderr
    cluster.new_job()
    pod = cluster.start_worker("scheduled", **{contract.ENV_OUTPUT_URI: "gs://bank-results/spot-trainer"})
    assert pod.wait(400) == 0, cluster.log("scheduled")


def test_a_new_day_is_loaded_trained_and_tomorrow_is_scored_into_the_bucket(
    cluster: Cluster, storage: tuple[str, object], tmp_path: Path
) -> None:
    host, client = storage
    export = real_export(cluster.dataset_src, tmp_path / "export")
    new_day = f"training/{sorted(export.glob('training/*'))[-1].name}"
    tomorrow = sorted(export.glob("testing/*"))[-1]  # scored, never tested: kept out of testing/
    _upload(client, export, "exports", keep=lambda rel: rel not in (new_day, f"testing/{tomorrow.name}"))
    runs_file = tmp_path / "runs.json"
    runs_file.write_text(json.dumps({"main": HPARAMS}))
    _load_and_train(cluster, host, runs_file)
    before = cluster.final_state()["applied"]

    # The next day arrives, with tomorrow's transactions to score (the last testing day, unlabelled).
    _upload(client, export, "exports", keep=lambda rel: rel == new_day)
    frame = pd.read_parquet(tomorrow) if tomorrow.suffix == ".parquet" else pd.read_csv(tomorrow)
    scoring = tmp_path / "scoring" / "scoring" / f"{tomorrow.stem}.parquet"
    scoring.parent.mkdir(parents=True)
    frame.drop(columns=[c for c in LABELS if c in frame]).to_parquet(scoring)
    _upload(client, tmp_path / "scoring", "exports")
    _load_and_train(cluster, host, runs_file)
    assert len(cluster.final_state()["applied"]) == len(before) + 1  # the new day, trained once

    out = _run(cluster, host, contract.score_args("main", "exports", "gs://bank-results/spot-trainer"))
    assert out.returncode == 0, out.stderr
    blob = client.bucket("bank-results").get_blob(f"spot-trainer/main/scores/{tomorrow.stem}.parquet")
    assert blob is not None, [b.name for b in client.list_blobs("bank-results")]
    scores = pd.read_parquet(io.BytesIO(blob.download_as_bytes()))
    assert {"TRANSACTION_ID", "TX_DATETIME", "score", "rank"} <= set(scores.columns)
    assert len(scores) == len(frame) and scores["score"].between(0, 1).all()
    assert sorted(scores["TRANSACTION_ID"].astype("int64")) == sorted(frame["TRANSACTION_ID"].astype("int64"))
