"""Results out of the share: a sweep trained by `local`, exported to a folder and to a real Cloud
Storage API server, scored back to the report's figures; the worker's OUTPUT_URI hook."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from harness import ROOT, Cluster, built_once, is_stopped
from safetensors import safe_open

from workload import cli
from workload.data import features, schema
from workload.model import metrics
from workload.model.export import HEADER_KEY, MODEL_FILE, load_model
from workload.runtime.redis_server import free_port
from workload.share.checkpoint import CheckpointStore

pytestmark = pytest.mark.timeout(300)

SWEEP = {"main": {"epochs": 2}, "wide": {"epochs": 2, "hidden": [48, 24]}, "lr3": {"epochs": 2, "lr": 0.003}}
FILES = ("report.txt", "metrics.jsonl", "metrics.png", "pr_curve.png", MODEL_FILE)


def workload_cmd(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workload", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The command line in this process (no interpreter start-up): exit code, stdout, stderr."""
    code = cli.main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, dataset_src: Path) -> Path:
    """`make local ARGS="--runs-file sweep.json --datasets ..."` on the tiny dataset: the local folder."""
    base = tmp_path_factory.mktemp("sweep")
    runs_file = base / "sweep.json"
    runs_file.write_text(json.dumps(SWEEP))

    def train(local: Path) -> None:
        out = workload_cmd("local", "--dir", str(local), "--datasets", str(dataset_src), "--runs-file",
                           str(runs_file), "--workers", "2", timeout=280)
        assert out.returncode == 0, out.stdout + out.stderr

    # Under `make mutation`'s export group, trained once for all its mutants (the sweep uses neither export.py
    # nor score.py: a worker exports only with OUTPUT_URI set).
    return built_once("export-sweep", base / "local", train)


