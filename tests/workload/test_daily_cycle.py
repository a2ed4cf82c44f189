"""The daily cycle (issue 35): a week of days arriving one a night, as a bank sends them.

Each night `seed --test-window 2` publishes one new labelled day and one new unlabelled day, a worker
drains the queue, and `score` scores the new unlabelled day with its history. On the fifth night a
chargeback relabels an earlier training day. Every day trains once in date order (the relabelled day
and the days after it once more, from the boundary before it), the test window moves by the rule, and
the final weights equal a run fed the same days all at once.

Against a real redis-server, with the seed command and the worker driven in this process (the
subprocess paths are the same code, tested in test_late_days.py and test_local.py). Tiny days: a few
hundred rows each, one epoch."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from harness import same_weights

from workload import cli
from workload.core.errors import EXIT_BAD_CONFIG, EXIT_DONE
from workload.data import cycle, publish, simulator, source
from workload.data import dataset as ds
from workload.data.cycle import Cycle
from workload.data.dayfile import DatasetError
from workload.model import score
from workload.queue.workqueue import WorkQueue, connect
from workload.runtime.redis_server import RedisServer
from workload.runtime.steps import Attempt
from workload.runtime.worker import Worker, WorkerConfig
from workload.share.checkpoint import CheckpointStore

pytestmark = pytest.mark.timeout(120)

QUICK = {"epochs": 1, "batch_size": 256, "hidden": [8]}
WINDOW = 2  # --test-window: the newest two labelled days test
SPEC = simulator.SimulationSpec(customers=60, terminals=50, train_days=10, test_days=1, start_date="2018-04-01",
                                seed=5)
DAY = [f"2018-04-{d:02d}" for d in range(1, 12)]  # DAY[0] = April 1st
LABELS = ("TX_FRAUD", "TX_FRAUD_SCENARIO")
_TMP = tempfile.TemporaryDirectory(prefix="daily-cycle-")


def _simulated() -> dict[str, pd.DataFrame]:
    root = Path(_TMP.name) / "sim"
    simulator.generate(root, SPEC)
    return {p.stem: pd.read_parquet(p) for p in sorted(root.glob("*/*.parquet"))}


FRAMES = _simulated()  # day -> its labelled transactions


def labelled(folder: Path, day: str, frame: pd.DataFrame | None = None) -> None:
    (folder / "training").mkdir(parents=True, exist_ok=True)
    (FRAMES[day] if frame is None else frame).to_parquet(folder / "training" / f"{day}.parquet", index=False)


def unlabelled(folder: Path, day: str) -> None:
    (folder / "scoring").mkdir(parents=True, exist_ok=True)
    FRAMES[day].drop(columns=list(LABELS)).to_parquet(folder / "scoring" / f"{day}.parquet", index=False)


def chargeback(day: str) -> pd.DataFrame:
    """The day with one legitimate transaction reported as fraud weeks later."""
    frame = FRAMES[day].copy()
    row = frame.index[frame["TX_FRAUD"] == 0][3]
    frame.loc[row, list(LABELS)] = 1
    return frame


class Bank:
    """A share and a real Redis, fed by `seed` and drained by a worker, in this process."""

    def __init__(self, base: Path, server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
        self.base, self.server, self.share = base, server, base / "share"
        self.export = base / "export"  # the bank's folder, one more day in it each night
        base.mkdir(parents=True)
        (base / "runs.json").write_text(json.dumps({"main": QUICK}))
        monkeypatch.setenv("REDIS_PASSWORD", server.password)
        # Two PNGs after each night's last day cost more than the night's training; this test reads no picture.
        monkeypatch.setattr(Attempt, "pictures_due", lambda self: False)

    def seed(self) -> int:
        return cli.main(["seed", "--share", str(self.share), "--redis-url", self.server.url, "--datasets",
                         str(self.export), "--test-window", str(WINDOW), "--runs-file", str(self.base / "runs.json")])

    def drain(self) -> dict:
        queue = WorkQueue(connect(self.server.url, self.server.password))
        cfg = WorkerConfig(share=self.share, redis_url=self.server.url, redis_password=self.server.password,
                           worker_id="w1", lease_ttl_s=10, checkpoint_interval_s=600, idle_poll_s=0.05,
                           plot_interval_s=3600)
        assert Worker(cfg, queue).run() == EXIT_DONE
        loaded = CheckpointStore(self.share / "output" / "main").load()
        assert loaded is not None
        return loaded.state

    def dataset(self) -> ds.Dataset:
        return ds.Dataset(self.share / "datasets" / "fraud")


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[RedisServer, RedisServer]]:
    one, two = RedisServer(tmp_path / "redis-1").start(), RedisServer(tmp_path / "redis-2").start()
    try:
        yield one, two
    finally:
        one.kill()
        two.kill()


def trained_tonight(before: list[dict], after: list[dict]) -> list[str]:
    """The days trained tonight: the history entries after the part of last night's it still holds."""
    same = 0
    while same < min(len(before), len(after)) and before[same]["checkpoint"] == after[same]["checkpoint"]:
        same += 1
    return [h["shard"] for h in after[same:]]


