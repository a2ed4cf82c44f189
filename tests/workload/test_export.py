"""Results out of the share: a sweep trained by `local`, exported to a folder and to a real Cloud
Storage API server, scored back to the report's figures; the worker's OUTPUT_URI hook."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import zygote
from harness import ROOT, Cluster, built_once, is_stopped
from safetensors import safe_open

from workload import cli
from workload.data import features, schema
from workload.model import metrics
from workload.model.export import (
    HEADER_KEY,
    MODEL_FILE,
    ExportError,
    ModelFileError,
    RunExport,
    _safetensors_metadata,
    collect,
    export_finished_run,
    export_run,
    load_model,
    model_bytes,
    model_state,
    parse_gs_uri,
    write_dir,
    write_gs,
)
from workload.model.hparams import HParams
from workload.model.lineage import checkpoint_of
from workload.model.trainer import Trainer
from workload.runtime.redis_server import free_port
from workload.share.checkpoint import CheckpointStore

pytestmark = pytest.mark.timeout(300)

SWEEP = {"main": {"epochs": 2}, "wide": {"epochs": 2, "hidden": [48, 24]}, "lr3": {"epochs": 2, "lr": 0.003}}
FILES = ("report.txt", "metrics.jsonl", "metrics.png", "pr_curve.png", MODEL_FILE, "report.html")


def workload_cmd(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return zygote.run(["workload", *args], {**os.environ, **(env or {})}, ROOT, timeout)


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
    assert list(scores.columns) == ["TRANSACTION_ID", "CUSTOMER_ID", "TX_DATETIME", "score", "rank",
                                    "alert_top100_cards", "alert_1pct_fpr"]
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
    assert f"{len(FILES)} object(s) uploaded, 0 already there" in out.stderr
    assert "Warning" not in out.stderr, out.stderr
    objects = {b.name: b for b in bucket.client.list_blobs(bucket)}
    assert sorted(objects) == sorted(f"results/lr3/{name}" for name in FILES)
    code, _, err = in_process(capsys, "export", "--share", str(sweep / "share"), "--run", "lr3", "--to", str(tmp_path))
    assert code == 0, err
    for name in FILES:
        assert objects[f"results/lr3/{name}"].download_as_bytes() == (tmp_path / "lr3" / name).read_bytes(), name
    code, _, err = in_process(capsys, "export", "--share", str(sweep / "share"), "--run", "lr3", "--to", uri)
    assert code == 0 and f"0 object(s) uploaded, {len(FILES)} already there" in err, err


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


def test_a_run_whose_last_ack_reply_was_lost_is_still_exported_once(cluster: Cluster, tmp_path: Path) -> None:
    """The worker's client reaches Redis through a proxy that swallows the reply to the run's last ack (Redis ran
    it: nothing of the run left) and closes the connection. The client sends the ack again and hears "already
    acked, by you": the run is still exported to OUTPUT_URI, once, from the share's complete newest checkpoint."""
    from test_queue_lost_reply import ReplyDropper

    out = tmp_path / "results"
    cluster.env_extra.update(OUTPUT_URI=str(out))
    cluster.seed({"a": {"epochs": 1, "hidden": [8], "window_days": 1}})
    proxy = ReplyDropper(cluster.server.port)
    try:
        proxy.arm(match=b"*3\r\n:1\r\n$2\r\nw1\r\n:0\r\n")  # {acked, by w1, 0 of the run left}
        cluster.start_worker("w1", REDIS_URL=f"redis://127.0.0.1:{proxy.port}/0")
        assert cluster.wait_all() == [0], cluster.log("w1")
    finally:
        proxy.close()
    log = cluster.log("w1")
    assert proxy.dropped and "a/training/2018-04-06.parquet: the reply to our ack was lost" in log, log
    assert re.findall(r"exported run a \((\d+) day\(s\) applied", log) == ["6"], log
    assert load_model(out / "a" / MODEL_FILE).applied == cluster.final_state("a")["applied"]


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


# -- in the pytest process: what the subprocess tests above also see, for mutation testing's sake -------------------
def fresh_state(**changes) -> dict:
    """An untrained trainer's state (a real Trainer, small), with `changes` on top."""
    trainer = Trainer("main", HParams(hidden=(8,)), features.FEATURE_NAMES, feature_version=features.FEATURE_VERSION)
    return {**checkpoint_of(trainer), **changes}


