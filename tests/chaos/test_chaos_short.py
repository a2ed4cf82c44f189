"""A short chaos run in every `make test`: random SIGKILL/SIGTERM/SIGSTOP of workers, a full share,
a Redis restart and a Redis wipe, a backfill (a worker's view of the dataset goes stale) and the share's
output restored from an older backup.

The long version is `make chaos`; this one is sized to stay under a minute on two cores and still
fails when any shard is lost, applied twice, or left leased or pending, or when weights drift.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import ChaosConfig, run_chaos

pytestmark = pytest.mark.timeout(240)


def test_short_chaos_run_applies_every_shard_exactly_once(tmp_path: Path) -> None:
    result = run_chaos(ChaosConfig(workers=2, runs=2, events=5, seed=20261122), tmp_path)
    print(result.summary())
    disturbed = (result.kills + result.terms + result.stops + result.full_shares + result.redis_old
                 + result.redis_ooms + result.redis_freezes)
    assert disturbed >= 3 and result.redis_restarts == 1 and result.redis_wipes == 1 and result.backfills == 1 \
        and result.share_restores == 1, \
        f"the run finished before it was disturbed: {result.summary()}"
    assert not result.violations, "\n".join(result.violations)


def test_the_verifier_catches_lost_duplicated_leased_and_drifted(tmp_path: Path) -> None:
    """The chaos verdict is only worth something if it can fail: tamper with a clean run and see it fail."""
    import copy

    import torch

    from bench.chaos import ChaosConfig, _cluster, run_specs, verify
    from tests.workload.harness import make_dataset
    from workload.queue.workqueue import Item
    from workload.share.checkpoint import CheckpointStore

    cfg = ChaosConfig(runs=1)
    cluster = _cluster(tmp_path / "c", make_dataset(tmp_path / "dataset"), cfg)
    try:
        cluster.seed(run_specs(1))
        cluster.start_worker("w")
        assert cluster.wait_all() == [0], cluster.log("w")
        clean = cluster.final_state("run0")
        assert verify(cluster, {"run0": clean}, {"w": 0}) == []

        drifted = copy.deepcopy(clean)
        name = next(iter(drifted["model"]))
        drifted["model"][name] = drifted["model"][name] + torch.finfo(torch.float32).eps
        assert any("weights differ" in v for v in verify(cluster, {"run0": drifted}, {}))
        assert any("exited 1" in v for v in verify(cluster, {"run0": clean}, {"w": 1}))

        store = CheckpointStore(cluster.share / "output" / "run0")
        twice = {**copy.deepcopy(clean), "applied": [*clean["applied"], clean["applied"][0]]}
        store.save(twice, path=store.next_path(999), may_promote=lambda: True, boundary=True)
        problems = verify(cluster, {"run0": clean}, {})
        assert any("more than once" in v for v in problems), problems
        lost = {**copy.deepcopy(clean), "applied": clean["applied"][1:]}
        store.save(lost, path=store.next_path(1000), may_promote=lambda: True, boundary=True)
        assert any("never applied" in v for v in verify(cluster, {"run0": clean}, {}))

        queue = cluster.queue()
        queue.enqueue([Item(run="run0", shard="training/extra.parquet", dataset="fraud", seq=99)])
        assert queue.claim("ghost", 60) is not None  # claimed by a worker that then vanished
        assert any("1 leased" in v for v in verify(cluster, {"run0": clean}, {}))
    finally:
        cluster.stop()
        cluster.server.kill()
