"""Datasets from Cloud Storage, against a real Cloud Storage API server (gcp-storage-emulator, reached
through STORAGE_EMULATOR_HOST as Google's client does): the share is a cache in front of the bucket."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from exports import BAD_FILES, DAY3, copy_files, one_error_line, plant
from harness import HPARAMS, ROOT, Cluster, same_weights

from workload.data import dataset as ds
from workload.model.hparams import default_seed

pytestmark = pytest.mark.timeout(600)
DAY6 = "training/2018-04-06.parquet"


@dataclass
class Bucket:
    host: str
    client: object

    def upload(self, folder: Path, prefix: str) -> None:
        bucket = self.client.bucket("data")
        for path in sorted(folder.glob("*/*")):
            bucket.blob(f"{prefix}/{path.parent.name}/{path.name}").upload_from_filename(str(path))

    def generation(self, name: str) -> int:
        return self.client.bucket("data").get_blob(name).generation


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[Bucket]:
    from gcp_storage_emulator.server import create_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = create_server("127.0.0.1", port, in_memory=True, default_bucket="data")
    server.start()
    host = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        from google.cloud import storage
    try:
        yield Bucket(host=host, client=storage.Client(project=None))
    finally:
        server.stop()


def seed(cluster: Cluster, bucket: Bucket, tmp_path: Path, runs: dict, *args: str) -> subprocess.CompletedProcess[str]:
    runs_file = tmp_path / f"runs-{len(list(tmp_path.glob('runs-*')))}.json"
    runs_file.write_text(json.dumps(runs))
    return subprocess.run([sys.executable, "-m", "workload", "seed", "--runs-file", str(runs_file), *args],
                          env=cluster.env(STORAGE_EMULATOR_HOST=bucket.host), cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def train(cluster: Cluster, *names: str) -> None:
    """One training Job: on the cluster each seed with new data replaces the Job (the loader's inputs change)."""
    cluster.new_job()
    for name in names:
        cluster.start_worker(name)
    codes = cluster.wait_all(timeout_s=400)
    assert all(c == 0 for c in codes), "\n".join(cluster.log(n) for n in names)


def applied(cluster: Cluster, run: str) -> list[str]:
    return cluster.final_state(run)["applied"]


def test_a_bucket_trains_like_a_folder_syncs_incrementally_and_grows_by_days(
        cluster: Cluster, bucket: Bucket, tmp_path: Path, reference_state: dict) -> None:
    src = cluster.dataset_src
    first_days = copy_files(src, tmp_path / "export", keep=lambda rel: rel != DAY6)
    bucket.upload(first_days, "exports/fraud")
    uri = "gs://data/exports/fraud"

    # The same days from a local folder and from the bucket, same hyperparameters and seed.
    out = seed(cluster, bucket, tmp_path, {"disk": {**HPARAMS, "seed": default_seed("main")}},
               "--dataset", "disk", "--datasets", str(first_days))
    assert out.returncode == 0, out.stderr
    out = seed(cluster, bucket, tmp_path, {"main": HPARAMS, "other": {"epochs": 2}}, "--dataset", "cloud",
               "--datasets", uri)
    assert out.returncode == 0, out.stderr
    assert f"synced {uri} into {cluster.share / 'datasets' / 'cloud'}: 7 file(s) copied, 0 unchanged" in out.stderr
    manifest = json.loads((cluster.share / "datasets" / "cloud" / ds.MANIFEST).read_text())
    assert manifest["source"] == uri
    entry = next(e for e in manifest["files"] if e["path"] == DAY3)
    assert entry["source"]["uri"] == f"{uri}/{DAY3}"
    assert entry["source"]["generation"] == str(bucket.generation(f"exports/fraud/{DAY3}"))
    train(cluster, "w1", "w2")
    assert same_weights(cluster.final_state("main"), cluster.final_state("disk")), \
        "trained from the bucket exactly as from a local folder"

    # Unchanged bucket: nothing copied. Identical bytes uploaded again (a new generation): still nothing.
    out = seed(cluster, bucket, tmp_path, {"main": HPARAMS}, "--dataset", "cloud", "--datasets", uri)
    assert out.returncode == 0 and f"{uri} into" in out.stderr and ": 0 file(s) copied, 7 unchanged" in out.stderr
    before = bucket.generation(f"exports/fraud/{DAY3}")
    bucket.client.bucket("data").blob(f"exports/fraud/{DAY3}").upload_from_filename(str(first_days / DAY3))
    assert bucket.generation(f"exports/fraud/{DAY3}") != before, "the emulator gives a re-upload a new generation"
    out = seed(cluster, bucket, tmp_path, {"main": HPARAMS}, "--dataset", "cloud", "--datasets", uri)
    assert out.returncode == 0 and ": 0 file(s) copied, 7 unchanged" in out.stderr, out.stderr
    assert cluster.counts().pending == 0

    # A new day arrives: copied, enqueued for every run of the dataset, trained.
    bucket.client.bucket("data").blob(f"exports/fraud/{DAY6}").upload_from_filename(str(src / DAY6))
    out = seed(cluster, bucket, tmp_path, {"main": HPARAMS}, "--dataset", "cloud", "--datasets", uri)
    assert out.returncode == 0 and ": 1 file(s) copied, 7 unchanged" in out.stderr, out.stderr
    assert cluster.counts().pending == 2, "the new day, once for each run of the dataset"
    train(cluster, "w3")
    assert applied(cluster, "other")[-1] == applied(cluster, "main")[-1] == DAY6
    assert DAY6 not in applied(cluster, "disk")
    assert same_weights(cluster.final_state("main"), reference_state), \
        "five days, then the sixth appended: the weights of all six at once"

    # A published day changed in the bucket: refused by name, nothing copied or queued.
    manifest_bytes = (cluster.share / "datasets" / "cloud" / ds.MANIFEST).read_bytes()
    changed = pd.read_parquet(src / DAY3)
    changed.loc[0, "TX_AMOUNT"] += 1
    changed.to_parquet(tmp_path / "changed.parquet", index=False)
    bucket.client.bucket("data").blob(f"exports/fraud/{DAY3}").upload_from_filename(str(tmp_path / "changed.parquet"))
    out = seed(cluster, bucket, tmp_path, {"main": HPARAMS}, "--dataset", "cloud", "--datasets", uri)
    assert out.returncode == 2
    assert f"dataset problem: {DAY3} ({uri}/{DAY3}) changed since it was published" in one_error_line(out.stderr)
    assert (cluster.share / "datasets" / "cloud" / ds.MANIFEST).read_bytes() == manifest_bytes
    assert cluster.counts().pending == 0

    # Another source under the same dataset name: refused, not silently ignored.
    out = seed(cluster, bucket, tmp_path, {"main": HPARAMS}, "--dataset", "cloud", "--datasets", str(first_days))
    assert out.returncode == 2
    assert f"dataset 'cloud' on the share was published from {uri}; refusing" in one_error_line(out.stderr)


@pytest.mark.parametrize("case", ["corrupt parquet", "text in a number"])
def test_a_bad_object_is_named_by_its_gs_uri(cluster: Cluster, bucket: Bucket, tmp_path: Path, case: str) -> None:
    folder = copy_files(cluster.dataset_src, tmp_path / "export")
    bad = plant(folder, case, cluster.dataset_src)
    bucket.upload(folder, "bad")
    out = seed(cluster, bucket, tmp_path, {"main": {}}, "--dataset", "bad", "--datasets", "gs://data/bad")
    assert out.returncode == 2
    line = one_error_line(out.stderr)
    assert f"dataset problem: gs://data/bad/{bad.parent.name}/{bad.name}: {BAD_FILES[case][2]}" in line, line
    assert [p.name for p in (cluster.share / "datasets").iterdir()] == [".bad.lock"], "nothing published, nothing left"


@pytest.mark.parametrize(("uri", "message"), [
    ("gs://missing-bucket/x", "gs://missing-bucket/x: not found"),
    ("gs://Bad_Bucket/x", "'Bad_Bucket' is not a Cloud Storage bucket name"),
    ("gs://data/empty", "gs://data/empty: no training/ files"),
])
def test_a_source_that_cannot_be_read_is_one_line(cluster: Cluster, bucket: Bucket, tmp_path: Path, uri: str,
                                                  message: str) -> None:
    out = seed(cluster, bucket, tmp_path, {"main": {}}, "--datasets", uri)
    assert out.returncode == 2
    assert message in one_error_line(out.stderr)


@pytest.mark.parametrize("in_a_pod", [False, True])
def test_missing_credentials_fail_at_once_on_a_laptop_and_are_waited_out_in_a_pod(
        cluster: Cluster, tmp_path: Path, in_a_pod: bool) -> None:
    # A real DefaultCredentialsError without any network: the credentials file google-auth is told
    # to use is not a credentials file. In a pod the same error may only mean "the GKE metadata
    # server is not up yet" or "the grant has not propagated", so the loader retries for a bound.
    creds = tmp_path / "creds.json"
    creds.write_text("not json")
    env = {k: v for k, v in cluster.env().items() if k not in ("STORAGE_EMULATOR_HOST", "KUBERNETES_SERVICE_HOST")}
    env.update(GOOGLE_APPLICATION_CREDENTIALS=str(creds), SOURCE_ACCESS_RETRY_SECONDS="" if not in_a_pod else "5")
    if in_a_pod:
        env["KUBERNETES_SERVICE_HOST"] = "127.0.0.1"
    else:
        del env["SOURCE_ACCESS_RETRY_SECONDS"]
    out = subprocess.run([sys.executable, "-m", "workload", "seed", "--datasets", "gs://data/real"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "gs://data/real: no Google credentials" in one_error_line(out.stderr)
    retries = out.stderr.count("can take minutes to take effect: retrying")
    assert (retries >= 1) if in_a_pod else (retries == 0), out.stderr
    assert not (cluster.share / "datasets").exists() or \
        [p.name for p in (cluster.share / "datasets").iterdir()] in ([], [".fraud.lock"])