def copy_run(sweep: Path, run: str, share: Path) -> CheckpointStore:
    """The sweep's `run` copied onto a share of its own (a test may add checkpoints to it)."""
    shutil.copytree(sweep / "share" / "output" / run, share / "output" / run)
    return CheckpointStore(share / "output" / run)


def save_newest(store: CheckpointStore, state: dict) -> None:
    """`state` as the run's newest checkpoint, under a new lease (as a worker leaves one)."""
    token = store.highest_token() + 1
    assert store.fence(token)
    assert store.save(state, path=store.next_path(token), may_promote=lambda: True, boundary=not state["progress"])


def test_export_in_process_writes_the_shares_report_with_group_readable_files(sweep: Path, tmp_path: Path,
                                                                            caplog) -> None:
    caplog.set_level(logging.INFO, logger="workload.model.export")
    run_dir = sweep / "share" / "output" / "wide"
    where = export_run(sweep / "share", "wide", str(tmp_path / "results"))
    folder = tmp_path / "results" / "wide"
    assert where == str(folder)
    # The report and metrics are the ones the workers rendered from the same (newest) checkpoint.
    for name in ("report.txt", "metrics.jsonl", "metrics.png", "pr_curve.png", "report.html"):
        assert (folder / name).read_bytes() == (run_dir / name).read_bytes(), name
    for name in FILES:
        assert (folder / name).stat().st_mode & 0o777 == 0o644, name
    assert f"exported run wide (6 day(s) applied: report.txt, metrics.jsonl, {MODEL_FILE}, metrics.png, " \
           f"pr_curve.png, report.html) to {folder}" in caplog.messages
    assert collect(sweep / "share", "wide").days_applied == 6


def test_the_exported_report_lists_the_runs_rewinds_and_pruned_checkpoints(sweep: Path, tmp_path: Path) -> None:
    store = copy_run(sweep, "main", tmp_path / "share")
    state = store.load().state
    # The first day's checkpoint is no longer in the manifest (pruned by code that kept only the newest ones).
    first = state["history"][0]["checkpoint"]
    manifest = json.loads(store.manifest.read_text())
    store.manifest.write_text(json.dumps({"entries": [e for e in manifest["entries"] if e["file"] != first]}))
    rewind = {"day": state["applied"][2], "reapplied": state["applied"][3:], "from": "ckpt-00000003-t5.pt",
              "why": f"{state['applied'][2]} arrived after {state['applied'][-1]} was applied (a backfill)",
              "time": "2018-04-10 12:00:00 UTC"}
    save_newest(store, {**state, "reapplied": [rewind]})
    export_run(tmp_path / "share", "main", str(tmp_path / "results"))
    report = (tmp_path / "results" / "main" / "report.txt").read_text()
    assert f"re-applied at 2018-04-10 12:00:00 UTC: {', '.join(state['applied'][3:])}, because {rewind['why']}; " \
           f"the run went back to ckpt-00000003-t5.pt and applied {state['applied'][2]} and every later day in " \
           "date order" in report, report
    lines = [line for line in report.splitlines() if line.startswith("model checkpoint: ")]
    assert len(lines) == 6 and [line.endswith("(pruned: only the newest checkpoints are kept)") for line in lines] == \
        [True, False, False, False, False, False], lines


def test_an_unknown_run_is_refused_naming_the_runs_there_are(tmp_path: Path) -> None:
    share = tmp_path / "share"
    with pytest.raises(ExportError) as refused:
        collect(share, "main")  # a share with no output at all
    assert str(refused.value) == f"--run main: no such run under {share / 'output'} (runs with output: none)"
    for run in ("b", "a"):
        (share / "output" / run).mkdir(parents=True)
    (share / "output" / "notes.txt").write_text("not a run")
    with pytest.raises(ExportError) as refused:
        collect(share, "main")
    assert str(refused.value) == f"--run main: no such run under {share / 'output'} (runs with output: ['a', 'b'])"


def test_a_run_without_a_finished_day_has_nothing_to_export(tmp_path: Path) -> None:
    share = tmp_path / "share"
    run_dir = share / "output" / "main"
    run_dir.mkdir(parents=True)
    expected = f"--run main: no checkpoint with a finished day under {run_dir / 'checkpoints'}; nothing trained to " \
               "export yet"
    with pytest.raises(ExportError) as refused:
        collect(share, "main")  # seeded, no checkpoint yet
    assert str(refused.value) == expected
    save_newest(CheckpointStore(run_dir), fresh_state())  # a checkpoint of no day
    with pytest.raises(ExportError) as refused:
        collect(share, "main")
    assert str(refused.value) == expected