@pytest.fixture(scope="module")
def emulator() -> Iterator[str]:
    """A real Cloud Storage API server (gcp-storage-emulator) on 127.0.0.1; yields STORAGE_EMULATOR_HOST."""
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def bucket(emulator: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest):
    """A fresh bucket on the emulator, and a client for it (this process talks to the emulator too)."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator)
    from workload.model.export import storage_client

    client = storage_client()
    name = re.sub(r"[^a-z0-9]", "-", request.node.name.lower())[:50].strip("-")
    return client.create_bucket(name)


def test_a_sweep_of_three_runs_trains_three_different_models(sweep: Path) -> None:
    states = {}
    for run, spec in SWEEP.items():
        run_dir = sweep / "share" / "output" / run
        report = (run_dir / "report.txt").read_text()
        assert report.count("training dataset: ") == 6, report
        loaded = CheckpointStore(run_dir).load()
        assert loaded is not None and len(loaded.state["applied"]) == 6
        states[run] = loaded.state
        for key, value in spec.items():
            assert states[run]["hparams"][key] == value
    assert states["wide"]["model"]["net.0.weight"].shape == (48, states["main"]["model"]["net.0.weight"].shape[1])
    # main and lr3 have the same shape: different learning rates and seeds must still give different weights.
    assert not torch.equal(states["main"]["model"]["net.0.weight"], states["lr3"]["model"]["net.0.weight"])
    assert len({s["hparams"]["seed"] for s in states.values()}) == 3
    finals = {run: json.loads((sweep / "share" / "output" / run / "metrics.jsonl").read_text().splitlines()[-1])
              for run in SWEEP}
    assert len({f["average_precision"] for f in finals.values()}) == 3


def test_export_to_a_folder_scores_the_test_days_as_the_report_says(sweep: Path, dataset_src: Path,
                                                                    tmp_path: Path) -> None:
    out = workload_cmd("export", "--share", str(sweep / "share"), "--run", "wide", "--to", str(tmp_path / "results"))
    assert out.returncode == 0, out.stderr
    folder = tmp_path / "results" / "wide"
    assert out.stdout.strip() == str(folder)
    assert sorted(p.name for p in folder.iterdir()) == sorted(FILES)
    assert (folder / "report.txt").read_text() == (sweep / "share" / "output" / "wide" / "report.txt").read_text()
    for name in FILES:
        assert (folder / name).stat().st_mode & 0o777 == 0o644, name

    # The model is safetensors (no pickle): readable by the safetensors library alone.
    with safe_open(str(folder / MODEL_FILE), framework="pt") as f:
        header = json.loads(f.metadata()[HEADER_KEY])
        assert header["state"]["run"] == "wide" and header["state"]["hparams"]["hidden"] == [48, 24]
        assert len(header["state"]["applied"]) == 6
        assert {"model.net.0.weight", "norm.mean", "norm.m2", "norm.count"} <= set(f.keys())

    # Score a copy of the user's dataset folder (no manifest: staged and validated like seed does).
    src = tmp_path / "data"
    shutil.copytree(dataset_src, src, ignore=shutil.ignore_patterns("manifest.json"))
    scores_file = tmp_path / "scores.parquet"
    out = workload_cmd("score", "--model", str(folder / MODEL_FILE), "--datasets", str(src), "--days", "testing",
                       "--out", str(scores_file))
    assert out.returncode == 0, out.stderr
    assert not (src / "manifest.json").exists(), "score must not write into the user's folder"
    scores = pd.read_parquet(scores_file)
    assert list(scores.columns) == ["TRANSACTION_ID", "TX_DATETIME", "score", "rank", "alert_top100_cards",
                                    "alert_1pct_fpr"]
    test = pd.concat([pd.read_parquet(p) for p in sorted((src / "testing").glob("*.parquet"))])
    assert sorted(scores["TRANSACTION_ID"]) == sorted(test[schema.TRANSACTION_ID])
    labelled = scores.merge(test[[schema.TRANSACTION_ID, schema.TX_FRAUD]], on=schema.TRANSACTION_ID)
    ap = metrics.average_precision(labelled["score"].to_numpy(), labelled[schema.TX_FRAUD].to_numpy())
    final = json.loads((folder / "metrics.jsonl").read_text().splitlines()[-1])
    assert ap == pytest.approx(final["average_precision"], abs=1e-6)
    assert f"average precision (AUPRC) on testing data: {final['average_precision']:.4f}" in \
        (folder / "report.txt").read_text()


def test_export_is_idempotent_and_the_loaded_model_is_the_checkpoint(sweep: Path, tmp_path: Path, capsys) -> None:
    for _ in range(2):
        code, _, err = in_process(capsys, "export", "--share", str(sweep / "share"), "--run", "main", "--to",
                                  str(tmp_path))
        assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "main").iterdir()) == sorted(FILES), "no temporary files left"
    trainer = load_model(tmp_path / "main" / MODEL_FILE)
    state = CheckpointStore(sweep / "share" / "output" / "main").load().state
    assert trainer.applied == state["applied"] and trainer.history == state["history"]
    for key, tensor in state["model"].items():
        assert torch.equal(trainer.model.state_dict()[key], tensor), key
    for key, tensor in state["norm"].items():
        assert torch.equal(trainer.norm.state()[key], tensor), key


def test_export_to_a_bucket_uploads_once(sweep: Path, bucket, emulator: str, tmp_path: Path, capsys) -> None:
    uri = f"gs://{bucket.name}/results/"
    out = workload_cmd("export", "--share", str(sweep / "share"), "--run", "lr3", "--to", uri,
                       env={"STORAGE_EMULATOR_HOST": emulator})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"gs://{bucket.name}/results/lr3/"
    assert "5 object(s) uploaded, 0 already there" in out.stderr
    assert "Warning" not in out.stderr, out.stderr
    objects = {b.name: b for b in bucket.client.list_blobs(bucket)}
    assert sorted(objects) == sorted(f"results/lr3/{name}" for name in FILES)
    code, _, err = in_process(capsys, "export", "--share", str(sweep / "share"), "--run", "lr3", "--to", str(tmp_path))
    assert code == 0, err
    for name in FILES:
        assert objects[f"results/lr3/{name}"].download_as_bytes() == (tmp_path / "lr3" / name).read_bytes(), name
    code, _, err = in_process(capsys, "export", "--share", str(sweep / "share"), "--run", "lr3", "--to", uri)
    assert code == 0 and "0 object(s) uploaded, 5 already there" in err, err


@pytest.mark.parametrize(("args", "message"), [
    (["export", "--run", "nope", "--to", "{tmp}/x"], "--run nope: no such run under"),
    (["export", "--run", "../main", "--to", "{tmp}/x"], "--run '../main' is not allowed"),
    (["export", "--run", "main"], "--to is required (or env OUTPUT_URI)"),
    (["export", "--run", "main", "--to", "gs://Bad_Bucket/x"], "'Bad_Bucket' is not a bucket name"),
    (["export", "--run", "main", "--to", "s3://bucket/x"], "only gs://bucket/prefix or a local folder"),
    (["score", "--model", "{ckpt}", "--datasets", "{data}", "--out", "{tmp}/s.parquet"], "not a readable model file"),
    (["score", "--model", "{tmp}/none.safetensors", "--datasets", "{data}"], "cannot read it"),
])
def test_bad_export_and_score_arguments_get_one_line(sweep: Path, dataset_src: Path, tmp_path: Path, capsys,
                                                     monkeypatch, args: list[str], message: str) -> None:
    monkeypatch.delenv("OUTPUT_URI", raising=False)
    ckpt = next((sweep / "share" / "output" / "main" / "checkpoints").glob("ckpt-*.pt"))  # a pickle-zip: refused
    args = [a.format(tmp=tmp_path, ckpt=ckpt, data=dataset_src) for a in args]
    code, _, err = in_process(capsys, *args, *(["--share", str(sweep / "share")] if args[0] == "export" else []))
    errors = [line for line in err.splitlines() if " ERROR " in line]
    assert code == 2 and len(errors) == 1 and message in errors[0], err
    assert "Traceback" not in err


def test_the_worker_that_finishes_a_run_exports_it_to_OUTPUT_URI(cluster: Cluster, bucket, emulator: str) -> None:
    cluster.env_extra.update({"STORAGE_EMULATOR_HOST": emulator, "OUTPUT_URI": f"gs://{bucket.name}/out"})
    cluster.seed({"a": {"epochs": 2}, "b": {"epochs": 2, "hidden": [8]}})
    cluster.start_worker("w1")
    cluster.start_worker("w2")
    assert cluster.wait_all() == [0, 0], cluster.log("w1") + cluster.log("w2")
    logs = cluster.log("w1") + cluster.log("w2")
    for run in ("a", "b"):
        exports = re.findall(rf"exported run {run} \((\d+) day\(s\) applied", logs)
        assert exports == ["6"], f"run {run}: one export, by the worker that acked its last day; saw {exports}"
        blob = bucket.blob(f"out/{run}/{MODEL_FILE}")
        path = cluster.share.parent / f"{run}.safetensors"
        blob.download_to_filename(path)
        trainer = load_model(path)
        final = cluster.final_state(run)
        assert trainer.applied == final["applied"]
        assert all(torch.equal(trainer.model.state_dict()[k], v) for k, v in final["model"].items())
        assert bucket.blob(f"out/{run}/report.txt").download_as_text().count("training dataset: ") == 6


def test_a_peer_claiming_the_last_day_between_an_ack_and_its_check_exports_nothing_early(
        cluster: Cluster, bucket, emulator: str) -> None:
    """W1 acks day 5 and freezes before deciding whether that ack finished the run; W2 claims day 6 (nothing
    of the run is pending any more) and freezes; W1 goes on. Asked then, "nothing pending" would export the run
    at 5 days (seen on a loaded machine); the ack's own count says a day was left, so only W2 exports, at 6."""
    cluster.env_extra.update({"STORAGE_EMULATOR_HOST": emulator, "OUTPUT_URI": f"gs://{bucket.name}/out",
                              "LEASE_TTL_SECONDS": "300"})  # W2's lease outlives its freeze
    cluster.seed({"a": {"epochs": 1, "hidden": [8], "window_days": 1}})
    w1 = cluster.start_worker("w1", WORKLOAD_FAULT="acked:5", WORKLOAD_FAULT_ACTION="stop")
    cluster.wait_for(lambda: is_stopped(w1), timeout_s=120, what="W1 to freeze after acking day 5")
    w2 = cluster.start_worker("w2", WORKLOAD_FAULT="claimed:1", WORKLOAD_FAULT_ACTION="stop")
    cluster.wait_for(lambda: is_stopped(w2), timeout_s=60, what="W2 to freeze holding day 6")
    assert "claimed a/training/2018-04-06.parquet" in cluster.log("w2")
    w1.send_signal(signal.SIGCONT)
    waiting = "nothing to claim (0 pending behind peers, 1 leased)"
    cluster.wait_for(lambda: waiting in cluster.log("w1") or w1.poll() is not None, timeout_s=60,
                     what="W1 to go on to its next claim")
    w2.send_signal(signal.SIGCONT)
    assert cluster.wait_all() == [0, 0], cluster.log("w1") + cluster.log("w2")
    assert "exported run" not in cluster.log("w1"), cluster.log("w1")
    assert re.findall(r"exported run a \((\d+) day\(s\) applied", cluster.log("w2")) == ["6"], cluster.log("w2")
    assert load_model_from(bucket, "a", cluster.share.parent).applied == cluster.final_state("a")["applied"]


