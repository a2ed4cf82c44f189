"""A short chaos run in every `make test`: random SIGKILL/SIGTERM of workers and a Redis restart.

The long version is `make chaos`; this one is sized to stay under a minute on two cores and still
fails when any shard is lost, applied twice, or left leased or pending, or when weights drift.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos import ChaosConfig, run_chaos

pytestmark = pytest.mark.timeout(240)


def test_short_chaos_run_applies_every_shard_exactly_once(tmp_path: Path) -> None:
    result = run_chaos(ChaosConfig(workers=2, runs=2, events=4, seed=20261122), tmp_path)
    print(result.summary())
    assert result.kills + result.terms >= 2 and result.redis_restarts == 1, \
        f"the run finished before it was disturbed: {result.summary()}"
    assert not result.violations, "\n".join(result.violations)
