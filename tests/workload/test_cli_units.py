"""cli.py's pieces in this process, against a real Redis and real files: the worker's settings from its
environment, the runs and the simulator's spec a seed reads, how a user's files are read, where a dataset
comes from, the queue a command opens, `status` and `requeue` line by line, `wait-drained`'s verdict.
`seed` in this process: the reading a published export keeps, where the simulator stages, the runs' hyperparameters
in Redis, what the scheduled loader records, and which Jobs `launch` then posts to an API server on loopback
(apiserver.py).
`worker` whole, in this process: it trains a seeded queue, refuses a GPU it cannot use, gives up on an
unreachable Redis after its retry budget, and stops on SIGTERM.
main's answer to a Redis that wants a password, refuses one, or sends another error reply.
(test_cli.py drives whole commands; `make mutation` runs these for each of cli.py's mutants.)"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest
import redis
import torch
from apiserver import ApiServer, api_server
from exports import BANK_COLUMNS, bank_export, one_error_line, write_mapping

from workload import cli
from workload.core import preemption
from workload.core.errors import EXIT_GPU_UNUSABLE, EXIT_INFRA, EXIT_TERMINATED
from workload.data import dataset as ds
from workload.data import features, simulator
from workload.data.dayfile import DatasetError, read_transactions
from workload.data.manifest import MANIFEST, read_manifest
from workload.data.reading import Reading
from workload.model.hparams import HParams, default_seed, parse_runs
from workload.queue import plan
from workload.queue.workqueue import CALL_TIMEOUT_S, Item, LaunchRequest, WorkQueue, connect
from workload.runtime import gpu, launch
from workload.runtime.redis_server import RedisServer
from workload.share.checkpoint import CheckpointStore
from workload.share.fsutil import tmp_dir_for

pytestmark = pytest.mark.timeout(120)

# Every variable cli.py reads: each test starts with none of them set, whatever the shell running pytest has.
ENV = ("SHARE_DIR", "REDIS_URL", "REDIS_PASSWORD", "QUEUE_PREFIX", "MAX_ATTEMPTS", "RUNS_FILE", "DATASETS_SRC",
       "DATASET", "DATASET_PRESET", "DATASET_COLUMNS", "DATASET_DATETIME_FORMAT", "DATASET_TIMEZONE", "WORKER_ID",
       "LEASE_TTL_SECONDS",
       "CHECKPOINT_INTERVAL_SECONDS", "TORCH_THREADS", "OUTPUT_URI", "REDIS_RETRY_SECONDS", "PLOT_INTERVAL_SECONDS",
       "INFRA_GIVE_UP_SECONDS", "STALL_SECONDS", "TERM_GRACE_SECONDS", "LOG_LEVEL", "PACK_RUNS", "STEPS_PER_REPLAY")
SECONDS = {"REDIS_RETRY_SECONDS": "redis_retry_s", "PLOT_INTERVAL_SECONDS": "plot_interval_s",
           "INFRA_GIVE_UP_SECONDS": "infra_give_up_s", "STALL_SECONDS": "stall_s",
           "TERM_GRACE_SECONDS": "term_grace_s"}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    for handler in logging.root.handlers[:]:  # cli.setup_logging's, bound to capsys's stream (closed after the
        if type(handler) is logging.StreamHandler:  # test); pytest's own handlers are subclasses: kept
            logging.root.removeHandler(handler)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield s
    s.kill()


@pytest.fixture
def redis_env(server: RedisServer, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
              tmp_path: Path) -> str:
    """The module's Redis in the environment, under a queue prefix of this test's own; returns the prefix."""
    prefix = f"t{abs(hash(request.node.nodeid)) % 10**9}"
    for name, value in (("REDIS_URL", server.url), ("REDIS_PASSWORD", server.password), ("QUEUE_PREFIX", prefix),
                        ("SHARE_DIR", str(tmp_path / "share"))):
        monkeypatch.setenv(name, value)
    return prefix


def queue_of(server: RedisServer, prefix: str, max_attempts: int = 5) -> WorkQueue:
    return WorkQueue(connect(server.url, server.password), prefix, max_attempts=max_attempts)


def parse(*argv: str):
    return cli.parser().parse_args(list(argv))


Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    """`python -m workload ARGS` in this process: exit status (argparse's SystemExit included), stdout, stderr."""

    def go(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:
            code = exc.code
        out = capsys.readouterr()
        return code, out.out, out.err

    return go


# -- env_seconds, worker_config ----------------------------------------------------------------------
def test_env_seconds_reads_a_positive_number_or_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.env_seconds("STALL_SECONDS", 7) == 7
    for text, value in (("2.5", 2.5), ("0.001", 0.001), ("90", 90.0), ("1e3", 1000.0)):
        monkeypatch.setenv("STALL_SECONDS", text)
        assert cli.env_seconds("STALL_SECONDS", 7) == value
    for text in ("soon", "", "5s"):
        monkeypatch.setenv("STALL_SECONDS", text)
        with pytest.raises(cli.UsageError) as err:
            cli.env_seconds("STALL_SECONDS", 7)
        assert str(err.value) == f"STALL_SECONDS={text!r} is not a number of seconds"
    for text in ("0", "-1", "-0.5", "nan", "NaN"):  # a NaN budget never runs out: retries or waits forever
        monkeypatch.setenv("STALL_SECONDS", text)
        with pytest.raises(cli.UsageError) as err:
            cli.env_seconds("STALL_SECONDS", 7)
        assert str(err.value) == f"STALL_SECONDS={text!r} is not allowed: it must be > 0"


def test_worker_config_defaults() -> None:
    cfg = cli.worker_config(parse("worker"))
    assert cfg.share == Path("/mnt/share") and cfg.redis_url == "redis://localhost:6379/0"
    assert cfg.redis_password is None and cfg.prefix == "spottrain"
    assert cfg.worker_id == f"{socket.gethostname()}-{os.getpid()}"
    assert (cfg.lease_ttl_s, cfg.checkpoint_interval_s, cfg.max_attempts) == (30.0, 10.0, 5)
    assert (cfg.redis_retry_s, cfg.plot_interval_s, cfg.infra_give_up_s, cfg.stall_s) == (300, 30, 300, 300)
    assert cfg.term_grace_s == preemption.STOP_WITHIN_S == 13
    assert cfg.pack_runs == 1  # one item at a time: today's path
    assert parse("worker").threads is None
    assert parse("worker").steps_per_replay == 1  # a graph of one step, as measured


def test_worker_config_reads_every_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {"SHARE_DIR": "/data/share", "REDIS_URL": "redis://r:1/2", "REDIS_PASSWORD": "pw", "QUEUE_PREFIX": "q",
              "MAX_ATTEMPTS": "9", "WORKER_ID": "pod-1", "LEASE_TTL_SECONDS": "12.5",
              "CHECKPOINT_INTERVAL_SECONDS": "4", "TORCH_THREADS": "3", "REDIS_RETRY_SECONDS": "11",
              "PLOT_INTERVAL_SECONDS": "12", "INFRA_GIVE_UP_SECONDS": "13", "STALL_SECONDS": "14",
              "TERM_GRACE_SECONDS": "8", "PACK_RUNS": "4", "STEPS_PER_REPLAY": "16"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    args = parse("worker")
    cfg = cli.worker_config(args)
    assert cfg.share == Path("/data/share") and cfg.redis_url == "redis://r:1/2" and cfg.redis_password == "pw"
    assert (cfg.prefix, cfg.worker_id, cfg.max_attempts) == ("q", "pod-1", 9)
    assert (cfg.lease_ttl_s, cfg.checkpoint_interval_s, args.threads, cfg.pack_runs) == (12.5, 4.0, 3, 4)
    assert args.steps_per_replay == 16
    assert {var: getattr(cfg, field) for var, field in SECONDS.items()} == {
        "REDIS_RETRY_SECONDS": 11, "PLOT_INTERVAL_SECONDS": 12, "INFRA_GIVE_UP_SECONDS": 13, "STALL_SECONDS": 14,
        "TERM_GRACE_SECONDS": 8}
    flags = cli.worker_config(parse("worker", "--share", "/s", "--redis-url", "redis://x:3/0", "--queue-prefix", "p",
                                    "--max-attempts", "2", "--worker-id", "me", "--lease-ttl", "6",
                                    "--checkpoint-interval", "1.5", "--pack", "2"))
    assert (flags.share, flags.redis_url, flags.prefix, flags.max_attempts, flags.worker_id, flags.lease_ttl_s,
            flags.checkpoint_interval_s, flags.pack_runs) == (Path("/s"), "redis://x:3/0", "p", 2, "me", 6.0, 1.5,
                                                              2), "flags win"


def test_the_worker_sets_its_processes_steps_a_replay(monkeypatch: pytest.MonkeyPatch, run: Run,
                                                      tmp_path: Path) -> None:
    """`--steps-per-replay` is the process's CUDA step (`gpustep.STEPS_PER_REPLAY`), set before anything trains: here a
    worker that finds no Redis gives up at once, having set it."""
    from workload.model import gpustep

    monkeypatch.setattr(gpustep, "STEPS_PER_REPLAY", 1)  # put back after the test, whatever the worker set
    for name in ("REDIS_RETRY_SECONDS", "INFRA_GIVE_UP_SECONDS"):
        monkeypatch.setenv(name, "0.1")
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        code, _, _ = run("worker", "--share", str(tmp_path), "--redis-url", "redis://127.0.0.1:1/0",
                         "--steps-per-replay", "8")
    finally:  # the worker installed its own: this pytest process keeps its
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert code != 0 and gpustep.STEPS_PER_REPLAY == 8


@pytest.mark.parametrize("name", sorted(SECONDS))
def test_the_worker_refuses_a_bad_seconds_variable_naming_it(name: str, monkeypatch: pytest.MonkeyPatch,
                                                             run: Run) -> None:
    for other, seconds in (("REDIS_RETRY_SECONDS", "0.1"), ("INFRA_GIVE_UP_SECONDS", "0.1")):
        monkeypatch.setenv(other, seconds)  # a worker that wrongly started gives up in a second, not minutes
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv(name, "soon")
    code, out, err = run("worker")
    assert code == 2 and out == ""
    assert one_error_line(err).endswith(f"ERROR workload: {name}='soon' is not a number of seconds")
    monkeypatch.setenv(name, "0")
    code, _, err = run("worker")
    assert code == 2 and one_error_line(err).endswith(f"{name}='0' is not allowed: it must be > 0")


def test_the_worker_refuses_bad_flags_and_variables(monkeypatch: pytest.MonkeyPatch, run: Run) -> None:
    code, _, err = run("worker", "--lease-ttl", "-1")
    assert code == 2 and "argument --lease-ttl: --lease-ttl must be > 0, got '-1'" in err
    code, _, err = run("worker", "--threads", "two")
    assert code == 2 and "argument --threads: --threads must be an integer, got 'two'" in err
    code, _, err = run("worker", "--max-attempts", "0")
    assert code == 2 and "--max-attempts must be > 0, got '0'" in err
    code, _, err = run("worker", "--checkpoint-interval", "0")
    assert code == 2 and "--checkpoint-interval must be > 0, got '0'" in err
    code, _, err = run("worker", "--lease-ttl", "nan")
    assert code == 2 and "argument --lease-ttl: --lease-ttl must be > 0, got 'nan'" in err
    code, _, err = run("worker", "--pack", "0")
    assert code == 2 and "argument --pack: --pack must be > 0, got '0'" in err
    code, _, err = run("worker", "--steps-per-replay", "0")
    assert code == 2 and "argument --steps-per-replay: --steps-per-replay must be > 0, got '0'" in err
    monkeypatch.setenv("PACK_RUNS", "two")
    code, _, err = run("worker")
    assert code == 2 and "env PACK_RUNS must be an integer, got 'two'" in err
    monkeypatch.delenv("PACK_RUNS")
    monkeypatch.setenv("STEPS_PER_REPLAY", "1.5")
    code, _, err = run("worker")
    assert code == 2 and "env STEPS_PER_REPLAY must be an integer, got '1.5'" in err


@pytest.mark.parametrize(("name", "text", "flag", "rule"), [
    ("MAX_ATTEMPTS", "many", "--max-attempts", "must be an integer"),
    ("MAX_ATTEMPTS", "0", "--max-attempts", "must be > 0"),
    ("LEASE_TTL_SECONDS", "soon", "--lease-ttl", "must be a number"),
    ("LEASE_TTL_SECONDS", "-1", "--lease-ttl", "must be > 0"),
    ("CHECKPOINT_INTERVAL_SECONDS", "nan", "--checkpoint-interval", "must be > 0"),
    ("TORCH_THREADS", "-2", "--threads", "must be > 0"),
    ("TORCH_THREADS", "2.5", "--threads", "must be an integer"),
])
def test_a_bad_variable_behind_a_flag_is_a_usage_error_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, run: Run, name: str, text: str, flag: str, rule: str) -> None:
    """The pods set these variables (infra/jobs.py): a bad one is exit 2 and one line, as a bad flag is, not a
    traceback from converting it while the parser is built."""
    monkeypatch.setenv(name, text)
    code, out, err = run("worker")
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1].endswith(f"error: argument {flag}: env {name} {rule}, got {text!r}")
    given = vars(parse("worker", flag, "7"))  # the flag given wins: the variable is not read
    assert given[flag.removeprefix("--").replace("-", "_")] == 7


# -- make_queue ------------------------------------------------------------------------------------
def test_make_queue_connects_with_the_password_prefix_and_retry_asked(server: RedisServer, redis_env: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    args = parse("worker", "--max-attempts", "7")
    q = cli.make_queue(args)
    assert q.redis.ping() and q.keys.items == f"{redis_env}:items"
    assert (q.max_attempts, q.retry_for_s) == (7, 300)
    assert q.redis.connection_pool.connection_kwargs["socket_timeout"] == CALL_TIMEOUT_S
    assert q.redis.connection_pool.connection_kwargs["password"] == server.password
    monkeypatch.setenv("REDIS_RETRY_SECONDS", "42")
    status_args = parse("status")
    q = cli.make_queue(status_args)
    assert (q.max_attempts, q.retry_for_s) == (5, 42), "status has no --max-attempts: 5"
    q = cli.make_queue(status_args, retry_for_s=3.0, call_timeout_s=0.75)
    assert q.retry_for_s == 3.0 and q.redis.connection_pool.connection_kwargs["socket_timeout"] == 0.75
    monkeypatch.setenv("REDIS_PASSWORD", "wrong")
    q = cli.make_queue(status_args, server.password)
    assert q.redis.ping(), "a password given (a local folder's) wins over REDIS_PASSWORD"


# -- load_runs, simulation_spec, simulated_source --------------------------------------------------
def test_load_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.load_runs(parse("seed")) == parse_runs({"main": {}}, "--run")
    assert cli.load_runs(parse("seed", "--run", "a", "--run", "b")) == parse_runs({"a": {}, "b": {}}, "--run")
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"wide": {"hidden": [8]}, "a": {"epochs": 3}}))
    runs = cli.load_runs(parse("seed", "--runs-file", str(sweep), "--run", "a", "--run", "b"))
    assert runs == parse_runs({"wide": {"hidden": [8]}, "a": {"epochs": 3}, "b": {}}, "-"), \
        "a --run named in the file keeps the file's hyperparameters"
    monkeypatch.setenv("RUNS_FILE", str(sweep))
    assert set(cli.load_runs(parse("seed"))) == {"wide", "a"}
    missing = tmp_path / "none.json"
    with pytest.raises(cli.UsageError, match=rf"^--runs-file {missing}: cannot read it as JSON \{{run name: "
                                             r"\{hyperparameters\}\}: \[Errno 2\] No such file"):
        cli.load_runs(parse("seed", "--runs-file", str(missing)))
    sweep.write_text(json.dumps(["a"] * 40))
    with pytest.raises(cli.UsageError) as err:
        cli.load_runs(parse("seed", "--runs-file", str(sweep)))
    assert str(err.value) == (f"--runs-file {sweep}: expected a non-empty object {{run name: {{hyperparameters}}}}, "
                              f"got {json.dumps(['a'] * 40)[:80]}")
    monkeypatch.delenv("RUNS_FILE")
    with pytest.raises(cli.UsageError, match=r"^--run: run name 'a b' is not allowed"):
        cli.load_runs(parse("seed", "--run", "a b"))


