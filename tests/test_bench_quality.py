"""bench.quality's ensemble under trial (issue 33): K members (seeds) trained packed as a packed worker trains them,
scored as their calibrated mean; one member is the default run, bit for bit. On small synthetic days (seconds)."""

from __future__ import annotations

import numpy as np

from bench import quality
from workload.data import dataset as ds
from workload.data import features
from workload.model.hparams import HParams

HP = HParams.from_dict({"hidden": [8], "epochs": 2, "batch_size": 32, "window_days": 2, "min_steps": 0})


def days(n: int = 3, rows: int = 160) -> list[tuple[str, ds.Examples]]:
    rng = np.random.default_rng(0)
    out = []
    for d in range(n):
        x = rng.normal(size=(rows, len(features.FEATURE_NAMES))).astype(np.float32)
        y = (x[:, 0] + rng.normal(size=rows) > 1.5).astype(np.float32)
        day = np.full(rows, np.datetime64(f"2018-04-0{d + 1}"), dtype="datetime64[D]")
        out.append((f"training/2018-04-0{d + 1}.parquet",
                    ds.Examples(x, y, day, np.arange(rows), np.zeros(rows, dtype=bool), np.arange(rows) + d * rows)))
    return out


def test_one_member_is_the_default_run_and_k_members_are_the_mean_of_their_seeds_solo_runs() -> None:
    parts, x_test = days(), days(1, 200)[0][1].x
    assert np.array_equal(quality.ensemble_run(parts, x_test, 1, 1, HP), quality.default_run(parts, x_test, 1, HP))
    got = quality.ensemble_run(parts, x_test, 1, 2, HP)  # members of seeds 2 and 3, trained packed
    solo = [quality.default_run(parts, x_test, s, HP) for s in (2, 3)]
    np.testing.assert_allclose(got, np.mean(solo, axis=0), rtol=0, atol=1e-5)  # packed within its tolerance
    assert np.abs(solo[0] - solo[1]).max() > 1e-3  # the members differ: their mean is not one of them


def test_each_member_is_calibrated_before_the_mean() -> None:
    """Platt's fit matches the labels' mean on its own rows, so the calibrated mean does too; the class-weighted
    networks' own probabilities overstate fraud."""
    parts = days()
    cal = parts[-1][1]
    raw = quality.ensemble_run(parts, cal.x, 0, 2, HP)
    calibrated = quality.ensemble_run(parts, cal.x, 0, 2, HP, calibrate_on=cal)
    assert abs(float(calibrated.mean()) - float(cal.y.mean())) < 2e-3
    assert float(raw.mean()) > float(cal.y.mean()) + 0.02
