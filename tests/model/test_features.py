"""Features are computed by hand-checkable rules and never see labels they could not know."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from workload.data import features, schema, simulator

NAMES = features.FEATURE_NAMES


def _frame(rows: list[tuple[str, int, int, float, int]]) -> pd.DataFrame:
    """Transactions from (datetime, customer, terminal, amount, fraud), in the validated layout."""
    when = pd.to_datetime([r[0] for r in rows])
    start = pd.Timestamp("2018-04-01")
    seconds = ((when - start) // pd.Timedelta(seconds=1)).to_numpy()
    frame = pd.DataFrame(
        {
            schema.TRANSACTION_ID: np.arange(len(rows), dtype=np.int64),
            schema.TX_DATETIME: when,
            schema.CUSTOMER_ID: [r[1] for r in rows],
            schema.TERMINAL_ID: [r[2] for r in rows],
            schema.TX_AMOUNT: [float(r[3]) for r in rows],
            schema.TX_TIME_SECONDS: seconds,
            schema.TX_TIME_DAYS: seconds // 86400,
            schema.TX_FRAUD: [r[4] for r in rows],
            schema.TX_FRAUD_SCENARIO: [2 * r[4] for r in rows],
        }
    )
    return frame.sort_values([schema.TX_DATETIME, schema.TRANSACTION_ID], ignore_index=True)


def _column(values: np.ndarray, name: str) -> np.ndarray:
    return values[:, NAMES.index(name)]


HAND = _frame(
    [
        ("2018-04-01 10:00", 1, 100, 10.0, 1),  # 2018-04-01 is a Sunday
        ("2018-04-01 20:00", 1, 100, 30.0, 0),
        ("2018-04-02 03:00", 2, 100, 40.0, 0),
        ("2018-04-02 09:00", 1, 200, 20.0, 0),
        ("2018-04-08 12:00", 2, 100, 60.0, 0),
        ("2018-04-09 05:00", 1, 100, 50.0, 0),
    ]
)


def test_hand_computed_customer_windows() -> None:
    x = features.compute_features(HAND, np.ones(len(HAND), dtype=bool))
    assert x.dtype == np.float32 and x.shape == (6, len(NAMES))
    # Customer 1: 10 (Apr 1 10:00), 30 (Apr 1 20:00), 20 (Apr 2 09:00, 23 h after the first), 50 (Apr 9).
    nb_1d = np.expm1(_column(x, "customer_log_nb_tx_1d"))
    nb_7d = np.expm1(_column(x, "customer_log_nb_tx_7d"))
    nb_30d = np.expm1(_column(x, "customer_log_nb_tx_30d"))
    avg_1d = np.expm1(_column(x, "customer_log_avg_amount_1d"))
    avg_30d = np.expm1(_column(x, "customer_log_avg_amount_30d"))
    np.testing.assert_allclose(nb_1d, [1, 2, 1, 3, 1, 1], rtol=1e-5)
    np.testing.assert_allclose(avg_1d, [10, 20, 40, 20, 60, 50], rtol=1e-5)
    # Apr 9 05:00: the 7-day window starts Apr 2 05:00, so it holds Apr 2 09:00 but not Apr 1.
    np.testing.assert_allclose(nb_7d, [1, 2, 1, 3, 2, 2], rtol=1e-5)
    np.testing.assert_allclose(np.expm1(_column(x, "customer_log_avg_amount_7d"))[5], 35, rtol=1e-5)
    np.testing.assert_allclose(nb_30d, [1, 2, 1, 3, 2, 4], rtol=1e-5)
    np.testing.assert_allclose(avg_30d, [10, 20, 40, 20, 50, 27.5], rtol=1e-5)
    ratio_30d = _column(x, "amount_to_customer_avg_30d")
    np.testing.assert_allclose(ratio_30d, [1, 1.5, 1, 1, 1.2, 50 / 27.5], rtol=1e-5)
    np.testing.assert_allclose(_column(x, "log_amount"), np.log1p([10, 30, 40, 20, 60, 50]), rtol=1e-6)
    np.testing.assert_array_equal(_column(x, "weekend"), [1, 1, 0, 0, 1, 0])  # Apr 8 is a Sunday
    np.testing.assert_array_equal(_column(x, "night"), [0, 0, 1, 0, 0, 1])


def test_hand_computed_terminal_risk_with_label_delay() -> None:
    out = features.compute(HAND, np.ones(len(HAND), dtype=bool))
    x = out["x"]
    nb = {w: np.expm1(_column(x, f"terminal_log_nb_tx_{w}d_delayed")) for w in (1, 7, 30)}
    risk = {w: _column(x, f"terminal_risk_{w}d_delayed") for w in (1, 7, 30)}
    # Terminal 100: Apr 1 10:00 fraud, Apr 1 20:00 legit, Apr 2 03:00 legit.
    # Nothing is 7 days old before Apr 8: all zero for the first four rows.
    for w in (1, 7, 30):
        np.testing.assert_array_equal(nb[w][:4], 0)
        np.testing.assert_array_equal(risk[w][:4], 0)
    # Apr 8 12:00 reads labels up to Apr 1 12:00: only the 10:00 fraud (whole days would have given
    # it Apr 1 20:00 too, a label six and a half days old).
    np.testing.assert_allclose([nb[1][4], nb[7][4], nb[30][4]], [1, 1, 1], rtol=1e-5)
    np.testing.assert_allclose([risk[1][4], risk[7][4], risk[30][4]], [1, 1, 1], rtol=1e-6)
    # Apr 9 05:00 reads up to Apr 2 05:00; its 1-day window (Apr 1 05:00, Apr 2 05:00] holds all three.
    np.testing.assert_allclose([nb[1][5], nb[7][5], nb[30][5]], [3, 3, 3], rtol=1e-5)
    np.testing.assert_allclose([risk[1][5], risk[7][5], risk[30][5]], [1 / 3, 1 / 3, 1 / 3], rtol=1e-6)
    # Customer 1's Apr 1 fraud is confirmed by Apr 9 05:00 (row 5), not by Apr 2 09:00 (row 3).
    np.testing.assert_array_equal(out["known"], [False, False, False, False, False, True])
    np.testing.assert_array_equal(out["card"], [1, 1, 2, 1, 2, 1])
    np.testing.assert_array_equal(out["day"], np.array(["2018-04-01", "2018-04-01", "2018-04-02", "2018-04-02",
                                                        "2018-04-08", "2018-04-09"], dtype="datetime64[D]"))
    np.testing.assert_array_equal(out["y"], [1, 0, 0, 0, 0, 0])


def _sees_label_of(age: pd.Timedelta) -> bool:
    """Does a transaction's terminal risk move with the label of one transaction ``age`` older, at
    the same terminal? (To the second: the target is at 12:00:00, the probe at 12:00:00 - age.)"""
    target_time = pd.Timestamp("2018-04-20 12:00:00")
    probe_time = target_time - age
    rows = [(str(probe_time), 7, 300, 20.0, 0), ("2018-04-20 12:00:00", 8, 300, 20.0, 0),
            ("2018-04-01 00:00:00", 9, 301, 20.0, 0)]
    frame = _frame(rows)
    target = (frame[schema.TX_DATETIME] == target_time).to_numpy()
    flipped = frame.copy()
    flipped.loc[flipped[schema.TX_DATETIME] == probe_time, schema.TX_FRAUD] = 1
    return not np.array_equal(features.compute_features(frame, target), features.compute_features(flipped, target))


DELAY = pd.Timedelta(seconds=features.LABEL_DELAY_SECONDS)


def test_the_label_delay_is_exact_to_the_second() -> None:
    assert _sees_label_of(DELAY)  # exactly the delay old: confirmed, readable
    assert _sees_label_of(DELAY + pd.Timedelta(days=3))
    assert not _sees_label_of(DELAY - pd.Timedelta(seconds=1))  # one second too fresh
    assert not _sees_label_of(DELAY - pd.Timedelta(hours=10))  # same calendar day as the delay's end


def test_the_leak_check_catches_a_feature_one_second_too_fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(features, "LABEL_DELAY_SECONDS", features.LABEL_DELAY_SECONDS - 1)
    assert _sees_label_of(DELAY - pd.Timedelta(seconds=1))


def test_target_mask_selects_rows_in_order_and_labels_match() -> None:
    everything = features.compute_features(HAND, np.ones(len(HAND), dtype=bool))
    mask = np.array([False, True, False, False, True, True])
    np.testing.assert_array_equal(features.compute_features(HAND, mask), everything[mask])
    np.testing.assert_array_equal(features.labels(HAND, mask), np.array([0, 0, 0], dtype=np.float32))
    assert features.labels(HAND, mask).dtype == np.float32
    assert features.compute_features(HAND, np.zeros(len(HAND), dtype=bool)).shape == (0, len(NAMES))


@pytest.fixture(scope="module")
def dataset() -> tuple[pd.DataFrame, np.ndarray]:
    """A dense dataset (few terminals, much fraud) and the mask of its 7 test days."""
    spec = simulator.SimulationSpec(
        customers=600, terminals=150, train_days=30, test_days=7, start_date="2018-04-01", seed=3
    )
    frame = simulator.simulate(spec).transactions
    test_days = frame[schema.TX_TIME_DAYS].to_numpy() >= spec.train_days
    return frame, test_days


def _features_change_when_test_labels_change(frame: pd.DataFrame, test: np.ndarray) -> bool:
    """Do the test rows' features move when the test days' labels are permuted, or flipped?"""
    before = features.compute_features(frame, test)
    rng = np.random.default_rng(0)
    for relabel in (rng.permutation, lambda labels: 1 - labels):
        changed = frame.copy()
        for column in schema.LABELS:
            values = changed[column].to_numpy().copy()
            values[test] = relabel(values[test])
            changed[column] = values
        if not np.array_equal(before, features.compute_features(changed, test)):
            return True
    return False


def test_test_day_features_ignore_test_day_labels(dataset: tuple[pd.DataFrame, np.ndarray]) -> None:
    frame, test = dataset
    assert not _features_change_when_test_labels_change(frame, test)


def test_the_leak_check_catches_a_feature_reading_same_day_labels(
    dataset: tuple[pd.DataFrame, np.ndarray], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(features, "LABEL_DELAY_SECONDS", 0)
    frame, test = dataset
    assert _features_change_when_test_labels_change(frame, test)


def test_no_day_reads_labels_younger_than_the_delay(dataset: tuple[pd.DataFrame, np.ndarray]) -> None:
    frame, _ = dataset
    days = frame[schema.TX_TIME_DAYS].to_numpy()
    for day in (8, 20, 36):
        target = days == day
        before = features.compute_features(frame, target)
        flipped = frame.copy()
        recent = days > day - features.LABEL_DELAY_DAYS
        flipped.loc[recent, schema.TX_FRAUD] = 1 - flipped.loc[recent, schema.TX_FRAUD]
        np.testing.assert_array_equal(before, features.compute_features(flipped, target))
        # Older labels do matter (the delayed terminal risk uses them): the check is not vacuous.
        old = days == day - features.LABEL_DELAY_DAYS
        flipped.loc[old, schema.TX_FRAUD] = 1 - flipped.loc[old, schema.TX_FRAUD]
        assert not np.array_equal(before, features.compute_features(flipped, target))


def test_lookback_days_of_history_give_the_same_features_as_all_history(
    dataset: tuple[pd.DataFrame, np.ndarray],
) -> None:
    frame, test = dataset
    days = frame[schema.TX_TIME_DAYS].to_numpy()
    day = 36
    window = frame[(days >= day - features.LOOKBACK_DAYS) & (days <= day)].reset_index(drop=True)
    np.testing.assert_array_equal(
        features.compute_features(frame, days == day),
        features.compute_features(window, window[schema.TX_TIME_DAYS].to_numpy() == day),
    )


def test_ids_and_scenario_are_not_features(dataset: tuple[pd.DataFrame, np.ndarray]) -> None:
    frame, test = dataset
    before = features.compute_features(frame, test)
    renamed = frame.copy()
    rng = np.random.default_rng(1)
    renamed[schema.CUSTOMER_ID] = rng.permutation(10**6)[renamed[schema.CUSTOMER_ID]]
    renamed[schema.TERMINAL_ID] = renamed[schema.TERMINAL_ID] * 7919 + 13
    renamed[schema.TRANSACTION_ID] = renamed[schema.TRANSACTION_ID] + 10**9
    renamed[schema.TX_TIME_SECONDS] = 0
    renamed[schema.TX_TIME_DAYS] = 0
    renamed[schema.TX_FRAUD_SCENARIO] = 9
    np.testing.assert_array_equal(before, features.compute_features(renamed, test))
    assert np.isfinite(before).all()
    assert not {"TX_FRAUD", "TX_FRAUD_SCENARIO"} & {n.upper() for n in NAMES}


def test_unsorted_frames_are_refused() -> None:
    with pytest.raises(ValueError, match="TX_DATETIME must be sorted"):
        features.compute_features(HAND.iloc[::-1].reset_index(drop=True), np.ones(len(HAND), dtype=bool))




def test_features_stay_finite_for_any_finite_amount() -> None:
    rows = [("2018-04-01 10:00", 1, 100, 1e308, 0), ("2018-04-01 11:00", 1, 100, 1e308, 1),
            ("2018-04-01 12:00", 1, 100, 0.0, 0), ("2018-04-09 12:00", 1, 100, 5.0, 0)]
    x = features.compute_features(_frame(rows), np.ones(4, dtype=bool))
    assert np.isfinite(x).all()


def test_what_compute_returns_for_some_rows_and_for_none() -> None:
    """The documented arrays, named and typed as the feature store keeps them, also when no row is targeted;
    IDs typed as floats (as files give them) come back as integers."""
    typed = HAND.astype({schema.CUSTOMER_ID: np.float64, schema.TRANSACTION_ID: np.float64})
    mask = np.array([0, 1, 0, 0, 1, 1])  # a 0/1 mask selects like a boolean one
    for target, n in ((mask, 3), (np.zeros(len(HAND), dtype=bool), 0)):
        out = features.compute(typed, target)
        assert set(out) == {"x", "y", "day", "card", "known", "ids"}
        assert out["x"].shape == (n, len(NAMES)) and out["x"].dtype == np.float32
        assert out["y"].dtype == np.float32 and out["known"].dtype == np.bool_ and out["known"].shape == (n,)
        assert out["card"].dtype == np.int64 and out["ids"].dtype == np.int64
        np.testing.assert_array_equal(out["y"], features.labels(typed, target))
    np.testing.assert_array_equal(out["ids"], [])
    np.testing.assert_array_equal(features.compute(typed, mask)["ids"], [1, 4, 5])
    np.testing.assert_array_equal(features.labels(HAND, np.array([1, 0, 0, 0, 0, 0])), [1.0])


def test_a_mask_of_the_wrong_length_is_refused_with_both_lengths() -> None:
    with pytest.raises(ValueError, match=r"^target mask has 5 entries, frame has 6 rows$"):
        features.compute(HAND, np.ones(5, dtype=bool))