def test_simulation_spec_and_its_source() -> None:
    small = simulator.PRESETS["small"]
    assert cli.simulation_spec(parse("seed")) == small
    assert cli.simulated_source(small) == ("simulator:customers=2500,terminals=2000,train_days=21,test_days=7,"
                                           "start_date=2018-04-01,seed=1,radius=5.0")
    spec = cli.simulation_spec(parse("seed", "--customers", "10", "--terminals", "20", "--train-days", "3",
                                     "--test-days", "2", "--start-date", "2019-01-02", "--sim-seed", "0"))
    assert asdict(spec) == {"customers": 10, "terminals": 20, "train_days": 3, "test_days": 2,
                            "start_date": "2019-01-02", "seed": 0, "radius": 5.0}, "seed 0 is a seed, not none"
    assert cli.simulation_spec(parse("seed", "--preset", "cluster", "--train-days", "5")) == \
        simulator.SimulationSpec(customers=5000, terminals=10000, train_days=5, test_days=7, start_date="2018-04-01",
                                 seed=0)
    with pytest.raises(cli.UsageError) as err:
        cli.simulation_spec(parse("seed", "--preset", "Small"))
    assert str(err.value) == "--preset 'Small' is unknown; allowed: ['cluster', 'small']"


def test_the_preset_comes_from_dataset_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATASET_PRESET", "cluster")
    assert cli.simulation_spec(parse("seed")) == simulator.PRESETS["cluster"]
    assert cli.simulation_spec(parse("seed", "--preset", "small")) == simulator.PRESETS["small"]