def night(bank: Bank, n: int) -> tuple[list[str], dict]:
    """Night `n` (0: the first seed with four labelled days): its new days arrive, are trained and scored."""
    for day in DAY[:4] if n == 0 else [DAY[3 + n]]:
        labelled(bank.export, day)
    unlabelled(bank.export, DAY[4 + n])
    if n == 5:  # a chargeback for April 2nd, long trained
        labelled(bank.export, DAY[1], chargeback(DAY[1]))
    assert bank.seed() == 0
    return DAY[4 + n], bank.drain()


def test_a_week_of_days_arriving_one_a_night_trains_each_once_in_date_order(
        tmp_path: Path, servers: tuple[RedisServer, RedisServer], monkeypatch: pytest.MonkeyPatch) -> None:
    bank, history, tested = Bank(tmp_path / "bank", servers[0], monkeypatch), [], []
    relabelled = f"training/v2/{DAY[1]}.parquet"
    for n in range(7):
        scoring_day, state = night(bank, n)
        data = bank.dataset()
        newest = [f"training/{d}.parquet" for d in DAY[2 + n: 4 + n]]
        assert data.test_window() == newest, "the newest two labelled days test"
        assert state["applied"] == data.training_shards(), "every training day applied, in date order"
        assert state["history"][-1]["test_window"] == newest
        tested.append(state["history"][-1]["test_window"])
        trained = trained_tonight(history, state["history"])
        moved = f"training/{DAY[1 + n]}.parquet"
        expect = ([f"training/{DAY[0]}.parquet", f"training/{DAY[1]}.parquet"] if n == 0 else
                  [relabelled, *(f"training/{d}.parquet" for d in DAY[2:7])] if n == 5 else [moved])
        assert trained == expect, f"night {n}"
        history = state["history"]
        out = tmp_path / f"scores-{n}.parquet"
        score.score_dataset(bank.share / "output" / "main", str(data.root), str(out))
        scored = pd.read_parquet(out)
        assert sorted(scored["TRANSACTION_ID"]) == sorted(FRAMES[scoring_day]["TRANSACTION_ID"]), \
            "tonight's unlabelled day is scored, and no day scored before"
        assert scored["score"].notna().all()
        if n == 3:  # with its history: the same day scored alone (no earlier days) scores otherwise
            alone, alone_out = tmp_path / "alone", tmp_path / "alone.parquet"
            unlabelled(alone, scoring_day)
            score.score_dataset(bank.share / "output" / "main", str(alone), str(alone_out), allow_short_history=True)
            both = scored.merge(pd.read_parquet(alone_out), on="TRANSACTION_ID", suffixes=("", "_alone"))
            assert len(both) == len(scored) and (both["score"] != both["score_alone"]).any()
    assert len({tuple(w) for w in tested}) == 7, "the test window moved every night"
    assert [r["day"] for r in state["reapplied"]] == [relabelled]
    assert "new labels for training/2018-04-02.parquet" in state["reapplied"][0]["why"]
    report = (bank.share / "output" / "main" / "report.txt").read_text()
    assert relabelled in report and f"tested on: 2 day(s), training/{DAY[8]}.parquet .. training/{DAY[9]}" in report

    # The same days, all at once in date order, with tonight's labels: the same weights, bit for bit.
    ref = Bank(tmp_path / "ref", servers[1], monkeypatch)
    for day in DAY[:10]:
        labelled(ref.export, day, chargeback(day) if day == DAY[1] else None)
    unlabelled(ref.export, DAY[10])
    assert ref.seed() == 0
    reference = ref.drain()
    assert [s.replace("/v2/", "/") for s in state["applied"]] == reference["applied"]
    assert same_weights(state, reference)


