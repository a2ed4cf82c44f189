"""A customer's w-day window is (t - w days, t]: a transaction exactly w days earlier is outside it.

The hand-computed windows in test_features.py never place a row exactly on a window's start, so a
window closed on the left ([t - w days, t]) would pass them. Here rows sit exactly 1, 7 and 30 days
before others, two of them tied at the same second with IDs out of order, and one sits a second
inside the 1-day window; timestamps are time-zone aware and IDs typed as floats, as files give them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workload import features, schema

# (id, UTC datetime, customer, amount); the frame is sorted by (datetime, id) as the dataset sorts it.
ROWS = [
    (5, "2018-04-01 10:00:00", 1, 10.0),
    (2, "2018-04-01 10:00:00", 1, 30.0),  # tied with id 5 to the second
    (7, "2018-04-01 10:00:01", 2, 40.0),
    (1, "2018-04-02 10:00:00", 1, 20.0),  # exactly 1 day after ids 2 and 5
    (3, "2018-04-02 10:00:00", 2, 60.0),  # 1 day less 1 second after id 7
    (4, "2018-04-08 10:00:00", 1, 50.0),  # exactly 7 days after ids 2 and 5
    (6, "2018-05-01 10:00:00", 1, 70.0),  # exactly 30 days after ids 2 and 5
]


def frame() -> pd.DataFrame:
    when = pd.to_datetime([r[1] for r in ROWS]).tz_localize("UTC")
    seconds = ((when - pd.Timestamp("2018-04-01", tz="UTC")) // pd.Timedelta(seconds=1)).to_numpy()
    out = pd.DataFrame(
        {
            schema.TRANSACTION_ID: [r[0] for r in ROWS],
            schema.TX_DATETIME: when,
            schema.CUSTOMER_ID: [float(r[2]) for r in ROWS],
            schema.TERMINAL_ID: [100.0] * len(ROWS),
            schema.TX_AMOUNT: [r[3] for r in ROWS],
            schema.TX_TIME_SECONDS: seconds,
            schema.TX_TIME_DAYS: seconds // 86400,
            schema.TX_FRAUD: [0] * len(ROWS),
            schema.TX_FRAUD_SCENARIO: [0] * len(ROWS),
        }
    )
    return out.sort_values([schema.TX_DATETIME, schema.TRANSACTION_ID], ignore_index=True)


def windows() -> dict[int, dict[str, float]]:
    f = frame()
    x = features.compute_features(f, np.ones(len(f), dtype=bool))
    names = features.FEATURE_NAMES
    return {
        int(tx): {name: float(value) for name, value in zip(names, row, strict=True)}
        for tx, row in zip(f[schema.TRANSACTION_ID], x, strict=True)
    }


def count(w: dict[str, float], days: int) -> float:
    return float(np.expm1(w[f"customer_log_nb_tx_{days}d"]))


def mean(w: dict[str, float], days: int) -> float:
    return float(np.expm1(w[f"customer_log_avg_amount_{days}d"]))


# id -> days -> (count, mean amount) of the customer's transactions in (t - days, t], the row included.
EXPECTED = {
    1: {1: (1, 20.0), 7: (3, 20.0), 30: (3, 20.0)},  # ids 2 and 5 are exactly 1 day back: not in 1d
    3: {1: (2, 50.0)},  # id 7 is 23:59:59 back: inside 1d
    4: {1: (1, 50.0), 7: (2, 35.0), 30: (4, 27.5)},  # ids 2 and 5 are exactly 7 days back: not in 7d
    6: {1: (1, 70.0), 7: (1, 70.0), 30: (3, 140.0 / 3)},  # ids 2 and 5 are exactly 30 days back: not in 30d
    2: {1: (1, 30.0)},  # tied with id 5, sorted before it: only itself so far
    5: {1: (2, 20.0)},  # tied with id 2, sorted after it: both
}


@pytest.mark.parametrize("tx", EXPECTED)
def test_a_row_exactly_w_days_earlier_is_outside_the_window(tx: int) -> None:
    got = windows()[tx]
    for days, (n, avg) in EXPECTED[tx].items():
        assert (count(got, days), mean(got, days)) == pytest.approx((n, avg), rel=1e-5), f"id {tx}, {days}d"


def test_every_window_length_is_checked_on_its_boundary() -> None:
    assert set(features.WINDOWS_DAYS) == {1, 7, 30}
    assert {d for per_day in EXPECTED.values() for d in per_day} == set(features.WINDOWS_DAYS)