# -- data_reading ----------------------------------------------------------------------------------
def test_data_reading_from_flags_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.data_reading(parse("seed")) == Reading(columns=(), datetime_format=None)
    mapping = tmp_path / "columns.yaml"
    mapping.write_text("ts: TX_DATETIME\ncard: CUSTOMER_ID\n")
    assert cli.data_reading(parse("seed", "--columns", str(mapping), "--datetime-format", "%d/%m/%Y %H:%M")) == \
        Reading(columns=(("card", "CUSTOMER_ID"), ("ts", "TX_DATETIME")), datetime_format="%d/%m/%Y %H:%M")
    monkeypatch.setenv("DATASET_COLUMNS", json.dumps({"when": "TX_DATETIME"}))
    monkeypatch.setenv("DATASET_DATETIME_FORMAT", "epoch-ms")
    assert cli.data_reading(parse("score", "--model", "m", "--datasets", "d")) == \
        Reading(columns=(("when", "TX_DATETIME"),), datetime_format="epoch-ms")
    assert cli.data_reading(parse("seed", "--columns", str(mapping))).columns == \
        (("card", "CUSTOMER_ID"), ("ts", "TX_DATETIME")), "--columns wins over DATASET_COLUMNS"
    assert cli.data_reading(parse("seed", "--datetime-format", "epoch-s")).datetime_format == "epoch-s"
    monkeypatch.setenv("DATASET_COLUMNS", "")
    assert cli.data_reading(parse("seed")).columns == ()


@pytest.mark.parametrize(("argv", "columns", "message"), [
    ((), "card: CUSTOMER_ID", "DATASET_COLUMNS: not a JSON mapping of your column names to ours "
                              "(Expecting value: line 1 column 1 (char 0))"),
    ((), '{"card": "NOPE"}', "DATASET_COLUMNS: 'card' maps to unknown column 'NOPE'; allowed: "),
    ((), "[]", "DATASET_COLUMNS: expected a mapping of your column names to ours"),
    (("--datetime-format", "%H:%M"), "", "--datetime-format '%H:%M' is not a date format; give strftime directives"),
    (("--columns", "{missing}"), "", "--columns {missing}: cannot read it (No such file or directory)"),
    (("--columns", "{mapping}", "--datetime-format", "%Y"), "", "--datetime-format '%Y' is not a date format"),
])
def test_data_reading_errors_name_the_flag_or_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       argv: tuple[str, ...], columns: str, message: str) -> None:
    (tmp_path / "m.json").write_text('{"card": "CUSTOMER_ID"}')
    names = {"missing": tmp_path / "nothing.yaml", "mapping": tmp_path / "m.json"}
    if columns:
        monkeypatch.setenv("DATASET_COLUMNS", columns)
    with pytest.raises(cli.UsageError) as err:
        cli.data_reading(parse("seed", *(a.format(**names) for a in argv)))
    assert str(err.value).startswith(message.format(**names)), str(err.value)


# -- place_dataset, store_features -----------------------------------------------------------------
TINY_ARGS = ("--customers", "20", "--terminals", "10", "--train-days", "2", "--test-days", "1", "--sim-seed", "3")


def test_place_dataset_simulates_once_and_keeps_one_source(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "workload")
    root = tmp_path / "datasets" / "sim"
    root.parent.mkdir(parents=True)
    args = parse("seed", *TINY_ARGS)
    assert cli.place_dataset(args, root) == 0
    uri = cli.simulated_source(cli.simulation_spec(args))
    manifest = read_manifest(root)
    assert manifest["source"] == uri
    assert sorted(f["path"] for f in manifest["files"]) == [
        "testing/2018-04-03.parquet", "training/2018-04-01.parquet", "training/2018-04-02.parquet"]
    assert sorted(os.listdir(root.parent)) == [".sim.lock", "sim"], "the simulator's temporary folder is gone"
    caplog.clear()
    assert cli.place_dataset(args, root) == 0
    assert f"dataset {root} ({uri}) is already on the share" in caplog.messages
    with pytest.raises(DatasetError, match=f"dataset 'sim' on the share was published from {uri}; refusing to "
                                              "feed it from simulator:.*seed=4"):
        cli.place_dataset(parse("seed", *TINY_ARGS[:-1], "4"), root)
    by_hand = tmp_path / "datasets" / "hand"
    shutil.copytree(root, by_hand)
    unsourced = read_manifest(by_hand)
    del unsourced["source"]
    (by_hand / MANIFEST).write_text(json.dumps(unsourced))
    caplog.clear()
    assert cli.place_dataset(parse("seed", *TINY_ARGS[:-1], "4"), by_hand) == 0
    assert caplog.messages == [f"dataset {by_hand} is already on the share: not touching it"]


def test_place_dataset_publishes_a_folder_and_counts_new_scoring_days(tmp_path: Path, dataset_src: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "workload")
    src = tmp_path / "src"
    shutil.copytree(dataset_src, src)
    (src / MANIFEST).unlink()
    tomorrow = src / "testing" / "2018-04-08.parquet"
    kept = tomorrow.rename(tmp_path / tomorrow.name)  # appended later, as a scoring/ day
    root = tmp_path / "datasets" / "fraud"
    root.parent.mkdir()
    args = parse("seed", "--datasets", str(src))
    assert cli.place_dataset(args, root) == 0, "no scoring/ day: whatever else was copied"
    files = len(list(src.glob("*/*.parquet")))
    assert f"synced {src} into {root}: {files} file(s) copied, 0 unchanged" in caplog.messages
    (src / "scoring").mkdir()
    kept.rename(src / "scoring" / tomorrow.name)
    caplog.clear()
    assert cli.place_dataset(args, root) == 1
    assert f"synced {src} into {root}: 1 file(s) copied, {files} unchanged" in caplog.messages
    assert cli.place_dataset(args, root) == 0
    caplog.clear()
    for computed, kept in ((files, 0), (0, files)):  # the training and testing days, computed once
        cli.store_features(root)
        assert re.fullmatch(rf"features \(version {features.FEATURE_VERSION}\): {computed} day\(s\) computed in "
                            rf"[0-9.]+s, {kept} already stored", caplog.messages[-1]), caplog.messages


# -- wait-drained ----------------------------------------------------------------------------------
def test_wait_drained_exits_0_when_drained_and_3_after_its_timeout(server: RedisServer, redis_env: str,
                                                                  run: Run) -> None:
    assert run("wait-drained", "--timeout", "5", "--poll", "0.05")[0] == 0
    queue_of(server, redis_env).enqueue([Item("r", "training/2018-04-01.parquet", "fraud", 1)])
    code, _, err = run("wait-drained", "--timeout", "0.2", "--poll", "0.05")
    assert code == 3 and "queue not drained after 0s: 1 pending, 0 leased" in err
    code, _, err = run("wait-drained", "--timeout", "0")
    assert code == 2 and "--timeout must be > 0, got '0'" in err
    for flag in ("--timeout", "--poll"):  # NaN: a wait that never ends, or time.sleep(nan)'s traceback
        code, _, err = run("wait-drained", flag, "nan")
        assert code == 2 and f"argument {flag}: {flag} must be > 0, got 'nan'" in err


