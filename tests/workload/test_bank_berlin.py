"""Issue 35's acceptance: a bank's export as banks write it (text IDs with leading zeros, 20-hex-digit card
hashes, `;` and decimal commas, local times in Europe/Berlin with a separate offset column, extra columns,
an unlabelled day) trains to the weights of the same data in the product's own form, scores come back with
the bank's own IDs bit for bit, ranked per calendar day in Berlin, and a mis-declared dialect, zone or date
format is refused in one line. Small data: the tiny simulated dataset, one worker."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from harness import Cluster, same_weights
from test_bank_exports import seed

from workload import cli
from workload.data import publish, schema
from workload.data.dayfile import DatasetError
from workload.data.manifest import MANIFEST
from workload.data.reading import reading
from workload.data.source import LocalSource

COLUMNS = {"txn_ref": schema.TRANSACTION_ID, "booked_at": schema.TX_DATETIME, "card_hash": schema.CUSTOMER_ID,
           "terminal": schema.TERMINAL_ID, "amount_eur": schema.TX_AMOUNT, "is_fraud": schema.TX_FRAUD}
MAPPING = {"columns": COLUMNS, "timezone": "Europe/Berlin", "offset_column": "utc_offset",
           "datetime_format": "%d.%m.%Y %H:%M:%S", "csv": {"separator": ";", "decimal": ","}}


def card_hash(card: int) -> str:
    return hashlib.sha256(f"card-{card}".encode()).hexdigest()[:20].upper()


def berlin_day(frame: pd.DataFrame, labelled: bool = True) -> pd.DataFrame:
    """One day as the bank exports it. The simulator's naive times are taken as Berlin wall-clock times, so
    the product's own form of the same data is the simulator's file itself."""
    local = frame[schema.TX_DATETIME].dt.tz_localize("Europe/Berlin", ambiguous=True, nonexistent="shift_forward")
    out = pd.DataFrame({
        "mcc": 5411, "txn_ref": [f"NB{i:012d}" for i in frame[schema.TRANSACTION_ID]],
        "booked_at": frame[schema.TX_DATETIME].dt.strftime("%d.%m.%Y %H:%M:%S"),
        "utc_offset": local.map(lambda t: t.strftime("%z")[:3] + ":" + t.strftime("%z")[3:]),
        "card_hash": [card_hash(c) for c in frame[schema.CUSTOMER_ID]],
        "terminal": [f"POS-{t:06d}" for t in frame[schema.TERMINAL_ID]],
        "amount_eur": [repr(float(a)).replace(".", ",") for a in frame[schema.TX_AMOUNT]],
        "country": "DE", "channel": "pos"})
    if labelled:
        out["is_fraud"] = frame[schema.TX_FRAUD].to_numpy()
    return out.iloc[::-1]  # rows in any order


def berlin_export(src: Path, dest: Path, scoring: tuple[str, ...] = ()) -> Path:
    for path in sorted(src.glob("*/*.parquet")):
        role = "scoring" if path.stem in scoring else path.parent.name
        (dest / role).mkdir(parents=True, exist_ok=True)
        berlin_day(pd.read_parquet(path), labelled=role != "scoring").to_csv(
            dest / role / f"{path.stem}.csv", sep=";", index=False)
    return dest


def write(path: Path, mapping: dict) -> Path:
    path.write_text(json.dumps(mapping))
    return path


def test_a_berlin_export_trains_to_the_weights_of_the_products_own_form(cluster: Cluster, tmp_path: Path,
                                                                        reference_state: dict) -> None:
    export = berlin_export(cluster.dataset_src, tmp_path / "export")
    out = seed(cluster, "--datasets", str(export), "--columns", str(write(tmp_path / "bank.json", MAPPING)))
    assert out.returncode == 0, out.stderr
    recorded = json.loads((cluster.share / "datasets" / "fraud" / MANIFEST).read_text())["reading"]
    assert recorded["timezone"] == "Europe/Berlin" and recorded["csv"] == {"separator": ";", "decimal": ","}
    cluster.start_worker("w")
    assert cluster.wait_all() == [0], cluster.log("w")
    assert same_weights(cluster.final_state(), reference_state), "the bank's export trains as the product's form"
    # Tomorrow, unlabelled: scored with the bank's own IDs, ranked per Berlin calendar day.
    tomorrow = berlin_export(cluster.dataset_src, tmp_path / "tomorrow", scoring=("2018-04-08",))
    scores = tmp_path / "scores.csv"
    code = cli.main(["score", "--model", str(cluster.share / "output" / "main"), "--datasets", str(tomorrow),
                     "--columns", str(tmp_path / "bank.json"), "--out", str(scores)])
    assert code == 0
    got = pd.read_csv(scores, sep=";", decimal=",", dtype={"txn_ref": str, "card_hash": str})
    assert list(got.columns)[:5] == ["txn_ref", "card_hash", "booked_at", "score", "rank"]
    given = pd.read_csv(tomorrow / "scoring" / "2018-04-08.csv", sep=";", dtype=str)
    assert sorted(got["txn_ref"]) == sorted(given["txn_ref"]) and got["txn_ref"].str.startswith("NB0").all()
    pairs = dict(zip(given["txn_ref"], given["card_hash"], strict=True))
    assert [pairs[t] for t in got["txn_ref"]] == list(got["card_hash"])  # each row's own card, as given
    stamps = pd.to_datetime(got["booked_at"]).map(lambda t: t.tz_convert("Europe/Berlin"))
    assert {t.date().isoformat() for t in stamps} == {"2018-04-08"}  # local days: 00:00-01:59 is not 04-07
    assert sorted(got["rank"]) == list(range(1, len(got) + 1))  # one Berlin day: one ranking
    assert (got.sort_values("rank")["score"].diff().dropna() <= 0).all()


def _refusal(tmp_path: Path, dataset_src: Path, mapping: dict) -> str:
    export = tmp_path / "export"
    if not export.exists():
        berlin_export(dataset_src, export)
    declared = reading(str(write(tmp_path / "m.json", mapping)), None)
    with pytest.raises(DatasetError) as err:
        publish.publish(tmp_path / f"ds-{len(list(tmp_path.iterdir()))}", LocalSource(export), declared)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_mis_declared_dialect_zone_or_format_is_refused_in_one_line(tmp_path: Path, dataset_src: Path) -> None:
    first = str(tmp_path / "export" / "history")
    no_dialect = {k: v for k, v in MAPPING.items() if k != "csv"}
    assert "(it looks separated by ';': declare csv: {separator: ';'} in the mapping file)" in _refusal(
        tmp_path, dataset_src, no_dialect)
    point = {**MAPPING, "csv": {"separator": ";"}}
    assert "must hold numbers: line 2 has '" in (m := _refusal(tmp_path, dataset_src, point)) and \
        "a decimal comma? declare csv: {decimal: ','} in the mapping file" in m
    london = _refusal(tmp_path, dataset_src, {**MAPPING, "timezone": "Europe/London"})
    assert "the declared timezone does not match the offsets in utc_offset" in london
    month_first = _refusal(tmp_path, dataset_src, {**MAPPING, "datetime_format": "%m.%d.%Y %H:%M:%S"})
    assert "rows is dated on that day" in month_first and "day and month swapped?" in month_first
    zoneless = {k: v for k, v in MAPPING.items() if k not in ("timezone", "offset_column")}
    naive = _refusal(tmp_path, dataset_src, zoneless)
    assert "timestamps without a UTC offset" in naive
    assert all(m.startswith(str(tmp_path / "export")) for m in (london, month_first, naive)), first


def test_text_ids_are_keyed_apart_and_numbers_as_before(tmp_path: Path, dataset_src: Path) -> None:
    """The bank's text IDs key into [2**62, 2**63); the product's own numbers are their own keys."""
    export = berlin_export(dataset_src, tmp_path / "export")
    from workload.data.dataset import Dataset
    outcome = publish.publish(tmp_path / "ds", LocalSource(export), reading(str(write(tmp_path / "m.json", MAPPING)),
                                                                            None))
    frame = Dataset(outcome.root).transactions("training/2018-04-02.csv")
    canonical = pd.read_parquet(dataset_src / "training" / "2018-04-02.parquet")
    assert (frame[schema.TRANSACTION_ID] >= 2**62).all() and frame[schema.CUSTOMER_ID].min() >= 2**62
    assert frame[schema.AS_GIVEN[schema.TRANSACTION_ID]].str.match(r"^NB\d{12}$").all()
    assert frame[schema.CUSTOMER_ID].nunique() == canonical[schema.CUSTOMER_ID].nunique()
    np.testing.assert_array_equal(frame[schema.TX_AMOUNT].sort_values().to_numpy(),
                                  canonical[schema.TX_AMOUNT].sort_values().to_numpy())
