"""Leak-free transaction features: one definition for training and test days.

Following the handbook (chapter 3.4), a transaction is described by its amount and time of day, by
its customer's recent spending, and by its terminal's recent fraud rate. A transaction at time t
reads only labels of transactions at or before t - ``LABEL_DELAY_SECONDS``, to the second: fraud is
confirmed late in real life, and a feature that reads fresher labels scores well offline and fails
in production.
Never used: a row's own label, ``TX_FRAUD_SCENARIO`` at all, raw IDs or timestamps as numbers (IDs
only group rows into windows, timestamps only place them in windows, weekends and nights).

All windows are computed with sorted composite keys and cumulative sums (numpy ``searchsorted``), so
a frame of ~40 days x ~10k rows takes a fraction of a second. Features are a property of the
dataset, not of a run: ``workload.data.featurestore`` computes each day's once and keeps them on the share
under ``FEATURE_VERSION``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from workload.data import schema

WINDOWS_DAYS = (1, 7, 30)
LABEL_DELAY_DAYS = 7
SECONDS_PER_DAY = 86400
LABEL_DELAY_SECONDS = LABEL_DELAY_DAYS * SECONDS_PER_DAY
LOOKBACK_DAYS = max(WINDOWS_DAYS) + LABEL_DELAY_DAYS  # days of history a day's features read
KNOWN_COMPROMISED_DAYS = max(WINDOWS_DAYS)  # a card with a fraud confirmed this recently is "known"
NIGHT_END_HOUR = 6
# Amounts enter window sums capped: two amounts of 1e308 would overflow a cumulative sum to infinity
# and every window mean after them to NaN. No card payment comes near; the cap keeps every feature finite
# (and float32-representable) for any finite input, and leaves real amounts unchanged.
AMOUNT_CAP = 1e12

FEATURE_NAMES: tuple[str, ...] = (
    "log_amount",
    "weekend",
    "night",
    *(f"customer_log_nb_tx_{w}d" for w in WINDOWS_DAYS),
    *(f"customer_log_avg_amount_{w}d" for w in WINDOWS_DAYS),
    *(f"amount_to_customer_avg_{w}d" for w in WINDOWS_DAYS),
    *(f"terminal_log_nb_tx_{w}d_delayed" for w in WINDOWS_DAYS),
    *(f"terminal_risk_{w}d_delayed" for w in WINDOWS_DAYS),
)
# Change it with any change to what a feature means (a window, the delay, a transform): stored
# features of another version are never read, so nothing computed by old code is silently reused.
FEATURE_VERSION = "2-delay-to-the-second"


def _search(keys: np.ndarray, queries: np.ndarray, by: np.ndarray) -> np.ndarray:
    """``searchsorted(keys, queries, side="right")``, searched in the order ``by`` (ascending queries).

    The same answer, but binary searches in key order stay in cache: on a million rows, searching in
    row order missed it at every step and took most of the features' time.
    """
    out = np.empty(len(queries), dtype=np.int64)
    out[by] = np.searchsorted(keys, queries[by], side="right")
    return out


def _keyed(group: np.ndarray, seconds: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keys ``group * span + seconds`` sorted by (group, row order), so that a window is a key range.

    Returns (each row's key, the sorted keys, each row's position in that order). Seconds are shifted
    so that a window reaching ``LOOKBACK_DAYS`` before the frame's first second stays in its group's
    block of keys.
    """
    shift = LOOKBACK_DAYS * SECONDS_PER_DAY
    span = int(seconds.max()) + shift + 1
    order = np.lexsort((np.arange(len(group)), group))  # by group, then row (chronological) order
    key = group * span + (seconds + shift)
    position = np.empty(len(group), dtype=np.int64)
    position[order] = np.arange(len(group))
    return key, key[order], position