# -- status, requeue -------------------------------------------------------------------------------
def day(run: str, n: int) -> Item:
    return Item(run, f"training/2018-04-0{n}.parquet", "fraud", n)


def test_status_shows_leases_retries_and_dead_letters(server: RedisServer, redis_env: str, run: Run) -> None:
    code, out, err = run("status")
    assert code == 0, err
    assert out.splitlines()[0] == f"queue {redis_env}: 0 items: 0 pending, 0 leased, 0 done, 0 dead-lettered  (drained)"
    assert out.splitlines()[-1].startswith("the queue was never seeded (or Redis lost its data)")
    q = queue_of(server, redis_env, max_attempts=3)
    q.enqueue([day(r, n) for r in ("a", "b", "c") for n in (1, 2)])
    q.mark_seeded()
    held, retried, dead = (q.claim(f"w{i}", ttl_s=60) for i in (1, 2, 3))  # one lease per run at a time
    assert [held.item.run, retried.item.run, dead.item.run] == ["a", "b", "c"]
    assert q.release(retried, error="disk full") == "pending"  # b: one failed attempt
    assert q.release(dead, error="cannot read", permanent=True) == "dead"
    code, out, err = run("status")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"queue {redis_env}: 6 items: 4 pending, 1 leased, 0 done, 1 dead-lettered"
    assert lines[1] == "run a: 0/2 shards applied, 1 pending, 0 dead-lettered"
    assert re.fullmatch(rf"  leased: a/training/2018-04-01.parquet by w1 \(token {held.token}\), lease expires in "
                        r"(59|60)\.\ds", lines[2]), lines[2]
    assert lines[3:7] == ["run b: 0/2 shards applied, 2 pending, 0 dead-lettered",
                          "  retrying: b/training/2018-04-01.parquet (1 failed): disk full",
                          "run c: 0/2 shards applied, 1 pending, 1 dead-lettered",
                          "  dead: c/training/2018-04-01.parquet after 1 attempt(s): cannot read"]
    assert len(lines) == 8 and lines[7].startswith("share vs queue: ") and "never seeded" not in out


def test_status_says_when_a_lease_expired_and_what_is_retrying(server: RedisServer, redis_env: str,
                                                               run: Run) -> None:
    q = queue_of(server, redis_env)
    q.enqueue([day("a", 1), day("a", 2), day("b", 1)])
    q.release(q.claim("w1", ttl_s=60), error="timeout reading")
    q.claim("w1", ttl_s=0.001)  # a's first day again: its lease runs out at once
    code, out, _ = run("status")
    lines = out.splitlines()
    assert code == 0 and lines[0] == f"queue {redis_env}: 3 items: 2 pending, 1 leased, 0 done, 0 dead-lettered"
    assert re.fullmatch(r"  leased: a/training/2018-04-01.parquet by w1 \(token \d+\), lease EXPIRED \d+\.\ds ago "
                        r"\(a claim will reap it\)", lines[2]), lines[2]
    assert lines[3] == "  retrying: a/training/2018-04-01.parquet (1 failed): timeout reading"
    assert lines[4] == "run b: 0/1 shards applied, 1 pending, 0 dead-lettered"
    assert "never seeded" not in out, "a queue with work in it was seeded, whatever its flag says"


def test_requeue_all_one_run_or_one_item(server: RedisServer, redis_env: str, run: Run) -> None:
    q = queue_of(server, redis_env)
    q.enqueue([day(r, 1) for r in "abcdefg"])
    for _ in "abcdefg":
        lease = q.claim("w", ttl_s=60)
        q.release(lease, error=f"broken {lease.item.run}", permanent=True)
    code, out, err = run("requeue", "--run", "a", "--item", "b/training/2018-04-01.parquet")
    assert code == 2 and out == "" and one_error_line(err).endswith(
        "--item 'b/training/2018-04-01.parquet' is not an item of --run 'a' (item ids are <run>/<shard>)")
    code, out, err = run("requeue", "--run", "a", "--item", "ab/training/2018-04-01.parquet")
    assert code == 2 and "is not an item of --run 'a'" in err, "run a's items start with 'a/'"
    code, out, _ = run("requeue", "--item", "a/training/2018-04-01.parquet")
    assert code == 0 and out.splitlines() == [
        "requeued 1 dead-lettered item(s) in item a/training/2018-04-01.parquet, attempts reset:",
        "  a/training/2018-04-01.parquet (was: broken a)",
        "6 still dead-lettered (malformed, or outside the selection): b/training/2018-04-01.parquet, "
        "c/training/2018-04-01.parquet, d/training/2018-04-01.parquet, e/training/2018-04-01.parquet, "
        "f/training/2018-04-01.parquet ..."]
    code, out, _ = run("requeue", "--run", "b")
    assert code == 0 and out.splitlines()[:2] == ["requeued 1 dead-lettered item(s) in run b, attempts reset:",
                                                  "  b/training/2018-04-01.parquet (was: broken b)"]
    assert out.splitlines()[2].startswith("5 still dead-lettered (malformed, or outside the selection): c/")
    assert not out.splitlines()[2].endswith(" ..."), "five left: all shown"
    code, out, _ = run("requeue", "--item", "a/training/2018-04-01.parquet")
    assert code == 4 and out == "no dead-lettered items to requeue in item a/training/2018-04-01.parquet (5 " \
                                "dead-lettered in total)\n"
    code, out, _ = run("requeue", "--run", "a")
    assert code == 0 and out == "no dead-lettered items to requeue in run a (5 dead-lettered in total)\n"
    code, out, _ = run("requeue")
    assert code == 0 and out.splitlines()[0] == "requeued 5 dead-lettered item(s) in all runs, attempts reset:"
    assert len(out.splitlines()) == 6 and q.counts().dead == 0
    code, out, _ = run("requeue")
    assert code == 0 and out == "no dead-lettered items to requeue in all runs (0 dead-lettered in total)\n"


# -- worker: the whole command, in this process ----------------------------------------------------
# Three training days and one test day of 100 customers, and one epoch a day: a worker drains it in seconds.
SMALL_ARGS = ("--customers", "100", "--terminals", "80", "--train-days", "3", "--test-days", "1", "--sim-seed", "11")
QUICK = {"epochs": 1, "batch_size": 256, "hidden": [8]}
DAYS = [f"training/2018-04-0{d}.parquet" for d in (1, 2, 3)]
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ ")
UNREACHABLE = "redis://127.0.0.1:1/0"  # nothing listens on port 1: every connection is refused at once


@dataclasses.dataclass
class Saved:
    sigterm: object
    sigint: object