def test_a_destination_with_another_scheme_in_any_letter_case_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # were it taken for a folder, it would be made here
    for to in ("S3://bucket/x", "HTTPS://example.com/x", "GS://bucket/x"):
        with pytest.raises(ExportError) as refused:
            export_run(tmp_path / "share", "main", to)
        assert str(refused.value) == f"--to {to}: only gs://bucket/prefix or a local folder is supported"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("uri", "parsed"), [
    ("gs://bucket", ("bucket", "")), ("gs://bucket/", ("bucket", "")), ("gs://bucket/a/b/", ("bucket", "a/b")),
    ("gs://my.bucket_1/results", ("my.bucket_1", "results")), ("gs://bucket//Xmas/X/", ("bucket", "Xmas/X")),
])
def test_gs_uris_give_the_bucket_and_a_prefix_without_slashes_at_either_end(uri: str, parsed: tuple) -> None:
    assert parse_gs_uri(uri) == parsed


@pytest.mark.parametrize(("uri", "message"), [
    ("gs://Bad_Bucket/x", "'gs://Bad_Bucket/x': 'Bad_Bucket' is not a bucket name; expected gs://BUCKET[/PREFIX] "
                          "with a bucket of lowercase letters, digits, '-', '_', '.'"),
    ("gs://", "'gs://': '' is not a bucket name; expected gs://BUCKET[/PREFIX] with a bucket of lowercase "
              "letters, digits, '-', '_', '.'"),
    ("gs://bucket/a//b", "'gs://bucket/a//b': the prefix 'a//b' has an empty, '.' or '..' part"),
    ("gs://bucket/a/./b/", "'gs://bucket/a/./b/': the prefix 'a/./b' has an empty, '.' or '..' part"),
    ("gs://bucket/../other", "'gs://bucket/../other': the prefix '../other' has an empty, '.' or '..' part"),
])
def test_a_bad_gs_uri_is_refused_naming_it_and_the_rule(uri: str, message: str) -> None:
    with pytest.raises(ExportError) as refused:
        parse_gs_uri(uri)
    assert str(refused.value) == message


def test_write_dir_makes_group_readable_files_and_names_a_folder_it_cannot_make(tmp_path: Path) -> None:
    export = RunExport(run="main", files={"report.txt": b"report\n", MODEL_FILE: b"model"}, days_applied=1)
    assert write_dir(export, tmp_path / "results") == str(tmp_path / "results" / "main")
    for name, data in export.files.items():
        path = tmp_path / "results" / "main" / name
        assert path.read_bytes() == data and path.stat().st_mode & 0o777 == 0o644, name
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ExportError) as refused:
        write_dir(export, blocker)
    assert str(refused.value) == f"--to {blocker}: cannot write {blocker / 'main'} (Not a directory)"


def test_a_bucket_export_uploads_what_changed_by_checksum_with_content_types(bucket, caplog) -> None:
    caplog.set_level(logging.INFO, logger="workload.model.export")
    files = {"report.txt": b"report\n", "metrics.jsonl": b"{}\n", MODEL_FILE: b"model", "metrics.png": b"png"}
    export = RunExport(run="main", files=files, days_applied=1)
    uri = f"gs://{bucket.name}"  # no prefix: the run's folder is at the bucket's top
    assert write_gs(export, uri) == f"gs://{bucket.name}/main/"
    assert caplog.messages[-1] == f"gs://{bucket.name}/main/: 4 object(s) uploaded, 0 already there"
    objects = {b.name: b for b in bucket.client.list_blobs(bucket)}
    assert sorted(objects) == sorted(f"main/{name}" for name in files)
    assert objects["main/report.txt"].content_type.startswith("text/plain")
    assert objects["main/metrics.jsonl"].content_type == "application/x-ndjson"
    assert objects["main/metrics.png"].content_type == "image/png"
    assert objects[f"main/{MODEL_FILE}"].content_type == "application/octet-stream"

    write_gs(export, uri)
    assert caplog.messages[-1] == f"gs://{bucket.name}/main/: 0 object(s) uploaded, 4 already there"
    bucket.blob("main/metrics.jsonl").delete()  # gone, behind a file that is still there
    bucket.blob(f"main/{MODEL_FILE}").upload_from_string(b"MODEL")  # changed, at the same size
    write_gs(export, uri)
    assert caplog.messages[-1] == f"gs://{bucket.name}/main/: 2 object(s) uploaded, 2 already there"
    for name, data in files.items():
        assert bucket.blob(f"main/{name}").download_as_bytes() == data, name


