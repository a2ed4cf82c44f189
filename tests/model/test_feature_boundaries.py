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

from workload.data import features, schema

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


def _rows(rows: list[tuple[int, str, int, int, float, int]]) -> pd.DataFrame:
    """A validated frame from (id, datetime, customer, terminal, amount, fraud), sorted by (datetime, id)."""
    when = pd.to_datetime([r[1] for r in rows])
    seconds = ((when - pd.Timestamp("2018-04-01")) // pd.Timedelta(seconds=1)).to_numpy()
    out = pd.DataFrame({
        schema.TRANSACTION_ID: [r[0] for r in rows], schema.TX_DATETIME: when,
        schema.CUSTOMER_ID: [r[2] for r in rows], schema.TERMINAL_ID: [r[3] for r in rows],
        schema.TX_AMOUNT: [r[4] for r in rows], schema.TX_TIME_SECONDS: seconds,
        schema.TX_TIME_DAYS: seconds // 86400, schema.TX_FRAUD: [r[5] for r in rows],
        schema.TX_FRAUD_SCENARIO: [r[5] for r in rows],
    })
    return out.sort_values([schema.TX_DATETIME, schema.TRANSACTION_ID], ignore_index=True)


def test_weekend_starts_on_saturday_and_night_ends_at_six() -> None:
    f = _rows([
        (1, "2018-04-06 23:59:59", 1, 100, 10.0, 0),  # Friday, 23 h
        (2, "2018-04-07 05:59:59", 1, 100, 10.0, 0),  # Saturday, still night
        (3, "2018-04-07 06:00:00", 1, 100, 10.0, 0),  # Saturday, six o'clock: day
        (4, "2018-04-08 12:00:00", 1, 100, 10.0, 0),  # Sunday
        (5, "2018-04-09 00:00:00", 1, 100, 10.0, 0),  # Monday, midnight: night
    ])
    x = features.compute_features(f, np.ones(len(f), dtype=bool))
    names = features.FEATURE_NAMES
    np.testing.assert_array_equal(x[:, names.index("weekend")], [0, 1, 1, 1, 0])
    np.testing.assert_array_equal(x[:, names.index("night")], [0, 1, 0, 0, 1])


def test_amounts_below_one_keep_their_ratio_to_the_customers_mean() -> None:
    """Payments of cents: the amount-to-mean ratio is the plain ratio (the floor only keeps 0/0 out)."""
    f = _rows([(1, "2018-04-02 10:00:00", 1, 100, 0.2, 0), (2, "2018-04-02 11:00:00", 1, 100, 0.6, 0),
               (3, "2018-04-02 12:00:00", 2, 100, 0.0, 0)])
    x = features.compute_features(f, np.ones(3, dtype=bool))
    ratio = x[:, features.FEATURE_NAMES.index("amount_to_customer_avg_1d")]
    np.testing.assert_allclose(ratio, [1.0, 0.6 / 0.4, 0.0], rtol=1e-6)


# Two transactions tied at the frame's very first second (midnight), IDs out of order, then customer 2's
# fraud at terminal 200 at the frame's very last second: customer 1 and terminal 100, whose first row sits
# at that first second, must never count it (their keys are the next block after customer 2's and
# terminal 200's).
MIDNIGHT = [
    (8, "2018-04-01 00:00:00", 2, 200, 10.0, 0),
    (9, "2018-04-01 00:00:00", 1, 100, 10.0, 0),
    (3, "2018-04-09 12:00:00", 1, 100, 30.0, 0),
    (4, "2018-04-20 23:59:59", 2, 200, 50.0, 1),
]


def _first_row_of_customer_1(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    target = (frame[schema.TRANSACTION_ID] == 9).to_numpy()
    out = features.compute(frame, target)
    return {name: out["x"][0, i] for i, name in enumerate(features.FEATURE_NAMES)} | {"known": out["known"][0]}


def test_windows_never_reach_into_another_customers_or_terminals_rows() -> None:
    got = _first_row_of_customer_1(_rows(MIDNIGHT))
    for w in features.WINDOWS_DAYS:
        assert got[f"customer_log_nb_tx_{w}d"] == pytest.approx(np.log1p(1))
        assert got[f"terminal_log_nb_tx_{w}d_delayed"] == 0.0
    assert not got["known"]


def test_a_delay_longer_than_the_lookback_still_reads_only_the_terminals_own_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The delayed windows are clamped to their terminal's (customer's) own rows even when they reach
    further back than the frame's history (``LABEL_DELAY_SECONDS`` is read at call time)."""
    monkeypatch.setattr(features, "LABEL_DELAY_SECONDS", features.LABEL_DELAY_SECONDS + 10 * features.SECONDS_PER_DAY)
    got = _first_row_of_customer_1(_rows(MIDNIGHT))
    for w in features.WINDOWS_DAYS:
        assert got[f"terminal_log_nb_tx_{w}d_delayed"] == 0.0
    assert not got["known"]