@pytest.fixture
def in_process_worker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Saved]:
    """What `worker` changes in the process that runs it, put back afterwards: the SIGTERM and SIGINT handlers it
    installs (pytest's own again, so no later signal reaches a finished worker), torch's thread count, the root
    logger's level (setup_logging's basicConfig; clean_env removes its handler) and a SIGTERM's grace timer.
    No GPU is given, whatever the machine: the GPU variables are unset."""
    for name in (gpu.ENV_EXPECTED_GPUS, gpu.ENV_VISIBLE_DEVICES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PLOT_INTERVAL_SECONDS", "3600")  # pictures only after a run's last day
    monkeypatch.setenv("TERM_GRACE_SECONDS", "3600")  # a SIGTERM's hard exit (os._exit) never ends pytest
    saved = Saved(signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    threads, level, before = torch.get_num_threads(), logging.root.level, set(threading.enumerate())
    try:
        yield saved
    finally:
        signal.signal(signal.SIGTERM, saved.sigterm)
        signal.signal(signal.SIGINT, saved.sigint)
        torch.set_num_threads(threads)
        logging.root.setLevel(level)
        for timer in threading.enumerate():
            if timer not in before and isinstance(timer, threading.Timer):
                timer.cancel()


@contextlib.contextmanager
def sigterm_once_handled(saved: Saved, after_s: float = 0.0) -> Iterator[None]:
    """SIGTERM to this process `after_s` seconds into the block, as soon as the worker's handler is in place (never
    to pytest's own handler, which would end the whole test run); no signal when the block ends first."""
    finished = threading.Event()

    def send() -> None:
        if finished.wait(after_s):
            return
        while not finished.wait(0.01):
            if signal.getsignal(signal.SIGTERM) is not saved.sigterm:
                os.kill(os.getpid(), signal.SIGTERM)
                return

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        yield
    finally:
        finished.set()
        sender.join()


def seed_small(run: Run, tmp_path: Path) -> None:
    """`seed` of one quick run over a small simulated dataset, into redis_env's queue and share."""
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({"main": QUICK}))
    code, _, err = run("seed", "--runs-file", str(runs), *SMALL_ARGS)
    assert code == 0, err


def test_the_worker_trains_every_item_logs_its_id_and_exits_0(server: RedisServer, redis_env: str, run: Run,
                                                            in_process_worker: Saved, tmp_path: Path) -> None:
    seed_small(run, tmp_path)
    torch.set_num_threads(2)  # not what --threads asks
    code, out, err = run("worker", "--worker-id", "cli-w1", "--threads", "1")
    assert code == 0 and out == "", err
    assert torch.get_num_threads() == 1, "--threads sets torch's CPU threads"
    c = queue_of(server, redis_env).counts()
    assert (c.pending, c.leased, c.done, c.dead, c.total) == (0, 0, 3, 0, 3) and c.drained
    run_dir = tmp_path / "share" / "output" / "main"
    loaded = CheckpointStore(run_dir).load()
    assert loaded is not None and loaded.state["applied"] == DAYS
    assert (run_dir / "report.txt").read_text().count("training dataset: ") == 3
    logs = [line for line in err.splitlines() if LOG_LINE.match(line)]
    assert len(logs) > 3 and all(" [cli-w1]: " in line for line in logs), err
    assert logs[-1].endswith(" INFO workload.runtime.worker [cli-w1]: queue drained: 3 done of 3; exiting 0"), err
    for signum, saved in ((signal.SIGTERM, in_process_worker.sigterm), (signal.SIGINT, in_process_worker.sigint)):
        handler = signal.getsignal(signum)
        assert callable(handler) and handler is not saved, f"the worker installs its {signum.name} handler"


def test_a_worker_given_a_gpu_cuda_cannot_use_exits_6_claiming_nothing(server: RedisServer, redis_env: str,
                                                                       run: Run, in_process_worker: Saved,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    seed_small(run, tmp_path)
    monkeypatch.setenv(gpu.ENV_EXPECTED_GPUS, "64")  # more GPUs than any machine running this holds
    reason = gpu.unusable_reason()
    assert reason.startswith("this pod was given a GPU (EXPECTED_GPUS=64) but CUDA sees "), reason
    code, out, err = run("worker", "--worker-id", "cli-w1")
    assert (code, out, err) == (EXIT_GPU_UNUSABLE, "", f"error: {reason}\n")
    c = queue_of(server, redis_env).counts()
    assert (c.pending, c.leased, c.done, c.dead, c.total) == (3, 0, 0, 0, 3), "nothing claimed"
    assert not (tmp_path / "share" / "output" / "main" / "checkpoints").exists()
    assert signal.getsignal(signal.SIGTERM) is in_process_worker.sigterm, "refused before any handler"


# A worker still retrying after 20 s is stopped by SIGTERM (exit 143, not 3): the retry budget it should have had is
# 1 s, so the test fails in 20 s rather than after the 300 s default. The pytest timeout is a last resort.
GAVE_UP_WITHIN_S = 20


@pytest.mark.timeout(60)
def test_the_worker_gives_up_on_an_unreachable_redis_after_redis_retry_seconds(
        run: Run, in_process_worker: Saved, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SHARE_DIR", str(tmp_path / "share"))
    monkeypatch.setenv("REDIS_RETRY_SECONDS", "1")
    with sigterm_once_handled(in_process_worker, after_s=GAVE_UP_WITHIN_S):
        code, out, err = run("worker", "--redis-url", UNREACHABLE)
    assert code == EXIT_INFRA and out == "", f"still retrying after {GAVE_UP_WITHIN_S}s, not 1 s: {err}"
    assert "Redis unreachable for 1s during " in one_error_line(err)


@pytest.mark.timeout(60)
def test_the_workers_queue_retries_for_the_workers_configured_budget(
        run: Run, in_process_worker: Saved, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The queue's retry budget is the worker settings' redis_retry_s, not a second reading of the environment:
    a budget set in the settings alone (the environment leaves the 300 s default) is the one kept."""
    monkeypatch.setenv("SHARE_DIR", str(tmp_path / "share"))
    configured = cli.worker_config
    monkeypatch.setattr(cli, "worker_config",
                        lambda args: dataclasses.replace(configured(args), redis_retry_s=1.0))
    with sigterm_once_handled(in_process_worker, after_s=GAVE_UP_WITHIN_S):
        code, _, err = run("worker", "--redis-url", UNREACHABLE)
    assert code == EXIT_INFRA, f"still retrying after {GAVE_UP_WITHIN_S}s, not the configured 1 s: {err}"
    assert "Redis unreachable for 1s during " in one_error_line(err)


def test_sigterm_stops_an_in_process_worker_with_143(server: RedisServer, redis_env: str, run: Run,
                                                   in_process_worker: Saved, tmp_path: Path) -> None:
    """The run's next day is leased by a peer, so the worker waits; SIGTERM, sent once the worker's handler is
    in place, ends the wait: exit 143, nothing claimed. Without the handler the peer's lease runs out after 10 s
    and the worker trains everything: exit 0."""
    seed_small(run, tmp_path)
    queue = queue_of(server, redis_env)
    assert queue.claim("peer", ttl_s=10) is not None
    with sigterm_once_handled(in_process_worker):
        code, out, err = run("worker", "--worker-id", "cli-w1")
    assert code == EXIT_TERMINATED and out == "", err
    assert " WARNING workload.runtime.worker [cli-w1]: SIGTERM received: stopping at the next batch boundary" in err
    c = queue.counts()
    assert (c.pending, c.leased, c.done, c.dead) == (2, 1, 0, 0), "the worker claimed nothing; the peer's lease holds"


# -- status --dir, requeue's edges, wait-drained's timings, export's and score's errors --------------------


def test_status_dir_reads_a_running_locals_redis_password_and_share(server: RedisServer, redis_env: str,
                                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    run: Run) -> None:
    """The folder's connection file wins over --redis-url, REDIS_PASSWORD and SHARE_DIR: all three point
    elsewhere here (a closed port, a wrong password, a share whose plan cannot be read)."""
    from workload.runtime.local import write_connection

    base, share = tmp_path / "local", tmp_path / "local" / "share"
    write_connection(base, server, share)  # written by this process, which is alive: a running `local`
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "runs").mkdir(parents=True)
    (elsewhere / "runs" / "bad.json").write_text("not JSON")  # a plan status would say it cannot read
    for name, value in (("REDIS_URL", "redis://127.0.0.1:1/0"), ("REDIS_PASSWORD", "wrong"),
                        ("SHARE_DIR", str(elsewhere))):
        monkeypatch.setenv(name, value)
    q = queue_of(server, redis_env)
    q.enqueue([day("a", 1), day("a", 2)])
    q.mark_seeded()
    code, out, err = run("status", "--dir", str(base))
    assert code == 0, err
    assert out.splitlines() == [
        f"queue {redis_env}: 2 items: 2 pending, 0 leased, 0 done, 0 dead-lettered",
        "run a: 0/2 shards applied, 2 pending, 0 dead-lettered",
        "share vs queue: the share's plan is 0 run(s), 0 item(s); the queue holds them all"]
    code, out, _ = run("status", "--share", str(share), "--redis-url", server.url)
    assert code == 2 and out == "", "without --dir, REDIS_PASSWORD is the password (a wrong one here)"


def test_status_dir_where_no_local_ever_ran_is_one_line_exit_2(tmp_path: Path, run: Run) -> None:
    code, out, err = run("status", "--dir", str(tmp_path))
    assert code == 2 and out == ""
    assert one_error_line(err).endswith(
        f"ERROR workload: --dir {tmp_path}: no `python -m workload local` ran there (no "
        f"{tmp_path / 'redis'}); start it with `make local`")


def test_requeue_accepts_an_item_of_the_run_named(server: RedisServer, redis_env: str, run: Run) -> None:
    q = queue_of(server, redis_env)
    q.enqueue([day("a", 1), day("a", 2), day("b", 1)])
    for _ in range(3):
        lease = q.claim("w", ttl_s=60)
        q.release(lease, error=f"broken {lease.item.id}", permanent=True)
    code, out, err = run("requeue", "--run", "a", "--item", "a/training/2018-04-02.parquet")
    assert code == 0, err
    assert out.splitlines() == [
        "requeued 1 dead-lettered item(s) in item a/training/2018-04-02.parquet, attempts reset:",
        "  a/training/2018-04-02.parquet (was: broken a/training/2018-04-02.parquet)",
        "2 still dead-lettered (malformed, or outside the selection): a/training/2018-04-01.parquet, "
        "b/training/2018-04-01.parquet"], "five or fewer left: every one named, nothing after them"


def test_requeue_prints_a_question_mark_for_an_error_it_did_not_see(server: RedisServer, redis_env: str,
                                                                     run: Run) -> None:
    """`before` is read from the snapshot, which lists runs from the queue's set of runs: a dead letter of a run
    missing from that set (or whose record lacks its error) is requeued all the same, its error unknown."""
    q = queue_of(server, redis_env)
    q.enqueue([day("a", 1), day("b", 1)])
    for _ in range(2):
        lease = q.claim("w", ttl_s=60)
        q.release(lease, error="broken", permanent=True)
    q.redis.srem(q.keys.runs, "a")  # a's dead letter is in no run `status` lists
    q.redis.hset(q.keys.dead, "b/training/2018-04-01.parquet", json.dumps({"attempts": 1}))  # no error recorded
    code, out, err = run("requeue")
    assert code == 0, err
    assert out.splitlines() == ["requeued 2 dead-lettered item(s) in all runs, attempts reset:",
                                "  a/training/2018-04-01.parquet (was: ?)",
                                "  b/training/2018-04-01.parquet (was: ?)"]
    assert q.counts().pending == 2 and q.counts().dead == 0


def test_requeue_fails_fast_when_redis_is_unreachable(redis_env: str, monkeypatch: pytest.MonkeyPatch,
                                                      run: Run) -> None:
    """requeue is for a person at a terminal, as status is: its 3 s, not REDIS_RETRY_SECONDS (a worker's)."""
    import time

    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("REDIS_RETRY_SECONDS", "7")
    started = time.monotonic()
    code, out, err = run("requeue")
    took = time.monotonic() - started
    assert code == 3 and out == ""
    assert "ERROR workload: Redis unreachable for 3s during snapshot: " in one_error_line(err), err
    assert took < 15, f"requeue took {took:.1f}s against a closed port"


def test_wait_drained_waits_its_timeout_looking_every_poll(server: RedisServer, redis_env: str, run: Run) -> None:
    """--timeout 1 --poll 0.05: about twenty looks, then 'after 1s' (--poll's 0.05 s as the timeout would
    say 0s; the default 5 s poll would sleep once, to the deadline, after one look)."""
    queue_of(server, redis_env).enqueue([day("r", 1)])
    code, out, err = run("wait-drained", "--timeout", "1", "--poll", "0.05")
    assert code == 3 and out == ""
    assert one_error_line(err).endswith(
        "ERROR workload.runtime.launch: queue not drained after 1s: 1 pending, 0 leased")
    looks = err.count("waiting for training to finish: 1 pending, 0 leased")
    assert looks >= 3, f"{looks} look(s) in a second at a 0.05 s poll"


def test_export_without_a_destination_is_one_line_exit_2(tmp_path: Path, run: Run) -> None:
    code, out, err = run("export", "--share", str(tmp_path / "share"), "--run", "main")
    assert code == 2 and out == ""
    assert one_error_line(err).endswith(
        "ERROR workload: --to is required (or env OUTPUT_URI): a folder, or gs://bucket/prefix")


def test_export_of_a_run_whose_files_cannot_be_read_names_the_share_and_run(tmp_path: Path, run: Run) -> None:
    share = tmp_path / "share"
    checkpoints = share / "output" / "main" / "checkpoints"
    checkpoints.parent.mkdir(parents=True)
    checkpoints.write_text("a file where the checkpoints folder should be")
    code, out, err = run("export", "--share", str(share), "--run", "main", "--to", str(tmp_path / "out"))
    assert code == 2 and out == ""
    assert one_error_line(err).endswith(
        f"ERROR workload: --share {share}: cannot read run 'main' ([Errno 20] Not a directory: '{checkpoints}')")
    assert not (tmp_path / "out").exists()


def test_score_names_a_data_file_it_cannot_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run: Run) -> None:
    """A socket where a day's file should be: opening it fails with ENXIO, an OSError whose strerror is the
    message (not the exception's text, which repeats the path)."""
    import torch

    from workload.model.export import model_bytes
    from workload.model.hparams import HParams
    from workload.model.lineage import checkpoint_of
    from workload.model.trainer import Trainer

    model = tmp_path / "model.safetensors"
    model.write_bytes(model_bytes(checkpoint_of(Trainer("m", HParams(hidden=(4,)), features.FEATURE_NAMES,
                                                        torch.device("cpu"), features.FEATURE_VERSION))))
    data = tmp_path / "data"
    (data / "training").mkdir(parents=True)
    monkeypatch.chdir(data / "training")  # a relative name: a socket's path is limited to 107 bytes
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("2018-04-01.parquet")
    code, out, err = run("score", "--model", str(model), "--datasets", str(data), "--out", str(tmp_path / "s.parquet"))
    assert code == 2 and out == ""
    assert one_error_line(err).endswith(f"ERROR workload: --datasets {data}: No such device or address")
    assert not (tmp_path / "s.parquet").exists()


def test_worker_config_refusals_past_the_parser_are_usage_errors() -> None:
    """Every value WorkerConfig refuses, the parser and env_seconds refuse first; its own check is the layer
    behind them (a flag added without one), and still ends as one usage line naming the field."""
    args = parse("worker")
    args.lease_ttl = 0.0
    with pytest.raises(cli.UsageError) as err:
        cli.worker_config(args)
    assert str(err.value) == "lease_ttl_s=0.0 is not allowed: it must be positive"
    assert isinstance(err.value.__cause__, ValueError)


# -- seed: the reading a published export keeps, where the simulator stages, a share not made yet, the runs'
# hyperparameters in Redis, and which Jobs the launcher starts after a scheduled load ---------------------------
DAY_FIRST = "%d/%m/%Y %H:%M:%S"


def test_a_bank_export_is_published_with_its_column_mapping_and_date_format(tmp_path: Path,
                                                                            dataset_src: Path) -> None:
    """The bank's own column names (--columns) and day-first dates (--datetime-format): published as they are, with
    the reading recorded, so every day reads back as the canonical file it came from."""
    export = bank_export(dataset_src, tmp_path / "export")
    for path in export.glob("*/*.csv"):
        day = pd.read_csv(path)
        day["ts"] = pd.to_datetime(day["ts"], utc=True).dt.strftime(DAY_FIRST)
        day.to_csv(path, index=False)
    root = tmp_path / "datasets" / "bank"
    root.parent.mkdir()
    args = parse("seed", "--datasets", str(export), "--columns", str(write_mapping(tmp_path / "columns.yaml")),
                 "--datetime-format", DAY_FIRST, "--timezone", "UTC")
    assert cli.place_dataset(args, root) == 0
    assert read_manifest(root)["reading"] == {"columns": BANK_COLUMNS, "datetime_format": DAY_FIRST, "timezone": "UTC"}
    published = ds.Dataset(root)
    originals = sorted(dataset_src.glob("*/*.parquet"))
    assert sorted(f["path"] for f in published.files) == sorted(f"{p.parent.name}/{p.stem}.csv" for p in originals)
    for original in originals:
        pd.testing.assert_frame_equal(published.transactions(f"{original.parent.name}/{original.stem}.csv"),
                                      read_transactions(original), check_exact=True)


def test_the_simulator_stages_its_days_beside_the_dataset_not_in_the_machines_temp_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The staging folder is named for this host and process in the share's datasets folder, where the next seed's
    clean_stale_tmp finds a killed seeder's leftovers; the machine's temp folder (a pod's small ephemeral disk) is
    never used: here it is a file, so a folder made there would fail."""
    not_a_folder = tmp_path / "tmp-is-a-file"
    not_a_folder.write_text("")
    monkeypatch.setattr(tempfile, "tempdir", str(not_a_folder))  # tempfile's default dir=, whatever TMPDIR says
    staged: list[tuple[Path, bool]] = []
    generate = simulator.generate

    def seen(folder: Path, spec: simulator.SimulationSpec) -> None:
        staged.append((folder, folder.is_dir()))
        generate(folder, spec)

    monkeypatch.setattr(simulator, "generate", seen)
    root = tmp_path / "share" / "datasets" / "sim"
    root.parent.mkdir(parents=True)
    assert cli.place_dataset(parse("seed", *TINY_ARGS), root) == 0
    ((folder, existed),) = staged
    assert existed and folder.parent == root.parent and folder.name.startswith(tmp_dir_for(root).name + "-")
    assert not folder.exists() and len(read_manifest(root)["files"]) == 3


def test_seed_makes_a_share_whose_folders_do_not_exist_yet(redis_env: str, tmp_path: Path, run: Run) -> None:
    share = tmp_path / "new-volume" / "mounted" / "share"
    code, _, err = run("seed", "--share", str(share), "--run", "main", *TINY_ARGS)
    assert code == 0, err
    assert len(read_manifest(share / "datasets" / "fraud")["files"]) == 3


def test_seed_stores_each_runs_hyperparameters_in_redis(server: RedisServer, redis_env: str, tmp_path: Path,
                                                        run: Run) -> None:
    """What a worker trains with: the runs file's hyperparameters, and the defaults for a --run it does not name."""
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({"main": QUICK}))
    code, _, err = run("seed", "--runs-file", str(runs), "--run", "extra", *TINY_ARGS)
    assert code == 0, err
    queue = queue_of(server, redis_env)
    expected = parse_runs({"main": QUICK, "extra": {}}, "-")
    assert {name: queue.spec(name) for name in ("main", "extra")} == {n: hp.to_dict() for n, hp in expected.items()}
    assert queue.spec("extra") == HParams(seed=default_seed("extra")).to_dict()


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ApiServer]:
    """The Kubernetes API server on loopback (apiserver.py); the launcher calls it with the fixture's
    service-account folder in place of the pod's fixed path."""
    with api_server(tmp_path, monkeypatch) as state:
        monkeypatch.setattr(launch, "create_job", functools.partial(launch.create_job, sa_dir=state.sa_dir))
        monkeypatch.setattr(launch, "get_job", functools.partial(launch.get_job, sa_dir=state.sa_dir))
        yield state


def job_files(tmp_path: Path) -> tuple[str, str]:
    """The training and scoring Jobs' manifests, as the launcher's ConfigMap mounts them."""
    paths = []
    for kind in ("training", "scoring"):
        path = tmp_path / f"{kind}-job.json"
        path.write_text(json.dumps({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": kind}}))
        paths.append(str(path))
    return paths[0], paths[1]


def posted(api: ApiServer) -> list[str]:
    return [body["metadata"]["name"] for _, _, body in api.posts]


def test_the_scheduled_loader_records_and_the_launcher_starts_training_then_scoring_on_a_drained_queue(
        server: RedisServer, redis_env: str, tmp_path: Path, run: Run, api: ApiServer) -> None:
    """A simulated dataset has no scoring/ days: the scoring Job is owed only because the training Job was posted
    (its models will change), and posted once the queue is drained. Once all is done and nothing new arrives,
    neither is."""
    training, scoring = job_files(tmp_path)
    launcher = ("launch", "--job", training, "--scoring", scoring, "--stack-job", "spot-trainer-worker",
                "--load-wait", "1", "--drain-timeout", "0.2", "--poll", "0.05")
    code, _, err = run("seed", "--run", "main", *TINY_ARGS, "--request-launch")
    assert code == 0 and "launch requested: 2 new item(s), 0 new scoring day(s)" in err, err
    assert api.posts == [] and api.gets == []  # the loader posts nothing
    code, _, err = run(*launcher)
    assert code == EXIT_INFRA, err  # training posted; the queue not drained within the wait
    assert err.splitlines()[-1].endswith(
        "ERROR workload: scoring Job: the queue was not drained within 0.2s; the next launch tries again")
    assert posted(api) == ["training"]
    assert api.gets == ["/apis/batch/v1/namespaces/fraud/jobs/spot-trainer-worker"]
    assert api.posts[0][:2] == ("/apis/batch/v1/namespaces/fraud/jobs", "Bearer pod-token")
    queue = queue_of(server, redis_env)
    assert queue.mark_done(plan.items(tmp_path / "share")) == 2
    code, _, err = run(*launcher)
    assert code == 0, err
    assert posted(api) == ["training", "scoring"]
    code, _, err = run(*launcher)
    assert code == 0 and posted(api) == ["training", "scoring"], "nothing added, nothing pending: no Job at all"


def test_a_seed_without_request_launch_records_nothing_for_the_launcher(server: RedisServer, redis_env: str,
                                                                        run: Run) -> None:
    code, _, err = run("seed", "--run", "main", *TINY_ARGS)
    assert code == 0, err
    assert "queued 2 new item(s)" in err and "launch requested" not in err
    assert queue_of(server, redis_env).launch_request() == LaunchRequest()


# -- help texts, main's Redis errors, logging ---
# (The help texts are tested in test_help.py; setup_logging's survivors are explained in bench/mutation.py.)
def test_a_redis_asking_for_a_password_none_was_given_for_is_one_line_exit_2(server: RedisServer, redis_env: str,
                                                                           monkeypatch: pytest.MonkeyPatch,
                                                                           run: Run) -> None:
    """The module's Redis has requirepass: without REDIS_PASSWORD it answers NOAUTH (redis-py raises it as an
    AuthenticationError), with a wrong one WRONGPASS. Either is one line naming the variable, at once, never
    retried and never the password itself."""
    monkeypatch.delenv("REDIS_PASSWORD")
    code, out, err = run("status")
    assert code == 2 and out == ""
    assert one_error_line(err).endswith(
        f"ERROR workload: Redis at {server.url} requires a password: set REDIS_PASSWORD")
    monkeypatch.setenv("REDIS_PASSWORD", "not-the-password")
    code, out, err = run("requeue")
    assert code == 2 and out == ""
    assert one_error_line(err).endswith(
        f"ERROR workload: Redis at {server.url} refused the password: check REDIS_PASSWORD")
    assert "not-the-password" not in err and "retrying" not in err


@pytest.mark.parametrize(("password", "message"), [(None, "requires a password: set REDIS_PASSWORD"),
                                                   ("not-it", "refused the password: check REDIS_PASSWORD")])
def test_a_noauth_reply_raised_as_a_plain_response_error_is_the_password_message_too(
        password: str | None, message: str, monkeypatch: pytest.MonkeyPatch, run: Run) -> None:
    """main also reads NOAUTH in a plain ResponseError's text (a client or proxy that does not map the reply to
    AuthenticationError, as the installed redis-py does): the same one line and exit 2, not a traceback."""
    if password:
        monkeypatch.setenv("REDIS_PASSWORD", password)

    def refused(self: WorkQueue) -> None:
        raise redis.ResponseError("NOAUTH Authentication required.")

    monkeypatch.setattr(WorkQueue, "snapshot", refused)
    code, out, err = run("status", "--redis-url", UNREACHABLE)
    assert code == 2 and out == ""
    assert one_error_line(err).endswith(f"ERROR workload: Redis at {UNREACHABLE} {message}")


def test_any_other_redis_error_reply_is_raised_not_taken_for_a_password_problem(
        server: RedisServer, redis_env: str, run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    """An error reply that is not about authentication (here WRONGTYPE: the queue's set of runs is a string) is a
    bug to see whole: main raises it, and says nothing about passwords."""
    queue_of(server, redis_env).redis.set(f"{redis_env}:runs", "not a set")
    with pytest.raises(redis.ResponseError, match="^WRONGTYPE ") as raised:
        run("status")
    assert not isinstance(raised.value, redis.AuthenticationError)
    assert "password" not in capsys.readouterr().err


# -- score's flags, status's lease and retry lines ---
def test_score_needs_a_model_and_datasets_and_writes_scores_parquet_by_default(run: Run) -> None:
    """--model and --datasets have no variable behind them: argparse itself refuses a score without them."""
    for argv, missing in (((), "--model, --datasets"), (("--model", "m"), "--datasets"),
                          (("--datasets", "d"), "--model")):
        code, out, err = run("score", *argv)
        assert code == 2 and out == ""
        assert err.splitlines()[-1] == ("python -m workload score: error: the following arguments are required: "
                                        f"{missing}")
    args = parse("score", "--model", "results/m.safetensors", "--datasets", "d")
    assert isinstance(args.model, Path) and args.model == Path("results/m.safetensors")
    assert args.out == "scores.parquet" and args.datasets == "d"


@pytest.mark.parametrize(("offset_ms", "when"), [
    (100_000_000, "expires in 100000.0s"),  # seconds are ms / 1000, exactly
    (500, "expires in 0.5s"),  # under a second left: still running, not expired
    (0, "expires in 0.0s"),  # the deadline is now: not expired yet (a claim reaps only past it)
    (-1500, "EXPIRED 1.5s ago (a claim will reap it)")])
def test_status_shows_the_time_a_lease_has_left_from_redis_clock(server: RedisServer, redis_env: str, run: Run,
                                                                 monkeypatch: pytest.MonkeyPatch, offset_ms: int,
                                                                 when: str) -> None:
    """The lease's deadline is set relative to the snapshot's own `now_ms`, so the line is exact."""
    q = queue_of(server, redis_env)
    q.enqueue([day("a", 1)])
    held = q.claim("w1", ttl_s=60)
    snapshot = WorkQueue.snapshot

    def at_offset(self: WorkQueue) -> dict:
        snap = snapshot(self)
        snap["runs"]["a"]["lease"]["deadline"] = str(snap["now_ms"] + offset_ms)
        return snap

    monkeypatch.setattr(WorkQueue, "snapshot", at_offset)
    code, out, err = run("status")
    assert code == 0, err
    assert out.splitlines()[2] == (f"  leased: a/training/2018-04-01.parquet by w1 (token {held.token}), "
                                   f"lease {when}")


def test_status_counts_0_failures_for_an_error_without_an_attempts_count(server: RedisServer, redis_env: str,
                                                                         run: Run) -> None:
    """The queue's scripts write an item's error and its attempts together; an error whose count is missing
    (written by hand, or by an older queue) reads as 0 failed attempts, never None or a made-up 1."""
    q = queue_of(server, redis_env)
    q.enqueue([day("a", 1)])
    q.mark_seeded()
    connect(server.url, server.password).hset(f"{redis_env}:errors", "a/training/2018-04-01.parquet", "lost count")
    code, out, err = run("status")
    assert code == 0, err
    assert out.splitlines()[2] == "  retrying: a/training/2018-04-01.parquet (0 failed): lost count"


def test_status_reads_no_metrics_for_a_run_name_that_would_leave_the_output_folder(
        server: RedisServer, redis_env: str, run: Run, tmp_path: Path) -> None:
    share = tmp_path / "share"
    line = json.dumps({"shard": "training/2018-04-01.parquet", "average_precision": 0.5, "base_rate": 0.01,
                       "roc_auc": 0.9, "recall_at_1pct_fpr": 0.2, "card_precision_top100": 0.3})
    for folder in (share / "output" / "a", share / "x"):  # a's own, and what output/../x names
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text(line + "\n")
    q = queue_of(server, redis_env)
    q.enqueue([day("a", 1)])
    q.mark_seeded()
    connect(server.url, server.password).sadd(f"{redis_env}:runs", "../x")  # a hostile run name in Redis
    code, out, err = run("status")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1:5] == [
        "run ../x: 0/0 shards applied, 0 pending, 0 dead-lettered",
        "run a: 0/1 shards applied, 1 pending, 0 dead-lettered",
        "  latest: after training/2018-04-01.parquet: average precision 0.500 vs base rate 0.0100; "
        "card precision@100 0.300; ROC AUC 0.900; recall@1%FPR 0.200",
        f"  report: {share / 'output' / 'a' / 'report.txt'}"], out
    assert out.count("latest: ") == 1, "../x's metrics (share/x, outside output/) are never read"


def test_status_names_a_stray_run_record_skipped_and_says_how_to_seed_a_queue(
        server: RedisServer, redis_env: str, run: Run, tmp_path: Path) -> None:
    record = tmp_path / "share" / "runs" / "bad.json"
    record.parent.mkdir(parents=True)
    record.write_text("not JSON")
    code, out, err = run("status")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"queue {redis_env}: 0 items: 0 pending, 0 leased, 0 done, 0 dead-lettered  (drained)"
    assert lines[1] == "share vs queue: the share's plan is 0 run(s), 0 item(s); the queue holds them all"
    assert f"skipped, not a run: {record}: not a run record (Expecting value: line 1 column 1 (char 0)); expected " \
           "{run, dataset, hparams}; remove it" in err  # a stray file is skipped like a stale record
    assert lines[2:] == ["the queue was never seeded (or Redis lost its data): a worker restores it from the "
                         "share's run records, or run `python -m workload seed`"]


# -- the parser itself: its name, a missing command, score's --days, wait-drained's defaults -------------------


def test_the_command_line_names_itself_and_asks_for_a_command(run: Run) -> None:
    assert cli.parser().format_usage() == "usage: python -m workload [-h] COMMAND ...\n"
    code, out, err = run()
    assert (code, out) == (2, "") and err.splitlines()[-1] == (
        "python -m workload: error: the following arguments are required: COMMAND")


def test_score_days_takes_its_three_choices_only(run: Run) -> None:
    for days in ("scoring", "testing", "all"):
        assert parse("score", "--model", "m", "--datasets", "d", "--days", days).days == days
    assert parse("score", "--model", "m", "--datasets", "d").days == "scoring"
    code, _, err = run("score", "--model", "m", "--datasets", "d", "--days", "tomorrow")
    last = err.splitlines()[-1]  # how argparse quotes the choices varies with the Python version
    assert code == 2 and last.startswith("python -m workload score: error: argument --days: invalid choice: "
                                         "'tomorrow' (choose from "), err
    assert re.sub(r"['\s]", "", last.split("(choose from ")[1]) == "scoring,testing,all)", err


def test_wait_drained_waits_an_hour_looking_every_5_seconds_by_default() -> None:
    args = parse("wait-drained")
    assert (args.timeout, args.poll) == (3600.0, 5.0)


def test_export_local_and_status_flags_read_as_their_types_and_defaults(run: Run) -> None:
    assert parse("export").run == "main"
    workers = parse("local", "--workers", "3").workers
    assert workers == 3 and type(workers) is int
    assert parse("status", "--dir", "x").dir == Path("x")
    for given, why in (("0", "--workers must be > 0, got '0'"), ("two", "--workers must be an integer, got 'two'")):
        code, _, err = run("local", "--workers", given)
        assert code == 2 and err.splitlines()[-1] == f"python -m workload local: error: argument --workers: {why}"


def test_local_flags_read_as_their_types_and_defaults(run: Run) -> None:
    args = parse("local")
    assert (args.workers, args.dir, args.datasets, args.preset, args.run, args.runs_file) == (
        2, None, None, "small", None, None)  # the folder: local, or local-NAME for --datasets .../NAME
    assert (args.checkpoint_interval, args.lease_ttl, args.requeue) == (5.0, 15.0, False)
    args = parse("local", "--dir", "d", "--run", "a", "--run", "b", "--checkpoint-interval", "2.5", "--lease-ttl", "4",
                 "--requeue", "--preset", "tiny")
    assert (args.dir, args.run, args.checkpoint_interval, args.lease_ttl, args.requeue, args.preset) == (
        Path("d"), ["a", "b"], 2.5, 4.0, True, "tiny")
    for flag in ("--checkpoint-interval", "--lease-ttl"):
        for given, why in (("0", f"{flag} must be > 0, got '0'"), ("soon", f"{flag} must be a number, got 'soon'")):
            code, _, err = run("local", flag, given)
            assert code == 2 and err.splitlines()[-1] == f"python -m workload local: error: argument {flag}: {why}"