def test_a_bucket_export_that_may_not_list_uploads_every_file(bucket, caplog, monkeypatch) -> None:
    """Listing only spares uploads: a role that may write objects but not list them (no storage.objects.list)
    still exports, uploading every file, one already there with the same bytes included."""
    from google.api_core import exceptions

    caplog.set_level(logging.INFO, logger="workload.model.export")
    files = {"report.txt": b"report\n", MODEL_FILE: b"model"}
    bucket.blob("out/main/report.txt").upload_from_string(files["report.txt"])  # would be spared if listed
    denial = "exporter@p.iam.gserviceaccount.com does not have storage.objects.list access to the bucket."

    def list_blobs(*args, **kwargs):  # as the client's iterator does: the 403 comes with the first page
        raise exceptions.Forbidden(denial)
        yield

    monkeypatch.setattr(bucket.client, "list_blobs", list_blobs)
    export = RunExport(run="main", files=files, days_applied=1)
    assert write_gs(export, f"gs://{bucket.name}/out", client=bucket.client) == f"gs://{bucket.name}/out/main/"
    said = [r.getMessage() for r in caplog.records if r.name == "workload.model.export"]
    assert said == [f"gs://{bucket.name}/out/main/: cannot list objects ({denial}); uploading every file",
                    f"gs://{bucket.name}/out/main/: 2 object(s) uploaded, 0 already there"]
    for name, data in files.items():
        assert bucket.blob(f"out/main/{name}").download_as_bytes() == data, name


def test_a_bucket_export_that_fails_says_where_and_why_in_one_line(emulator: str, monkeypatch) -> None:
    export = RunExport(run="main", files={"report.txt": b"report\n"}, days_applied=1)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", emulator)
    with pytest.raises(ExportError) as refused:
        write_gs(export, "gs://no-such-bucket/out")
    # What Cloud Storage said, once: the status by name, then its message (not "404" again).
    assert re.fullmatch(r"gs://no-such-bucket/out: Cloud Storage refused the export of run main \(NotFound: GET "
                        r"http://\S+: [^\n]+\)", str(refused.value)), str(refused.value)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(Path("/nonexistent/key.json")))
    with pytest.raises(ExportError) as refused:
        write_gs(export, "gs://bucket/out")
    assert str(refused.value) == ("gs://bucket/out: cannot export run main (DefaultCredentialsError: File "
                                  "/nonexistent/key.json was not found.)")


def test_the_worker_hook_exports_to_OUTPUT_URI_only_when_set_and_only_warns_on_failure(
        sweep: Path, bucket, caplog, monkeypatch) -> None:
    caplog.set_level(logging.INFO, logger="workload.model.export")
    share = sweep / "share"
    monkeypatch.delenv("OUTPUT_URI", raising=False)
    export_finished_run(share, "main")
    assert caplog.records == [] and list(bucket.client.list_blobs(bucket)) == []

    monkeypatch.setenv("OUTPUT_URI", f"gs://{bucket.name}/out")
    days = list(CheckpointStore(share / "output" / "main").load().state["applied"])
    export_finished_run(share, "main", [*days, "training/2018-04-09.parquet"])  # the share holds less than the plan
    assert list(bucket.client.list_blobs(bucket)) == [], "a run short of a day of its plan was exported"
    assert [r.getMessage() for r in caplog.records if r.name == "workload.model.export"] == [
        f"run main: not exported to gs://{bucket.name}/out: the share's newest checkpoint records {len(days)} of the "
        f"run's {len(days) + 1} day(s) (a rewind under way, or the output restored from an older backup?); the worker "
        "that applies the last day exports it"]
    caplog.clear()
    export_finished_run(share, "main", days)
    assert sorted(b.name for b in bucket.client.list_blobs(bucket)) == sorted(f"out/main/{name}" for name in FILES)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

    monkeypatch.setenv("OUTPUT_URI", "gs://no-such-bucket/out")
    export_finished_run(share, "main")  # no exception: the day is trained and acked already
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(
        "run main is trained, but exporting it to gs://no-such-bucket/out (OUTPUT_URI) failed: "
        "gs://no-such-bucket/out: Cloud Storage refused the export of run main (NotFound: ") and warnings[0].endswith(
        ". Retry by hand: python -m workload export --run main --to gs://no-such-bucket/out"), warnings


