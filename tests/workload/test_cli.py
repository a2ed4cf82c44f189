"""The command line: idempotent seed, errors that name what is wrong, status, Ctrl-C on local."""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from exports import one_error_line
from harness import HPARAMS, ROOT, Cluster, interruptible

from workload.cli import main as cli_main

pytestmark = pytest.mark.timeout(300)


def processes_with_env(entry: str) -> list[int]:
    """PIDs of live processes whose environment holds `entry` (read from /proc: no procps needed)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if entry.encode() in environ and state != "Z":
            found.append(int(proc.name))
    return found


@dataclass
class Ran:
    """What a command did: its exit status and what it printed (the fields of a CompletedProcess)."""

    returncode: int
    stdout: str
    stderr: str


Cli = Callable[..., Ran]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Iterator[Cli]:
    """`python -m workload ARGS` with the cluster's environment, run in this process (no interpreter start-up,
    and `make mutation` sees which of cli.py's functions each test runs): exit status, stdout, stderr.
    setup_logging attaches its handler to sys.stderr as it is at the call, capsys's, so the logs are caught."""

    def run(cluster: Cluster | None, *args: str, **extra: str) -> Ran:
        for name, value in (cluster.env(**extra) if cluster else extra).items():
            monkeypatch.setenv(name, value)
        capsys.readouterr()  # what came before is not this command's
        try:
            code = cli_main(list(args))
        except SystemExit as exc:  # argparse refuses a flag's value: exit 2 with its usage message
            code = exc.code
        out = capsys.readouterr()
        return Ran(code, out.out, out.err)

    yield run
    for handler in logging.root.handlers[:]:  # cli.setup_logging's, bound to capsys's stream (closed after the
        if type(handler) is logging.StreamHandler:  # test); pytest's own handlers are subclasses: kept
            logging.root.removeHandler(handler)


def seed(cli: Cli, cluster: Cluster, runs: dict[str, dict] | None = None) -> None:
    """Cluster.seed in this process: the tiny dataset on the share, then `seed --runs-file`."""
    target = cluster.share / "datasets" / "fraud"
    if not target.exists():
        shutil.copytree(cluster.dataset_src, target)
    runs_file = cluster.share.parent / "runs.json"
    runs_file.write_text(json.dumps(runs or {"main": HPARAMS}))
    out = cli(cluster, "seed", "--runs-file", str(runs_file))
    assert out.returncode == 0, out.stderr


def test_seed_twice_changes_nothing(cluster: Cluster, cli: Cli) -> None:
    seed(cli, cluster, {"a": HPARAMS, "b": {}})
    manifest = (cluster.share / "datasets" / "fraud" / "manifest.json").read_text()
    first = cluster.counts()
    out = cli(cluster, "seed", "--run", "a", "--run", "b")
    assert out.returncode == 2 and "run 'a' already exists with hyperparameters" in out.stderr  # a's spec differs
    seed(cli, cluster, {"a": HPARAMS, "b": {}})
    assert cluster.counts() == first and first.total == 12
    assert (cluster.share / "datasets" / "fraud" / "manifest.json").read_text() == manifest


def test_seed_stores_every_days_features_once(cluster: Cluster, cli: Cli) -> None:
    out = cli(cluster, "seed", "--datasets", str(cluster.dataset_src), "--run", "a")
    assert out.returncode == 0, out.stderr
    root = cluster.share / "datasets" / "fraud"
    days = [f["path"] for f in json.loads((root / "manifest.json").read_text())["files"]]
    assert sorted(p.name for p in root.glob("features/*/*/*.json")) == sorted(Path(d).stem + ".json" for d in days)
    assert f"{len(days)} day(s) computed" in out.stderr
    again = cli(cluster, "seed", "--datasets", str(cluster.dataset_src), "--run", "b")  # a second sweep member
    assert again.returncode == 0, again.stderr
    assert "0 day(s) computed" in again.stderr and f"{len(days)} already stored" in again.stderr