def load_model_from(bucket, run: str, folder: Path):
    path = folder / f"{run}.safetensors"
    bucket.blob(f"out/{run}/{MODEL_FILE}").download_to_filename(path)
    return load_model(path)


def test_a_failed_export_warns_and_costs_no_item_anything(cluster: Cluster, emulator: str) -> None:
    cluster.env_extra.update({"STORAGE_EMULATOR_HOST": emulator, "OUTPUT_URI": "gs://no-such-bucket/out"})
    cluster.seed({"main": {"epochs": 2}})
    cluster.start_worker("w")
    assert cluster.wait_all() == [0], cluster.log("w")
    c = cluster.counts()
    assert (c.done, c.dead, c.total) == (6, 0, 6)
    log = cluster.log("w")
    assert "run main is trained, but exporting it to gs://no-such-bucket/out (OUTPUT_URI) failed" in log, log
    assert "python -m workload export --run main --to gs://no-such-bucket/out" in log
    assert np.isfinite(cluster.final_state()["history"][-1]["average_precision"])


def test_score_refuses_a_model_from_other_features_or_another_tool(sweep: Path, dataset_src: Path, tmp_path: Path,
                                                                  capsys) -> None:
    from safetensors.torch import save_file

    from workload.model.export import model_bytes

    state = CheckpointStore(sweep / "share" / "output" / "main").load().state
    other = tmp_path / "other.safetensors"
    other.write_bytes(model_bytes({**state, "feature_names": ["amount", *state["feature_names"][1:]]}))
    older = tmp_path / "older.safetensors"  # the same feature names, computed another way
    older.write_bytes(model_bytes({**state, "feature_version": "1-delay-in-days"}))
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    cases = ((other, "was trained on features ['amount', "), (foreign, "without the 'spot_trainer' header"),
             (older, "was trained on feature version '1-delay-in-days'; this code computes version "
                     f"{features.FEATURE_VERSION!r}: score with the code version that trained it"))
    for model, message in cases:
        code, _, err = in_process(capsys, "score", "--model", str(model), "--datasets", str(dataset_src), "--out",
                                  str(tmp_path / "s.parquet"))
        assert code == 2 and message in err, err
    assert not (tmp_path / "s.parquet").exists()
