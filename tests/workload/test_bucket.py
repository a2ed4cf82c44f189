"""Datasets from Cloud Storage, against a real Cloud Storage API server (gcp-storage-emulator, reached
through STORAGE_EMULATOR_HOST as Google's client does): the share is a cache in front of the bucket."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import zygote
from exports import BAD_FILES, DAY3, copy_files, one_error_line, plant
from harness import HPARAMS, ROOT, Cluster, same_weights

from workload.data.manifest import MANIFEST
from workload.data.source import BucketSource, LocalSource, SourceError, access_retry_seconds, open_source
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
    return zygote.run(["workload", "seed", "--runs-file", str(runs_file), *args],
                      cluster.env(STORAGE_EMULATOR_HOST=bucket.host), ROOT, 120)


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
    manifest = json.loads((cluster.share / "datasets" / "cloud" / MANIFEST).read_text())
    assert manifest["source"] == uri
    entry = next(e for e in manifest["files"] if e["path"] == DAY3)
    assert entry["source"]["uri"] == f"{uri}/{DAY3}"
    assert entry["source"]["generation"] == str(bucket.generation(f"exports/fraud/{DAY3}"))
    train(cluster, "w1")  # one worker trains the three runs in turn: a second one cost ~4 s of CPU to start
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
    manifest_bytes = (cluster.share / "datasets" / "cloud" / MANIFEST).read_bytes()
    changed = pd.read_parquet(src / DAY3)
    changed.loc[0, "TX_AMOUNT"] += 1
    changed.to_parquet(tmp_path / "changed.parquet", index=False)
    bucket.client.bucket("data").blob(f"exports/fraud/{DAY3}").upload_from_filename(str(tmp_path / "changed.parquet"))
    out = seed(cluster, bucket, tmp_path, {"main": HPARAMS}, "--dataset", "cloud", "--datasets", uri)
    assert out.returncode == 2
    assert f"dataset problem: {DAY3} ({uri}/{DAY3}) changed since it was published" in one_error_line(out.stderr)
    assert (cluster.share / "datasets" / "cloud" / MANIFEST).read_bytes() == manifest_bytes
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
    out = zygote.run(["workload", "seed", "--datasets", "gs://data/real"], env, ROOT, 120)
    assert out.returncode == 2, out.stderr
    assert "gs://data/real: no Google credentials" in one_error_line(out.stderr)
    retries = out.stderr.count("can take minutes to take effect: retrying")
    assert (retries >= 1) if in_a_pod else (retries == 0), out.stderr
    assert not (cluster.share / "datasets").exists() or \
        [p.name for p in (cluster.share / "datasets").iterdir()] in ([], [".fraud.lock"])


# The source in this process (`make mutation` runs, for a mutant, only the tests that called the mutated function
# here, never in a `seed` subprocess): what --datasets accepts, how files are listed and named, and each refusal
# as the one line the user reads. A local folder is read by the same rules as a bucket.
ROLES_TEXT = "history/, training/, testing/, scoring/"


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "workload.data.source"]


def test_datasets_takes_a_folder_or_a_gs_uri_and_refuses_any_other_scheme(tmp_path: Path) -> None:
    src = open_source("gs://acme-fraud/exports")
    assert isinstance(src, BucketSource) and src.uri == "gs://acme-fraud/exports"
    assert isinstance(open_source(str(tmp_path)), LocalSource)
    with pytest.raises(SourceError) as caught:
        open_source("s3://acme-fraud/exports")
    assert str(caught.value) == ("--datasets 's3://acme-fraud/exports': unsupported scheme; use a local folder or "
                                 "gs://bucket/prefix")


@pytest.mark.parametrize(("uri", "name"), [("gs://Bad_Bucket/x", "Bad_Bucket"), ("gs://ab", "ab"), ("gs:///x", "")])
def test_a_uri_without_a_valid_bucket_name_is_refused_in_one_line(uri: str, name: str) -> None:
    with pytest.raises(SourceError) as caught:
        BucketSource(uri)
    assert str(caught.value) == f"{uri}: {name!r} is not a Cloud Storage bucket name; expected gs://bucket/prefix"


def test_a_bucket_root_or_prefix_is_listed_and_copied_whatever_its_trailing_slash(
        bucket: Bucket, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """gs://bucket and gs://bucket/prefix, with or without a trailing '/', name the same source; only the files
    under its own prefix are listed (not a sibling prefix's), each named by its gs:// URI with its generation, and
    a copy lands at any depth, next to one already there."""
    data = bucket.client.bucket("data")
    flat = bucket.client.create_bucket("flat")
    objects = {"exports/FX/training/2018-04-01.csv": b"1", "exports/FX/training/2018-04-02.csv": b"22",
               "exports/FX/testing/2018-04-03.csv": b"333", "exports/F/training/2018-04-04.csv": b"4444",
               "exports/GX/training/2018-04-05.csv": b"55555"}
    for name, content in objects.items():
        data.blob(name).upload_from_string(content)
    for name in ("training/2018-04-01.csv", "testing/2018-04-03.csv"):
        flat.blob(name).upload_from_string(name.encode())
    in_fx = ["testing/2018-04-03.csv", "training/2018-04-01.csv", "training/2018-04-02.csv"]
    in_flat = ["testing/2018-04-03.csv", "training/2018-04-01.csv"]
    fx, root = (data, "exports/FX/", in_fx), (flat, "", in_flat)
    cases = {"gs://data/exports/FX": fx, "gs://data/exports/FX/": fx, "gs://flat": root, "gs://flat/": root}
    for n, (uri, (home, prefix, expected)) in enumerate(cases.items()):
        src = BucketSource(uri)
        assert src.uri == uri.rstrip("/"), "the URI recorded in the manifest"
        with caplog.at_level(logging.WARNING, logger="workload.data.source"):
            listed = src.files()
        assert warnings_of(caplog) == [], uri
        assert sorted(f.rel for f in listed) == expected, uri
        for f in listed:
            blob = home.get_blob(prefix + f.rel)
            assert f.identity() == {"uri": f"{src.uri}/{f.rel}", "size": blob.size, "crc32c": blob.crc32c,
                                    "generation": str(blob.generation)}
            dest = tmp_path / str(n) / "deep" / f.rel
            src.fetch(f, dest)
            assert dest.read_bytes() == blob.download_as_bytes()


def test_folder_objects_hidden_files_and_stray_files_in_a_bucket(bucket: Bucket,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The console's "folder" objects (names ending in '/') and hidden files (.keep) are skipped silently; a file
    outside a role folder or deeper than one is left out and named by its gs:// URI in one warning."""
    data = bucket.client.bucket("data")
    for name in ("p/", "p/training/", "p/training/old/", "p/training/.keep", "p/README.txt",
                 "p/training/old/2018-03-01.csv", "p/training/2018-04-01.csv"):
        data.blob(name).upload_from_string(b"" if name.endswith("/") else b"x")
    with caplog.at_level(logging.WARNING, logger="workload.data.source"):
        listed = BucketSource("gs://data/p").files()
    assert [f.rel for f in listed] == ["training/2018-04-01.csv"]
    assert warnings_of(caplog) == [f"gs://data/p: ignoring 2 file(s) not directly in {ROLES_TEXT} (for example "
                                   "gs://data/p/README.txt, gs://data/p/training/old/2018-03-01.csv)"]


def test_a_missing_bucket_is_one_line(bucket: Bucket) -> None:
    with pytest.raises(SourceError) as caught:
        BucketSource("gs://missing/x").files()
    text = str(caught.value)
    assert "\n" not in text and text.startswith("gs://missing/x: not found (404 GET http://")
    assert "/storage/v1/b/missing/o?" in text and text.endswith(")")


def test_the_first_bucket_read_of_a_process_prints_no_python_version_notice(bucket: Bucket) -> None:
    """google.api_core warns about the Python version when it is first imported: in a loader process that is
    BucketSource.client(), which keeps the notice out of the loader's log. Run in a fresh process (here the import
    is done already); in this process too, so that `make mutation` runs this test for client()'s mutants."""
    bucket.client.bucket("data").blob("p/training/2018-04-01.csv").upload_from_string(b"x")
    assert [f.rel for f in BucketSource("gs://data/p").files()] == ["training/2018-04-01.csv"]
    code = "from workload.data.source import BucketSource; print([f.rel for f in BucketSource('gs://data/p').files()])"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout, out.stderr) == (0, "['training/2018-04-01.csv']\n", "")