def test_seed_copies_a_dataset_folder_and_refuses_pickle(cluster: Cluster, cli: Cli, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(cluster.dataset_src, src)
    (src / "manifest.json").unlink()
    out = cli(cluster, "seed", "--datasets", str(src))
    assert out.returncode == 0, out.stderr
    assert cluster.counts().total == 6
    (src / "training" / "x.pkl").write_bytes(pickle.dumps({"a": 1}))
    out = cli(cluster, "seed", "--datasets", str(src), "--dataset", "other")
    assert out.returncode == 2 and "x.pkl: .pkl files are never read" in out.stderr
    assert not (cluster.share / "datasets" / "other").exists()
    assert not [p for p in (cluster.share / "datasets").iterdir() if p.name.startswith(".") and p.suffix != ".lock"], \
        "temp left behind"


@pytest.mark.parametrize(("args", "message"), [
    (["seed", "--run", "../etc"], "run name '../etc' is not allowed"),
    (["seed", "--preset", "huge"], "--preset 'huge' is unknown; allowed: ['cluster', 'small']"),
    (["seed", "--dataset", "../x"], "--dataset '../x' is not allowed: use 1-63 letters"),
    (["worker", "--lease-ttl", "0"], "--lease-ttl must be > 0"),
    (["seed", "--customers", "many"], "--customers must be an integer, got 'many'"),
])
def test_usage_errors_name_the_flag_and_exit_2(cluster: Cluster, cli: Cli, args: list[str], message: str) -> None:
    out = cli(cluster, *args)
    assert out.returncode == 2 and message in out.stderr
    assert not (cluster.share / "datasets" / "fraud").exists() and not (cluster.share / "runs").exists()


def test_runs_file_errors(cluster: Cluster, cli: Cli, tmp_path: Path) -> None:
    bad = tmp_path / "runs.json"
    bad.write_text(json.dumps({"main": {"learning_rate": 1}}))
    out = cli(cluster, "seed", "--runs-file", str(bad))
    assert out.returncode == 2 and "run 'main': unknown key(s) ['learning_rate']" in out.stderr
    bad.write_text("{")
    out = cli(cluster, "seed", "--runs-file", str(bad))
    assert out.returncode == 2 and f"--runs-file {bad}: cannot read it as JSON" in out.stderr
    for empty in ("{}", "[]", "null"):  # never the default run in place of the sweep the file was meant to hold
        bad.write_text(empty)
        out = cli(cluster, "seed", "--runs-file", str(bad))
        assert out.returncode == 2, out.stderr
        assert f"--runs-file {bad}: expected a non-empty object {{run name: {{hyperparameters}}}}, got {empty}" \
            in one_error_line(out.stderr)
    assert not (cluster.share / "runs").exists() and cluster.counts().total == 0


@pytest.mark.parametrize(("password", "message"), [("not-it", "refused the password"), ("", "requires a password")])
def test_a_bad_password_fails_at_once_with_a_clear_error(cluster: Cluster, cli: Cli, password: str,
                                                          message: str) -> None:
    out = cli(cluster, "status", REDIS_PASSWORD=password)
    assert out.returncode == 2 and message in out.stderr
    assert "not-it" not in out.stderr, "the password must not be logged"


def test_status_shows_progress_leases_and_figures(cluster: Cluster, cli: Cli) -> None:
    seed(cli, cluster, {"main": {**HPARAMS, "epochs": 4}})  # what is tested is what status shows, not the model
    out = cli(cluster, "status")
    assert out.returncode == 0 and "6 items: 6 pending, 0 leased, 0 done" in out.stdout
    cluster.start_worker("w", PLOT_INTERVAL_SECONDS="3600")
    assert cluster.wait_all() == [0]
    run_dir = cluster.share / "output" / "main"
    last_checkpoint = max((run_dir / "checkpoints").glob("ckpt-*.pt"), key=lambda f: f.stat().st_mtime)
    assert (run_dir / "metrics.png").stat().st_mtime >= last_checkpoint.stat().st_mtime, \
        "the last shard of a run always redraws the pictures, whatever the throttle"
    out = cli(cluster, "status")
    assert "(drained)" in out.stdout and "run main: 6/6 shards applied" in out.stdout
    assert "latest: after training/2018-04-06.parquet: average precision" in out.stdout
    assert cluster.server.password not in out.stdout + out.stderr


def test_ctrl_c_on_local_stops_everything_and_the_next_run_resumes(tmp_path: Path) -> None:
    base = tmp_path / "local"
    runs = tmp_path / "runs.json"
    # 4 epochs so that a checkpoint lands long before the end (the first, mid-day or at day 1's end, with 20 days
    # left); the old default's small network, each day alone, so that the second run's 21 days stay quick (what is
    # tested is the Ctrl-C, not the model; 20 epochs cost the second run 12 s more CPU).
    runs.write_text(json.dumps({"main": {"epochs": 4, "hidden": [64, 32], "batch_size": 256, "window_days": 1}}))
    cmd = [sys.executable, "-m", "workload", "local", "--dir", str(base), "--runs-file", str(runs)]
    # Ctrl-C as a terminal sends it, whatever this test run inherited (a shell's background job ignores SIGINT).
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=interruptible)
    deadline = time.monotonic() + 120
    while not list((base / "share" / "output").glob("*/checkpoints/manifest-t*.json")):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, out
    assert "interrupted" in out
    assert not processes_with_env(f"SHARE_DIR={base / 'share'}"), "workers left running"
    port = int(re.search(r"Redis redis://127.0.0.1:(\d+)/0", out)[1])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "21/21 shards applied" in again.stdout
    assert os.path.exists(base / "share" / "output" / "main" / "report.txt")