def _customer_windows(
    customer: np.ndarray, seconds: np.ndarray, amount: np.ndarray, rows: np.ndarray
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """For ``rows``: the customer's count and mean amount over the last w days, up to and including it.

    Rows are in chronological order; among the customer's rows at the same second, only those up
    to the row itself count (what a streaming system would have seen, and what pandas' time-based
    ``rolling`` gives).
    """
    key, keys, position = _keyed(customer, seconds)
    order = np.argsort(position)
    csum = np.concatenate([[0.0], np.cumsum(amount[order], dtype=np.float64)])
    end = position[rows] + 1
    by_key = np.argsort(end)  # rows in key order: each window's queries ascend
    counts, means = [], []
    for w in WINDOWS_DAYS:
        start = _search(keys, key[rows] - w * SECONDS_PER_DAY, by_key)
        count = (end - start).astype(np.float64)
        counts.append(count)
        means.append((csum[end] - csum[start]) / count)
    return counts, means


def _delayed_windows(
    group: np.ndarray, seconds: np.ndarray, fraud: np.ndarray, rows: np.ndarray, windows: tuple[int, ...]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """For ``rows`` at time t: the group's transaction and fraud counts over (t-delay-w days, t-delay].

    Exact to the second: a label is readable once ``LABEL_DELAY_SECONDS`` have passed since its
    transaction, never a second sooner (windows of whole days let a late transaction of day D read
    all of day D-7, labels only six days and some hours old). ``LABEL_DELAY_SECONDS`` is read at
    call time, so a test can make it one second short and see the leak check fail.
    """
    delay = int(LABEL_DELAY_SECONDS)
    key, keys, position = _keyed(group, seconds)
    csum = np.concatenate([[0.0], np.cumsum(fraud[np.argsort(position)], dtype=np.float64)])
    block_start = key[rows] - (seconds[rows] + LOOKBACK_DAYS * SECONDS_PER_DAY) - 1  # just below the block
    by_key = np.argsort(position[rows], kind="stable")  # rows in key order: the queries ascend
    end = _search(keys, np.maximum(key[rows] - delay, block_start), by_key)
    counts, frauds = [], []
    for w in windows:
        start = _search(keys, np.maximum(key[rows] - delay - w * SECONDS_PER_DAY, block_start), by_key)
        start = np.minimum(start, end)
        counts.append((end - start).astype(np.float64))
        frauds.append(csum[end] - csum[start])
    return counts, frauds


def compute(frame: pd.DataFrame, target: np.ndarray) -> dict[str, np.ndarray]:
    """Everything a day contributes to training and evaluation, for the ``target`` rows of ``frame``.

    ``x``: the features (float32, ``[n, len(FEATURE_NAMES)]``); ``y``: ``TX_FRAUD`` (float32);
    ``day``: each row's day (datetime64[D]); ``card``: ``CUSTOMER_ID`` (card precision groups by
    it); ``known``: whether the card had a fraud confirmed by t - delay (within the last
    ``KNOWN_COMPROMISED_DAYS``): the handbook's evaluation removes those rows from its test set;
    ``ids``: ``TRANSACTION_ID`` (what ``score`` writes next to each score).

    ``frame`` holds validated transactions sorted by ``TX_DATETIME`` then ``TRANSACTION_ID``, covering
    the target rows and up to ``LOOKBACK_DAYS`` days before them; windows simply see less history
    where the frame has less.
    """
    target = np.asarray(target, dtype=bool)
    if len(target) != len(frame):
        raise ValueError(f"target mask has {len(target)} entries, frame has {len(frame)} rows")
    rows = np.nonzero(target)[0]
    when = pd.DatetimeIndex(frame[schema.TX_DATETIME])
    if when.tz is not None:  # validated frames are naive UTC; any other caller's zone-aware times become so
        when = when.tz_convert(None)
    out = {
        "y": frame[schema.TX_FRAUD].to_numpy()[rows].astype(np.float32),
        "day": when[rows].to_numpy().astype("datetime64[D]"),
        "card": frame[schema.CUSTOMER_ID].to_numpy()[rows].astype(np.int64),
        "ids": frame[schema.TRANSACTION_ID].to_numpy()[rows].astype(np.int64),
    }
    if len(rows) == 0:
        return {"x": np.zeros((0, len(FEATURE_NAMES)), dtype=np.float32), **out, "known": np.zeros(0, dtype=bool)}
    if not when.is_monotonic_increasing:
        raise ValueError(f"{schema.TX_DATETIME} must be sorted ascending: windows are computed in row order")

    origin = when.min().normalize()
    seconds = ((when - origin) // pd.Timedelta(seconds=1)).to_numpy(dtype=np.int64)
    # Capped before any sum: a finite 1e308 must not overflow a window's total (or a ratio) to inf.
    amount = np.minimum(frame[schema.TX_AMOUNT].to_numpy(dtype=np.float64), AMOUNT_CAP)
    customer = pd.factorize(frame[schema.CUSTOMER_ID])[0].astype(np.int64)
    terminal = pd.factorize(frame[schema.TERMINAL_ID])[0].astype(np.int64)
    fraud = frame[schema.TX_FRAUD].to_numpy(dtype=np.float64)

    cust_counts, cust_means = _customer_windows(customer, seconds, amount, rows)
    term_counts, term_frauds = _delayed_windows(terminal, seconds, fraud, rows, WINDOWS_DAYS)
    term_risks = [np.divide(f, c, out=np.zeros_like(f), where=c > 0)
                  for f, c in zip(term_frauds, term_counts, strict=True)]
    _, card_frauds = _delayed_windows(customer, seconds, fraud, rows, (KNOWN_COMPROMISED_DAYS,))
    own_amount = amount[rows]
    columns = [
        np.log1p(own_amount),
        np.asarray(when[rows].day_of_week >= 5, dtype=np.float64),
        np.asarray(when[rows].hour < NIGHT_END_HOUR, dtype=np.float64),
        *(np.log1p(c) for c in cust_counts),
        *(np.log1p(m) for m in cust_means),
        *(own_amount / np.maximum(m, 1e-6) for m in cust_means),
        *(np.log1p(c) for c in term_counts),
        *term_risks,
    ]
    return {"x": np.stack(columns, axis=1).astype(np.float32), **out, "known": card_frauds[0] > 0}


def compute_features(frame: pd.DataFrame, target: np.ndarray) -> np.ndarray:
    """The features of the ``target`` rows of ``frame`` (see ``compute``)."""
    return compute(frame, target)["x"]


def labels(frame: pd.DataFrame, target: np.ndarray) -> np.ndarray:
    """``TX_FRAUD`` of the ``target`` rows, as float32 training targets."""
    return frame[schema.TX_FRAUD].to_numpy()[np.asarray(target, dtype=bool)].astype(np.float32)