# -- the model file ---------------------------------------------------------------------------------------------------
def test_a_mid_shard_state_is_not_exported() -> None:
    progress = {"shard": "training/2018-04-03.parquet", "epoch": 0, "batch": 1}
    with pytest.raises(ValueError) as refused:
        model_bytes(fresh_state(progress=progress))
    assert str(refused.value) == f"state is mid-way through {progress}; export a shard-boundary checkpoint"


def test_the_model_file_reads_back_every_entry_but_training_only_ones() -> None:
    state = fresh_state(applied=["training/2018-04-01.parquet"], extra=torch.arange(3.0))  # a tensor of its own
    back = model_state(model_bytes(state), "test")
    assert sorted(back) == sorted(set(state) - {"optimizer", "rng", "progress"})
    assert torch.equal(back["extra"], torch.arange(3.0))
    for group in ("model", "averaged", "norm", "calibration"):
        assert back[group].keys() == state[group].keys(), group
        assert all(torch.equal(back[group][k], t) for k, t in state[group].items()), group
    assert {k: back[k] for k in ("run", "hparams", "feature_names", "feature_version", "applied", "format")} == \
        {k: state[k] for k in ("run", "hparams", "feature_names", "feature_version", "applied", "format")}


def test_the_same_state_gives_the_same_file_whatever_order_its_entries_were_built_in() -> None:
    """The header is canonical JSON: an unchanged model has an unchanged checksum, so it is not uploaded again."""
    state = fresh_state()
    reordered = {**state, "hparams": dict(reversed(state["hparams"].items()))}
    assert model_bytes(reordered) == model_bytes(state)


def test_load_model_refuses_what_it_cannot_read_or_rebuild_in_one_line(tmp_path: Path) -> None:
    from safetensors.torch import save as save_safetensors

    path = tmp_path / "m.safetensors"
    with pytest.raises(ModelFileError) as refused:
        load_model(path)
    assert str(refused.value) == f"--model {path}: cannot read it (No such file or directory)"

    path.write_bytes(b"not a model")
    with pytest.raises(ModelFileError) as refused:
        load_model(path)
    assert str(refused.value).startswith(f"--model {path}: not a readable model file (")
    assert str(refused.value).endswith(f"); expected the {MODEL_FILE} that `python -m workload export` writes")

    path.write_bytes(save_safetensors({"w": torch.zeros(2)}, metadata={HEADER_KEY: "{not json"}))
    with pytest.raises(ModelFileError, match=r": not a readable model file \(JSONDecodeError: "):
        load_model(path)

    path.write_bytes(save_safetensors({}, metadata={"format": "pt"}))  # another tool's file, and no tensors
    with pytest.raises(ModelFileError) as refused:
        load_model(path)
    assert str(refused.value) == f"--model {path}: a safetensors file without the 'spot_trainer' header; not a " \
                                 "model written by `python -m workload export`"

    path.write_bytes(model_bytes(fresh_state(hparams={**HParams(hidden=(8,)).to_dict(), "lr": 5})))
    with pytest.raises(ModelFileError) as refused:
        load_model(path)
    assert str(refused.value) == f"--model {path}: cannot rebuild the model from it (ValueError: --model {path}: " \
                                 "hparams: lr=5.0 is not allowed; must be 0 < lr < 1 (a number))"

    path.write_bytes(model_bytes(fresh_state(format=1)))  # a model of older code
    with pytest.raises(ModelFileError) as refused:
        load_model(path)
    assert str(refused.value) == f"--model {path}: cannot rebuild the model from it (ValueError: checkpoint format 1 " \
                                 "is not supported (readable: 2, 3, 4, 5); start a new run with this code version)"

    path.write_bytes(model_bytes(fresh_state()))
    assert load_model(path).hp == HParams(hidden=(8,))


def test_the_safetensors_header_length_is_checked_against_the_data() -> None:
    header = json.dumps({"__metadata__": {"k": "v"}}).encode()
    assert _safetensors_metadata(len(header).to_bytes(8, "little") + header) == {"k": "v"}  # exactly what is there
    for data in (bytes(8) + header,  # a length of 0
                 (len(header) + 1).to_bytes(8, "little") + header,  # one byte more than there is
                 (len(header) + 8).to_bytes(8, "little") + header + b"        "[:4]):  # past the end, by 4
        with pytest.raises(ValueError, match="^truncated safetensors header$"):
            _safetensors_metadata(data)