def test_a_missing_folder_or_a_symbolic_link_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(SourceError) as caught:
        LocalSource(tmp_path / "export").files()
    assert str(caught.value) == (f"{tmp_path / 'export'}: no such folder; --datasets takes a folder with "
                                 f"{ROLES_TEXT} or a gs://bucket/prefix")
    (tmp_path / "export" / "training").mkdir(parents=True)
    (tmp_path / "secret.csv").write_text("x")
    (tmp_path / "export" / "training" / "2018-04-01.csv").symlink_to(tmp_path / "secret.csv")
    with pytest.raises(SourceError) as caught:
        LocalSource(tmp_path / "export").files()
    assert str(caught.value) == (f"{tmp_path / 'export' / 'training' / '2018-04-01.csv'}: a symbolic link in the "
                                 "dataset folder; links are never followed, copy the file itself there")


def test_hidden_files_and_folders_are_skipped_and_a_stray_file_is_named(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "export"
    for rel in ("training/2018-04-01.csv", "training/.DS_Store", "training/.cache/2018-04-01.csv",
                ".git/training/2018-04-02.csv", "notes.txt"):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(rel)
    with caplog.at_level(logging.WARNING, logger="workload.data.source"):
        listed = LocalSource(folder).files()
    assert [f.rel for f in listed] == ["training/2018-04-01.csv"]
    assert warnings_of(caplog) == [f"{folder}: ignoring 1 file(s) not directly in {ROLES_TEXT} (for example "
                                   f"{folder / 'notes.txt'})"]


def test_local_files_are_named_as_the_user_gave_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """By the path as typed (relative here), or under the name a source is published as (the simulator's temporary
    folder is never named)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "export" / "training").mkdir(parents=True)
    (tmp_path / "export" / "training" / "2018-04-01.csv").write_text("x")
    [typed] = LocalSource(Path("export")).files()
    assert typed.uri == "export/training/2018-04-01.csv"
    named = LocalSource(tmp_path / "export", uri="simulated:test")
    assert named.uri == "simulated:test"
    assert [f.uri for f in named.files()] == ["simulated:test/training/2018-04-01.csv"]


def test_a_file_changed_between_listing_and_copy_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "export"
    (folder / "training").mkdir(parents=True)
    (folder / "training" / "2018-04-01.csv").write_text("listed")
    src = LocalSource(folder)
    [listed] = src.files()
    (folder / "training" / "2018-04-01.csv").write_text("replaced")
    with pytest.raises(SourceError) as caught:
        src.fetch(listed, tmp_path / "copy" / listed.rel)
    assert str(caught.value) == (f"{folder / 'training' / '2018-04-01.csv'}: changed while it was being copied "
                                 f"(listed 6 bytes, crc32c {listed.crc32c}); run seed again")


def test_a_denied_read_is_waited_out_five_minutes_in_a_pod_and_not_at_all_on_a_laptop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cloud.md: inside the cluster a denied or unauthenticated read is retried for 5 minutes (env
    SOURCE_ACCESS_RETRY_SECONDS); a laptop's denial is the user's to fix."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("SOURCE_ACCESS_RETRY_SECONDS", raising=False)
    assert access_retry_seconds() == 0.0
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert access_retry_seconds() == 300.0
    monkeypatch.setenv("SOURCE_ACCESS_RETRY_SECONDS", "12")
    assert access_retry_seconds() == 12.0