@pytest.mark.parametrize(("runs", "message"), [
    ({"main": {"hidden": "64"}}, "run 'main': hidden='64' is not allowed; must be a list of layer sizes"),
    ({"main": {"epochs": 2.7}}, "run 'main': epochs=2.7 is not allowed; must be a whole number"),
    ({"a": {"seed": 1}, "b": {"seed": 1}}, "runs 'a' and 'b' have the same hyperparameters"),
])
def test_a_bad_runs_file_is_refused_naming_the_file_and_nothing_is_recorded(cluster: Cluster, cli: Cli, runs: dict,
                                                                           message: str) -> None:
    shutil.copytree(cluster.dataset_src, cluster.share / "datasets" / "fraud")
    runs_file = cluster.share.parent / "sweep.json"
    runs_file.write_text(json.dumps(runs))
    out = cli(cluster, "seed", "--runs-file", str(runs_file))
    assert out.returncode == 2, out.stderr
    error = [line for line in out.stderr.splitlines() if " ERROR " in line]
    assert len(error) == 1 and f"--runs-file {runs_file}: " in error[0] and message in error[0], out.stderr
    assert "Traceback" not in out.stderr
    assert not (cluster.share / "runs").exists() and cluster.counts().total == 0


def test_status_fails_fast_when_redis_is_unreachable(cluster: Cluster, cli: Cli) -> None:
    cluster.server.kill()
    started = time.monotonic()
    out = cli(cluster, "status")
    assert out.returncode == 3 and "Redis unreachable" in out.stderr
    assert time.monotonic() - started < 15, "status is for a person at a terminal: seconds, not minutes"


def test_status_fails_fast_when_redis_is_frozen(cluster: Cluster, cli: Cli) -> None:
    """A frozen Redis accepts the connection and never answers: only the call timeout ends the wait
    (about 4 s; a bound of 15 s stays clear of a loaded machine and of the 40 s a worker's timeout gives)."""
    seed(cli, cluster)
    cluster.server.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        out = cli(cluster, "status")
        took = time.monotonic() - started
    finally:
        cluster.server.proc.send_signal(signal.SIGCONT)
    assert out.returncode == 3 and "Redis unreachable" in out.stderr and "Timeout" in out.stderr, out.stderr
    assert took < 15, f"status took {took:.1f}s against a frozen Redis"


def test_a_killed_seeders_temporary_folder_is_cleaned(cluster: Cluster, cli: Cli) -> None:
    datasets = cluster.share / "datasets"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = datasets / f".fraud.tmp-{socket.gethostname()}-{gone.pid}"
    (stale / "training").mkdir(parents=True)
    (stale / "training" / "half.parquet").write_bytes(b"PAR1")
    busy = datasets / f".other.tmp-another-pod-{os.getpid()}"  # another pod's, still being written
    busy.mkdir()
    seed(cli, cluster)
    assert not stale.exists(), "a dead seeder's temporary folder survived"
    assert busy.exists(), "a live seeder's folder on another pod must be left alone"


def test_a_second_local_on_the_same_folder_refuses_and_a_killed_local_leaves_nothing(tmp_path: Path, cli: Cli) -> None:
    base = tmp_path / "local"
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({"main": {"epochs": 200}}))
    cmd = [sys.executable, "-m", "workload", "local", "--dir", str(base), "--runs-file", str(runs)]
    first = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = ""
    while not (found := re.search(r"Redis redis://127.0.0.1:(\d+)/0", line)):
        line = first.stderr.readline()
        assert line or first.poll() is None, "local exited before starting Redis"
    port = int(found[1])
    deadline = time.monotonic() + 120
    while not list(base.glob("logs/worker-*.log")):
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.2)
    second = cli(None, *cmd[3:])  # refused before it starts anything: this process will do
    assert second.returncode == 2 and f"another `make local` (pid {first.pid}) is running on {base}" in second.stderr
    first.send_signal(signal.SIGKILL)  # a closed terminal or a second Ctrl-C could leave no time to clean up
    first.wait()
    deadline = time.monotonic() + 20
    while processes_with_env(f"SHARE_DIR={base / 'share'}") or _listening(port):
        assert time.monotonic() < deadline, "workers or Redis outlived a killed `make local`"
        time.sleep(0.2)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_exit_codes_and_requeue(cluster: Cluster, cli: Cli) -> None:
    """0 all done; 4 drained with dead letters; `requeue` brings them back and they train."""
    quick = {**HPARAMS, "epochs": 4}  # what is tested is the queue's verdict, not the model
    seed(cli, cluster, {"main": quick, "bad": {**quick, "seed": 1}})
    (cluster.share / "runs" / "bad.json").write_text('{"run": "bad", "dataset": "fraud", "hparams": {"lr": 5}}')
    cluster.start_worker("w")
    assert cluster.wait_all() == [4], cluster.log("w")
    assert "dead-lettered in run bad: bad/training/2018-04-01.parquet: run 'bad' hyperparameters: lr=5.0" \
        in cluster.log("w")
    (cluster.share / "runs" / "bad.json").write_text(json.dumps({"run": "bad", "dataset": "fraud",
                                                                 "hparams": {**quick, "seed": 1}}))
    out = cli(cluster, "requeue", "--run", "bad")
    assert out.returncode == 0 and "requeued 6 dead-lettered item(s) in run bad" in out.stdout
    cluster.procs.clear()
    cluster.start_worker("w2")
    assert cluster.wait_all() == [0], cluster.log("w2")
    assert len(cluster.final_state("bad")["applied"]) == 6
    assert "no dead-lettered items" in cli(cluster, "requeue").stdout