def test_a_changed_day_that_is_more_than_new_labels_is_refused_and_so_is_a_testing_folder(
        tmp_path: Path, servers: tuple[RedisServer, RedisServer], monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    """Late labels keep a day's transactions; with the cycle, no testing/ folder (the rule picks the test days)."""
    bank = Bank(tmp_path / "bank", servers[0], monkeypatch)
    for day in DAY[:3]:
        labelled(bank.export, day)
    assert bank.seed() == 0
    moved = FRAMES[DAY[1]].copy()
    moved.loc[moved.index[0], "TX_AMOUNT"] += 1.0
    labelled(bank.export, DAY[1], moved)
    assert bank.seed() == EXIT_BAD_CONFIG
    assert "not only its labels" in capfd.readouterr().err
    shutil.rmtree(bank.export / "training")
    for day in DAY[:3]:
        labelled(bank.export, day)
    (bank.export / "testing").mkdir()
    FRAMES[DAY[3]].to_parquet(bank.export / "testing" / f"{DAY[3]}.parquet", index=False)
    assert bank.seed() == EXIT_BAD_CONFIG
    assert "the rule picks the test days" in capfd.readouterr().err


def test_a_worker_s_dataset_sees_tonight_s_window_without_being_opened_again(tmp_path: Path) -> None:
    """A worker keeps its Dataset for days: when a publish moves the window, its order and test days move too,
    and the manifest records the rule and what it retired."""
    export, root = tmp_path / "export", tmp_path / "share" / "fraud"
    for day in DAY[:3]:
        labelled(export, day)
    unlabelled(export, DAY[3])
    publish.publish(root, source.LocalSource(export), cycle=Cycle(WINDOW))
    data = ds.Dataset(root)
    assert data.training_shards() == [f"training/{DAY[0]}.parquet"]
    assert data.test_window() == [f"training/{d}.parquet" for d in DAY[1:3]]
    labelled(export, DAY[3])
    publish.publish(root, source.LocalSource(export))  # the recorded rule holds when none is given
    assert data.training_shards() == [f"training/{d}.parquet" for d in DAY[:2]]
    assert data.test_window() == [f"training/{d}.parquet" for d in DAY[2:4]]
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["cycle"] == {"test_days": WINDOW}
    assert [(r["path"], r["retired_by"]) for r in manifest["retired"]] == [
        (f"scoring/{DAY[3]}.parquet", f"training/{DAY[3]}.parquet")]
    with pytest.raises(DatasetError, match="refusing the daily cycle"):
        publish.publish(root, source.LocalSource(export), cycle=Cycle(3))


def test_new_labels_for_a_day_still_queued_replace_its_item(
        tmp_path: Path, servers: tuple[RedisServer, RedisServer], monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers lag a night: the old version's item is still pending when the new labels arrive. Seed
    marks it done (the manifest no longer has that day) and queues the new version: no dead letter."""
    bank = Bank(tmp_path / "bank", servers[0], monkeypatch)
    for day in DAY[:3]:
        labelled(bank.export, day)
    assert bank.seed() == 0
    labelled(bank.export, DAY[0], chargeback(DAY[0]))
    assert bank.seed() == 0
    c = WorkQueue(connect(bank.server.url, bank.server.password)).counts()
    assert (c.pending, c.done, c.dead) == (1, 1, 0)
    assert bank.drain()["applied"] == [f"training/v2/{DAY[0]}.parquet"]


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "2", None])
def test_a_cycle_needs_a_whole_number_of_test_days_of_at_least_one(bad: object) -> None:
    with pytest.raises(DatasetError) as err:
        Cycle(bad)  # type: ignore[arg-type]
    assert str(err.value) == (f"test days: {bad!r}; the daily cycle needs a whole number of test days of at least 1 "
                              "(the newest N labelled days test, older ones train)")


def test_a_cycle_reads_back_from_its_manifest_record_and_says_what_it_is() -> None:
    assert Cycle(1).test_days == 1 and Cycle.from_record(Cycle(2).record()) == Cycle(2)
    assert Cycle.from_record(None) is None, "a dataset without a cycle"
    for bad in ({}, [2], {"days": 2}):
        with pytest.raises(DatasetError) as err:
            Cycle.from_record(bad)
        assert str(err.value) == f"manifest cycle: {bad!r}; expected {{test_days: N}}"
    assert cycle.describe(None) == "a fixed holdout (testing/ days test)"
    assert cycle.describe(Cycle(2)) == "the daily cycle (the newest 2 labelled day(s) test, older ones train)"


def test_a_version_stands_for_its_day_and_remembers_its_source_file() -> None:
    assert cycle.version_path("training/2018-04-05.parquet", 2) == "training/v2/2018-04-05.parquet"
    assert cycle.unversioned("training/v2/2018-04-05.parquet") == "training/2018-04-05.parquet"
    for other in ("training/2018-04-05.parquet", "training/late/2018-04-05.parquet",
                  "training/v2/x/2018-04-05.parquet"):
        assert cycle.unversioned(other) == other
    assert cycle.source_rel({"path": "training/v2/2018-04-05.parquet", "from": "training/2018-04-05.csv"}) == (
        "training/2018-04-05.csv")
    assert cycle.source_rel({"path": "training/2018-04-05.parquet"}) == "training/2018-04-05.parquet"
