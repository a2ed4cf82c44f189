"""A packed worker (`WorkerConfig.pack_runs`, runtime/packing.py) driven in the pytest process against a real Redis
and a real share (inprocess.py): a sweep trained packed ends where the same sweep trained one item at a time ends
(within `packed.SOLO_TOLERANCE`, per run's final weights); a run with bad hyperparameters is dead-lettered alone;
a run whose lease another worker took stops alone and writes nothing, while the rest of its pack trains on; a pack
reads its common window once (not once a run); after a real SIGTERM its runs' final checkpoints share one budget."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from harness import poll_claim
from inprocess import DAYS, Share, share_env

from workload.core.errors import EXIT_DEAD_LETTERS, EXIT_DONE
from workload.model import packed
from workload.runtime.steps import Outcome
from workload.runtime.worker import Worker
from workload.share.checkpoint import CheckpointStore

pytestmark = pytest.mark.timeout(120)

BASE = {"epochs": 2, "batch_size": 32, "hidden": [8]}
# A sweep: seeds, learning rates, weight decays; one run with more epochs a day (it trains on alone at the end).
SWEEP = {"a": {**BASE, "seed": 1}, "b": {**BASE, "seed": 2, "lr": 5e-3},
         "c": {**BASE, "seed": 3, "weight_decay": 1e-3, "epochs": 3}}
WIDER = {"d": {**BASE, "seed": 4, "hidden": [16]}}  # other widths: leased with the sweep, trains alone


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Share]:
    yield from share_env(tmp_path)


def sweep(env: Share, pack: int, runs: dict[str, dict] = SWEEP) -> dict[str, dict]:
    queue = env.seed(runs)
    assert Worker(env.config(pack_runs=pack), queue).run() == EXIT_DONE
    return {run: env.state(run) for run in runs}


def test_a_packed_workers_sweep_ends_where_the_sweep_trained_one_item_at_a_time_ends(
        env: Share, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="workload.runtime.worker"):
        together = sweep(env, pack=4, runs={**SWEEP, **WIDER})
    assert sum("packed (token" in r.getMessage() for r in caplog.records) == 4 * len(DAYS)  # every item leased so
    (tmp_path / "solo").mkdir()
    for solo_env in share_env(tmp_path / "solo"):
        alone = sweep(solo_env, pack=1, runs={**SWEEP, **WIDER})
    for part in ("model", "averaged"):  # the run that packs with none trains alone, as today: bit for bit
        assert all(torch.equal(together["d"][part][k], v) for k, v in alone["d"][part].items())
    for run in SWEEP:
        a, b = alone[run], together[run]
        assert (b["applied"], b["steps"], b["progress"]) == (a["applied"], a["steps"], None) and a["applied"] == DAYS
        for part in ("model", "averaged"):
            for k in a[part]:
                torch.testing.assert_close(b[part][k], a[part][k], **packed.SOLO_TOLERANCE, msg=f"{run} {part} {k}")
        assert [h["shard"] for h in b["history"]] == DAYS
    assert not torch.equal(together["a"]["model"]["net.0.weight"], together["b"]["model"]["net.0.weight"])


def test_a_packs_runs_read_their_common_window_once_a_day_not_once_a_run(env: Share) -> None:
    """Three runs of one window (two days' window from the second day on): each pack reads each file's features
    once for all three (the window of step 6, the calibration days of step 8), as one run alone would."""
    runs = {r: {**hp, "window_days": 2} for r, hp in SWEEP.items()}
    queue = env.seed(runs)
    worker = Worker(env.config(pack_runs=3), queue)
    for day in DAYS:
        first = queue.claim("w1", 10)
        assert first and first.item.shard == day
        before = dict(worker.dataset("fraud").reads)
        assert worker.process_pack([first, *queue.claim_also(first, 10, 2)]) is Outcome.DONE
        reads = {f: n - before.get(f, 0) for f, n in worker.dataset("fraud").reads.items() if n > before.get(f, 0)}
        assert reads.get(day) == 1 and set(reads.values()) == {1}, (day, reads)
    assert all(env.state(r)["applied"] == DAYS for r in runs)


def test_a_packed_run_with_bad_hyperparameters_is_dead_lettered_alone(env: Share) -> None:
    queue = env.seed(SWEEP)
    record = env.share / "runs" / "b.json"
    spec = json.loads(record.read_text())
    record.write_text(json.dumps({**spec, "hparams": {**spec["hparams"], "lr": 5.0}}))  # edited on the share
    assert Worker(env.config(pack_runs=3), queue).run() == EXIT_DEAD_LETTERS
    runs = queue.snapshot()["runs"]
    assert sorted(runs["b"]["dead"]) == [f"b/{d}" for d in DAYS]
    assert all("lr=5.0 is not allowed" in d["error"] for d in runs["b"]["dead"].values())
    assert [runs[r]["done"] for r in ("a", "c")] == [3, 3] and not runs["a"]["dead"] and not runs["c"]["dead"]
    assert env.state("a")["applied"] == env.state("c")["applied"] == DAYS
    assert CheckpointStore(env.share / "output" / "b").load() is None


def test_a_packed_run_whose_lease_another_worker_took_stops_alone_and_writes_nothing(
        env: Share, caplog: pytest.LogCaptureFixture) -> None:
    """Run b's lease lapses right after the packed claim and a peer takes it: b stops at its next step (its
    heartbeat says the lease is lost), nothing of it is promoted, reported or acked; a and c train the day on."""
    runs = {r: {**hp, "epochs": 12} for r, hp in SWEEP.items()}  # 36 steps (~50 ms each): b notices mid-day
    queue = env.seed(runs)
    worker = Worker(env.config(pack_runs=3, heartbeat_s=0.05), queue)
    first = queue.claim("w1", 10)
    assert first and first.item.run == "a"
    more = queue.claim_also(first, 10, 2)
    assert [m.item.run for m in more] == ["b", "c"]
    assert queue.heartbeat(more[0], ttl_s=0.001)  # b's lease lapses ...
    taken = poll_claim(queue, "peer", 30)  # ... and another worker takes it
    assert taken.item.id == more[0].item.id
    with caplog.at_level(logging.WARNING):
        assert worker.process_pack([first, *more]) is Outcome.LOST
    assert any(r.getMessage().startswith("b/training/2018-04-01.parquet stops, the other runs of its pack train on")
               for r in caplog.records)
    snap = queue.snapshot()["runs"]
    assert (snap["a"]["done"], snap["b"]["done"], snap["c"]["done"]) == (1, 0, 1)
    assert snap["b"]["lease"]["owner"] == "peer"
    assert env.state("a")["applied"] == env.state("c")["applied"] == DAYS[:1]
    assert CheckpointStore(env.share / "output" / "b").load() is None
    assert not (env.share / "output" / "b" / "report.txt").exists()


def test_sigterm_stops_every_packed_run_at_one_step_each_with_its_own_final_checkpoint_released_at_no_cost(
        env: Share) -> None:
    # 1,200 steps (a few ms each): the day outlasts the 0.2-s interval on an idle machine too, so a mid-day checkpoint
    # comes first and the flag is set mid-day (with 12 epochs the day ended in ~0.2 s and the flag came too late)
    runs = {r: {**hp, "epochs": 400} for r, hp in SWEEP.items()}
    queue = env.seed(runs)
    worker = Worker(env.config(pack_runs=3, checkpoint_interval_s=0.2), queue)
    first = queue.claim("w1", 10)
    assert first
    leases = [first, *queue.claim_also(first, 10, 2)]

    def stop_once_training_checkpointed() -> None:  # SIGTERM's flag, set mid-day
        while CheckpointStore(env.share / "output" / "a").load() is None:
            time.sleep(0.01)
        worker.stop.set()

    threading.Thread(target=stop_once_training_checkpointed, daemon=True).start()
    assert worker.process_pack(leases) is Outcome.RELEASED
    progress = [env.state(run)["progress"] for run in runs]
    assert all(p and p["shard"] == DAYS[0] for p in progress), progress
    steps = [p["epoch"] * 3 + p["batch"] for p in progress]  # 3 batches an epoch (80 rows, 32 a batch)
    assert max(steps) - min(steps) <= 1  # each stopped at its next step after the flag (set between two runs' steps)
    snap = queue.snapshot()["runs"]
    assert all(snap[r]["pending"][0] == f"{r}/{DAYS[0]}" and snap[r]["attempts"] == {} and snap[r]["lease"] is None
               for r in runs)


def test_after_a_real_sigterm_a_packs_final_checkpoints_fit_one_budget_together_not_each_its_own(
        env: Share, caplog: pytest.LogCaptureFixture) -> None:
    """SIGTERM (the real signal, the worker's own handler) mid-day: each run's final checkpoint is expected to take
    1 s (the guess before a first save is measured: no mid-day save yet), the budget after SIGTERM is 2.5 s; one
    run alone would save (1 < 2.5), but three would not fit: runs a and b save theirs, c saves none (it loses one
    checkpoint interval). All three are released at no cost."""
    runs = {r: {**hp, "epochs": 12} for r, hp in SWEEP.items()}
    queue = env.seed(runs)
    worker = Worker(env.config(pack_runs=3, term_grace_s=3600, term_budget_s=2.5), queue)
    first = queue.claim("w1", 10)
    assert first
    leases = [first, *queue.claim_also(first, 10, 2)]

    done = threading.Event()

    def sigterm_once_training() -> None:
        while not done.is_set() and not any("(packed, 3): training on" in r.getMessage() for r in list(caplog.records)):
            time.sleep(0.005)
        if not done.is_set():  # never after the handler is put back: the default one would end pytest
            os.kill(os.getpid(), signal.SIGTERM)

    old = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    before = set(threading.enumerate())
    signaller = threading.Thread(target=sigterm_once_training, daemon=True)
    try:
        worker.install_signal_handlers()
        with caplog.at_level(logging.INFO):
            signaller.start()
            started = time.monotonic()
            outcome = worker.process_pack(leases)
            stopped_in = time.monotonic() - started
    finally:
        done.set()
        signaller.join(5)
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])
        for t in threading.enumerate():
            if t not in before and isinstance(t, threading.Timer):
                t.cancel()  # the hour-long grace timer: not left behind in the test process
    assert outcome is Outcome.RELEASED and worker.stop.is_set() and stopped_in < 30
    for run in ("a", "b"):
        progress = env.state(run)["progress"]
        assert progress and progress["shard"] == DAYS[0] and (progress["epoch"], progress["batch"]) > (0, 0), run
    assert CheckpointStore(env.share / "output" / "c").load() is None
    assert any(r.getMessage().startswith(f"c/{DAYS[0]}: no time for a final checkpoint") for r in caplog.records)
    snap = queue.snapshot()["runs"]
    assert all(snap[r]["pending"][0] == f"{r}/{DAYS[0]}" and snap[r]["attempts"] == {} and snap[r]["lease"] is None
               for r in runs)
