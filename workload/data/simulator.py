"""Transaction simulator of the Fraud Detection Handbook (Le Borgne et al., chapter 3).

The GKE tutorial's datasets came from this simulator; we regenerate data of the same design so the
model has real fraud to find: customers spend near home (terminals within ``radius``), and three
fraud scenarios leave learnable traces:

1. any transaction above 220 is fraud (learnable from the amount alone);
2. each day 2 random terminals are compromised: all their transactions of that day and the next 27
   are fraud (learnable from the terminal's recent, label-delayed fraud rate);
3. each day 3 random customers are compromised: over that day and the next 13, a third of their
   transactions get their amount multiplied by 5 and are fraud (learnable from the customer's
   usual spending).

Later scenarios override earlier ones, as in the handbook. Everything is vectorised and drawn from
one ``numpy.random.default_rng(seed)``: a seed gives identical files, whatever else runs.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from workload.data import schema
from workload.share.fsutil import atomic_write_bytes

SECONDS_PER_DAY = 86400
FRAUD_AMOUNT_THRESHOLD = 220.0
COMPROMISED_TERMINALS_PER_DAY = 2
TERMINAL_COMPROMISE_DAYS = 28
COMPROMISED_CUSTOMERS_PER_DAY = 3
CUSTOMER_COMPROMISE_DAYS = 14
CUSTOMER_FRAUD_SHARE = 1 / 3
CUSTOMER_FRAUD_AMOUNT_FACTOR = 5.0


@dataclass(frozen=True)
class SimulationSpec:
    """Sizes and seed of one simulated dataset; the test days follow the training days."""

    customers: int
    terminals: int
    train_days: int
    test_days: int
    start_date: str
    seed: int
    radius: float = 5.0

    def __post_init__(self) -> None:
        minimum = {
            "customers": COMPROMISED_CUSTOMERS_PER_DAY,  # scenario 3 draws 3 distinct customers a day
            "terminals": COMPROMISED_TERMINALS_PER_DAY,  # scenario 2 draws 2 distinct terminals a day
            "train_days": 1,
            "test_days": 0,
        }
        for name, least in minimum.items():
            if getattr(self, name) < least:
                raise ValueError(f"simulation {name} must be at least {least}, got {getattr(self, name)}")
        if not self.radius > 0:
            raise ValueError(f"simulation radius must be positive, got {self.radius}")
        try:
            np.datetime64(self.start_date, "D")
        except ValueError as error:
            raise ValueError(
                f"simulation start_date must be an ISO date like 2018-04-01, got {self.start_date!r}"
            ) from error

    @property
    def days(self) -> int:
        return self.train_days + self.test_days


PRESETS: dict[str, SimulationSpec] = {
    # `make local` and the tests: ~4.8k transactions a day, under a second to simulate. 2000
    # terminals make the compromised ones (2 a day, for 28 days) a visible share (~3% fraud on the
    # test days), so the label-delayed terminal risk has signal within three weeks of training.
    "small": SimulationSpec(
        customers=2500, terminals=2000, train_days=21, test_days=7, start_date="2018-04-01", seed=1
    ),
    # The handbook's own dataset size (5000 customers, 10000 terminals, 183 days, from 2018-04-01):
    # ~10k transactions a day; the last 7 days are held out for testing.
    "cluster": SimulationSpec(
        customers=5000, terminals=10000, train_days=176, test_days=7, start_date="2018-04-01", seed=0
    ),
}


@dataclass(frozen=True)
class Simulation:
    """Everything the simulator drew: the transactions and the hidden state that explains the fraud."""

    transactions: pd.DataFrame
    customer_xy: np.ndarray  # [customers, 2]
    customer_mean_amount: np.ndarray  # [customers]
    customer_mean_nb_tx_per_day: np.ndarray  # [customers]
    terminal_xy: np.ndarray  # [terminals, 2]
    compromised_terminals: np.ndarray  # [days, 2]: terminals compromised on each day
    compromised_customers: np.ndarray  # [days, 3]: customers compromised on each day


def _available_terminals(
    customer_xy: np.ndarray, terminal_xy: np.ndarray, radius: float
) -> tuple[np.ndarray, np.ndarray]:
    """Terminals within ``radius`` of each customer, as CSR (offsets, terminal ids); chunked for memory."""
    chunks: list[np.ndarray] = []
    counts = np.zeros(len(customer_xy), dtype=np.int64)
    step = max(1, 2_000_000 // max(1, len(terminal_xy)))
    for lo in range(0, len(customer_xy), step):
        diff = customer_xy[lo : lo + step, None, :] - terminal_xy[None, :, :]
        near = np.sqrt((diff**2).sum(axis=2)) < radius
        cols = np.nonzero(near)[1]  # row-major: terminals grouped by customer, ascending
        counts[lo : lo + step] = near.sum(axis=1)
        chunks.append(cols.astype(np.int64))
    offsets = np.concatenate([[0], np.cumsum(counts)])
    ids = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
    return offsets, ids


def simulate(spec: SimulationSpec) -> Simulation:
    """Draw profiles, transactions and fraud for ``spec`` (in memory; ``generate`` writes files).
    The steps draw from one generator in this order: reordering them changes every dataset."""
    rng = np.random.default_rng(spec.seed)
    # Profiles (handbook 3.2, 3.3).
    customer_xy = rng.uniform(0, 100, size=(spec.customers, 2))
    mean_amount = rng.uniform(5, 100, size=spec.customers)
    mean_nb_tx = rng.uniform(0, 4, size=spec.customers)
    terminal_xy = rng.uniform(0, 100, size=(spec.terminals, 2))
    customer, day, seconds, amount, terminal = _transactions(rng, spec, customer_xy, mean_amount, mean_nb_tx,
                                                             terminal_xy)
    fraud = np.zeros(len(customer), dtype=np.int64)
    scenario = np.zeros(len(customer), dtype=np.int64)

    # Scenario 1: large amounts.
    large = amount > FRAUD_AMOUNT_THRESHOLD
    fraud[large], scenario[large] = 1, 1
    compromised_terminals = _compromise_terminals(rng, spec, day, terminal, fraud, scenario)
    compromised_customers = _compromise_customers(rng, spec, customer, day, amount, fraud, scenario)

    start = np.datetime64(spec.start_date, "s")
    transactions = pd.DataFrame(
        {
            schema.TRANSACTION_ID: np.arange(len(customer), dtype=np.int64),
            schema.TX_DATETIME: (start + seconds.astype("timedelta64[s]")).astype("datetime64[ns]"),
            schema.CUSTOMER_ID: customer.astype(np.int64),
            schema.TERMINAL_ID: terminal.astype(np.int64),
            schema.TX_AMOUNT: amount.astype(np.float64),
            schema.TX_TIME_SECONDS: seconds.astype(np.int64),
            schema.TX_TIME_DAYS: day.astype(np.int64),
            schema.TX_FRAUD: fraud,
            schema.TX_FRAUD_SCENARIO: scenario,
        },
        columns=list(schema.SIMULATED),
    )
    return Simulation(
        transactions=transactions,
        customer_xy=customer_xy,
        customer_mean_amount=mean_amount,
        customer_mean_nb_tx_per_day=mean_nb_tx,
        terminal_xy=terminal_xy,
        compromised_terminals=compromised_terminals,
        compromised_customers=compromised_customers,
    )


def _transactions(rng: np.random.Generator, spec: SimulationSpec, customer_xy: np.ndarray, mean_amount: np.ndarray,
                  mean_nb_tx: np.ndarray, terminal_xy: np.ndarray) -> tuple[np.ndarray, ...]:
    """(customer, day, seconds, amount, terminal) of every transaction, in TRANSACTION_ID order.

    Handbook 3.5: Poisson count per customer and day, time around noon (draws outside the day are
    dropped, as the handbook does), normal amount (negatives redrawn uniformly in [0, 2*mean], cents,
    at least 0.01), a uniformly chosen terminal in reach (customers with none in reach make no
    transactions)."""
    n_days = spec.days
    std_amount = mean_amount / 2
    offsets, terminal_ids = _available_terminals(customer_xy, terminal_xy, spec.radius)
    n_available = np.diff(offsets)
    per_day = rng.poisson(np.broadcast_to(mean_nb_tx[:, None], (spec.customers, n_days)))
    customer = np.repeat(np.repeat(np.arange(spec.customers), n_days), per_day.ravel())
    day = np.repeat(np.tile(np.arange(n_days), spec.customers), per_day.ravel())
    time_of_day = rng.normal(SECONDS_PER_DAY / 2, 20000, size=len(customer)).astype(np.int64)
    amount = rng.normal(mean_amount[customer], std_amount[customer])
    redraw = rng.uniform(0, 2 * mean_amount[customer])
    amount = np.maximum(np.round(np.where(amount < 0, redraw, amount), 2), 0.01)  # no 0.00 after rounding
    pick = rng.random(len(customer))
    keep = (time_of_day > 0) & (time_of_day < SECONDS_PER_DAY) & (n_available[customer] > 0)
    customer, day, time_of_day, amount, pick = (a[keep] for a in (customer, day, time_of_day, amount, pick))
    terminal = terminal_ids[offsets[customer] + (pick * n_available[customer]).astype(np.int64)]
    seconds = day * SECONDS_PER_DAY + time_of_day
    # Chronological order defines TRANSACTION_ID; ties broken by customer for determinism.
    order = np.lexsort((customer, seconds))
    return tuple(a[order] for a in (customer, day, seconds, amount, terminal))


def _compromise_terminals(rng: np.random.Generator, spec: SimulationSpec, day: np.ndarray, terminal: np.ndarray,
                          fraud: np.ndarray, scenario: np.ndarray) -> np.ndarray:
    """Scenario 2: a terminal compromised on day d makes fraud of its transactions on days d..d+27.
    Marks `fraud` and `scenario` in place; returns the terminals compromised each day."""
    n_days = spec.days
    compromised_terminals = np.stack(
        [rng.choice(spec.terminals, COMPROMISED_TERMINALS_PER_DAY, replace=False) for _ in range(n_days)]
    ).reshape(n_days, COMPROMISED_TERMINALS_PER_DAY)
    hit = np.zeros((spec.terminals, n_days + 1), dtype=np.int64)
    compromise_day = np.repeat(np.arange(n_days), COMPROMISED_TERMINALS_PER_DAY)
    np.add.at(hit, (compromised_terminals.ravel(), compromise_day + 1), 1)
    hits_so_far = np.cumsum(hit, axis=1)  # [:, d + 1] = compromises on days <= d
    since = np.maximum(day + 1 - TERMINAL_COMPROMISE_DAYS, 0)
    on_compromised = hits_so_far[terminal, day + 1] - hits_so_far[terminal, since] > 0
    fraud[on_compromised], scenario[on_compromised] = 1, 2
    return compromised_terminals


def _compromise_customers(rng: np.random.Generator, spec: SimulationSpec, customer: np.ndarray, day: np.ndarray,
                          amount: np.ndarray, fraud: np.ndarray, scenario: np.ndarray) -> np.ndarray:
    """Scenario 3: a customer compromised on day d has a third of its transactions on days d..d+13
    multiplied by 5 (applied day after day, as in the handbook). Changes `amount`, `fraud` and
    `scenario` in place; returns the customers compromised each day."""
    n_days = spec.days
    compromised_customers = np.stack(
        [rng.choice(spec.customers, COMPROMISED_CUSTOMERS_PER_DAY, replace=False) for _ in range(n_days)]
    ).reshape(n_days, COMPROMISED_CUSTOMERS_PER_DAY)
    by_customer = np.argsort(customer, kind="stable")
    starts = np.searchsorted(customer[by_customer], np.arange(spec.customers + 1))
    for d in range(n_days):
        rows = np.concatenate([by_customer[starts[c] : starts[c + 1]] for c in compromised_customers[d]])
        rows = rows[(day[rows] >= d) & (day[rows] < d + CUSTOMER_COMPROMISE_DAYS)]
        chosen = rng.choice(rows, int(len(rows) * CUSTOMER_FRAUD_SHARE), replace=False)
        amount[chosen] = amount[chosen] * CUSTOMER_FRAUD_AMOUNT_FACTOR
        fraud[chosen], scenario[chosen] = 1, 3
    return compromised_customers


def _write_parquet_atomically(frame: pd.DataFrame, path: Path) -> None:
    """Readers on the share never see a half-written day."""
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    atomic_write_bytes(path, buf.getvalue())


def generate(
    out_dir: Path, spec: SimulationSpec, progress: Callable[[int, int], None] | None = None
) -> list[Path]:
    """Write ``training/`` and ``testing/`` day files (``YYYY-MM-DD.parquet``) for ``spec``; return them.

    ``progress(done, total)`` is called after each file, so the caller can report without us printing.
    """
    out_dir = Path(out_dir)
    transactions = simulate(spec).transactions
    day_index = transactions[schema.TX_TIME_DAYS].to_numpy()
    bounds = np.searchsorted(day_index, np.arange(spec.days + 1))  # rows are in chronological order
    first = np.datetime64(spec.start_date, "D")
    paths: list[Path] = []
    for d in range(spec.days):
        folder = out_dir / ("training" if d < spec.train_days else "testing")
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{first + d}.parquet"
        _write_parquet_atomically(transactions.iloc[bounds[d] : bounds[d + 1]].reset_index(drop=True), path)
        paths.append(path)
        if progress is not None:
            progress(d + 1, spec.days)
    return paths
