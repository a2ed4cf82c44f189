"""Time and a day's place: declared zones (DST included), offsets, a file's day by its name or its majority,
late postings kept and counted, placeholders and implausible calendars refused in one line (in-process, on
small hand-made days: cheap)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from workload.data import schema
from workload.data.dataset import Dataset
from workload.data.dayfile import LATE_DAYS, DatasetError, describe, read_transactions, validate
from workload.data.publish import publish
from workload.data.reading import Reading, ReadingError, reading
from workload.data.source import LocalSource

NAMES = {"ref": schema.TRANSACTION_ID, "when": schema.TX_DATETIME, "card": schema.CUSTOMER_ID,
         "pos": schema.TERMINAL_ID, "amount": schema.TX_AMOUNT, "fraud": schema.TX_FRAUD}
BANK = Reading(columns=tuple(sorted(NAMES.items())))
BERLIN = Reading(columns=BANK.columns, timezone="Europe/Berlin")


def rows(times: list[str], first_id: int = 1, **extra: list[object]) -> pd.DataFrame:
    n = len(times)
    return pd.DataFrame({"ref": np.arange(first_id, first_id + n), "when": times, "card": np.arange(n) % 3,
                         "pos": np.arange(n) % 2, "amount": np.linspace(1.0, 9.0, n), "fraud": np.zeros(n, int),
                         **extra})


def test_naive_times_of_a_mapped_export_need_a_declared_zone() -> None:
    """Today they were read as UTC: a Berlin day's first two hours became the previous day."""
    with pytest.raises(DatasetError) as err:
        validate(rows(["2018-07-01 00:30:00"]), "bank/2018-07-01.csv", first_line=2, reading=BANK)
    assert str(err.value) == (
        "bank/2018-07-01.csv: column when has timestamps without a UTC offset (line 2: '2018-07-01 00:30:00'); "
        "declare the zone they are local times in (timezone: Europe/Berlin or timezone: UTC in the mapping file, "
        "or --timezone), or name a column of offsets (offset_column)")
    utc = validate(rows(["2018-07-01 00:30:00"]), "d", reading=Reading(columns=BANK.columns, timezone="UTC"))
    assert utc[schema.TX_DATETIME].iloc[0] == pd.Timestamp("2018-07-01 00:30:00")


def test_days_are_calendar_days_in_the_declared_zone_dst_included() -> None:
    """Naive local times stay on their local day; an offset-carrying time is converted into the zone, summer
    (+02:00) and winter (+01:00) alike; the hour that happens twice in October reads without a refusal."""
    got = validate(rows(["2018-07-01 00:30:00", "2018-06-30T22:45:00Z", "2018-12-31T23:30:00Z",
                         "2018-10-28 02:30:00"]), "d", reading=BERLIN)[schema.TX_DATETIME]
    assert list(got) == [pd.Timestamp("2018-07-01 00:30"), pd.Timestamp("2018-07-01 00:45"),
                         pd.Timestamp("2018-10-28 02:30"), pd.Timestamp("2019-01-01 00:30")]
    # the product's own form (no mapping) keeps the tutorial's UTC: the simulator's datasets train as before
    assert validate(rows(["2018-06-30T22:45:00+00:00"]).rename(columns=NAMES), "d")[schema.TX_DATETIME].iloc[0] \
        == pd.Timestamp("2018-06-30 22:45")


def test_an_offset_column_makes_times_exact_and_a_zone_that_disagrees_is_refused() -> None:
    frame = rows(["27.10.2018 05:51:33", "28.10.2018 02:30:00", "28.10.2018 02:30:00"],
                 offset=["+02:00", "+02:00", "+01:00"])
    declared = Reading(columns=BANK.columns, datetime_format="%d.%m.%Y %H:%M:%S", offset_column="offset",
                       timezone="Europe/Berlin")
    got = validate(frame, "d", reading=declared)[schema.TX_DATETIME]
    assert list(got) == [pd.Timestamp("2018-10-27 05:51:33"), pd.Timestamp("2018-10-28 02:30"),
                         pd.Timestamp("2018-10-28 02:30")]
    utc_days = validate(frame, "d", reading=Reading(columns=BANK.columns, datetime_format=declared.datetime_format,
                                                    offset_column="offset"))[schema.TX_DATETIME]
    assert utc_days.iloc[0] == pd.Timestamp("2018-10-27 03:51:33")  # no zone declared: UTC days
    with pytest.raises(DatasetError) as err:
        validate(frame, "bank.csv", first_line=2, reading=Reading(**{**vars(declared), "timezone": "Europe/London"}))
    assert str(err.value) == ("bank.csv: line 2: '27.10.2018 05:51:33' at offset '+02:00' is 2018-10-27 04:51:33 in "
                              "Europe/London: the declared timezone does not match the offsets in offset; declare "
                              "the zone the times were recorded in")
    with pytest.raises(DatasetError, match=r"^bank.csv: column offset must hold UTC offsets such as \+02:00 or Z: "
                                           r"line 3 has 'CEST'$"):
        validate(frame.assign(offset=["+02:00", "CEST", "Z"]), "bank.csv", first_line=2, reading=declared)


def test_a_zone_is_declared_once_by_an_iana_name(tmp_path: Path) -> None:
    mapping = tmp_path / "m.yaml"
    mapping.write_text("columns: {ref: TRANSACTION_ID, when: TX_DATETIME}\ntimezone: Europe/Berlin\n")
    assert reading(str(mapping), None).timezone == "Europe/Berlin"
    assert reading(None, None, timezone="UTC").timezone == "UTC"
    with pytest.raises(ReadingError, match=r"^--timezone: timezone 'CEST' is not a time zone; give an IANA name "
                                           r"such as Europe/Berlin, or UTC$"):
        reading(None, None, timezone="CEST")
    with pytest.raises(ReadingError, match=r"^--timezone 'UTC' and the mapping file's 'Europe/Berlin' disagree; "
                                           r"declare it once$"):
        reading(str(mapping), None, timezone="UTC")


def test_out_of_range_timestamps_are_refused_in_one_line_before_anything_is_published() -> None:
    """An epoch-ms value at 1677-09-22 fits pandas' nanoseconds, and overflowed later (a 40-line
    OverflowError in every seed); a placeholder year is no transaction's."""
    for value, shown in ((-9_223_286_400_000, "-9223286400000"), (-2_208_988_800_000, "-2208988800000")):
        frame = rows(["x", "y"]).assign(when=[1_530_403_200_000, value])
        with pytest.raises(DatasetError) as err:
            validate(frame, "f.csv", first_line=2, reading=Reading(datetime_format="epoch-ms", columns=BANK.columns))
        assert re.fullmatch(rf"f\.csv: column when has the timestamp {shown} \(line 3\), read as \S+ \S+; timestamps "
                            r"from 1970 to 2199 are read \(a placeholder date, or a wrong --datetime-format or epoch "
                            r"unit\)", str(err.value)), str(err.value)


def test_a_days_place_is_its_name_or_most_of_its_rows_never_its_oldest_row() -> None:
    late = rows(["2018-04-06 10:00:00", "2018-04-06 11:00:00", "2018-04-04 09:00:00"])
    named = describe(validate(late, "d", reading=BERLIN), "training/2018-04-06.csv")
    assert (named["day"], named["first"], named["late"]) == ("2018-04-06", "2018-04-04", 1)
    assert named["start"] == "2018-04-06T10:00:00"  # roles are judged on the day's own rows
    unnamed = describe(validate(late, "d", reading=BERLIN), "training/export.csv")
    assert (unnamed["day"], unnamed["late"]) == ("2018-04-06", 1)
    week = describe(validate(rows([f"2018-04-0{d} 10:00:00" for d in range(1, 8)]), "d", reading=BERLIN),
                    "training/week.csv")
    assert week["day"] == "2018-04-01" and "late" not in week  # a file of several days: its first, as before


def test_a_placeholder_date_is_refused_naming_the_file_the_row_and_the_value() -> None:
    frame = rows(["2018-04-06 10:00:00", "2018-04-06 11:00:00", "1971-01-01 00:00:00"])
    with pytest.raises(DatasetError) as err:
        validate(frame, "gs://b/training/2018-04-06.csv", first_line=2, reading=BERLIN)
    assert str(err.value) == (f"gs://b/training/2018-04-06.csv: column when has '1971-01-01 00:00:00' (line 4), read "
                              f"as 1971-01-01 00:00:00: more than {LATE_DAYS} days from the file's day 2018-04-06 (a "
                              "placeholder date, or a file of many days named for one?); late postings up to that "
                              "are kept with the day they came with")


def test_a_day_named_file_whose_dates_read_elsewhere_is_refused() -> None:
    """Day-first dates read month-first: 01.07.2018 (1 July) becomes 7 January, and the file named for
    1 July holds none of its rows on that day."""
    frame = rows(["01.07.2018 05:51:33", "01.07.2018 06:00:00"])
    wrong = Reading(columns=BANK.columns, datetime_format="%m.%d.%Y %H:%M:%S", timezone="Europe/Berlin")
    with pytest.raises(DatasetError) as err:
        validate(frame, "bank/2018-07-01.csv", first_line=2, reading=wrong)
    assert str(err.value) == ("bank/2018-07-01.csv: named for 2018-07-01, but none of its 2 rows is dated on that "
                              "day (most are on 2018-01-07, e.g. line 2: '01.07.2018 05:51:33'); check the declared "
                              "datetime format (day and month swapped?) and timezone")


def _publish(src: Path, dest: Path, reading: Reading) -> list[str]:
    return [e["path"] for e in publish(dest, LocalSource(src), reading).entries]


def test_a_late_posting_leaves_its_day_in_place_is_counted_and_is_no_history_before_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The last day's file carrying one row dated two days back trained third instead of last; now it
    stays last, the count is logged, and the row is no feature history for the days before its file."""
    src = tmp_path / "src"
    for role, days in (("training", range(1, 6)), ("testing", range(6, 8))):
        (src / role).mkdir(parents=True)
        for d in days:
            times = [f"2018-04-0{d} {h:02d}:00:00" for h in range(8, 20)]
            if d == 5:
                times.append("2018-04-03 12:30:00")
            rows(times, first_id=100 * d).to_csv(src / role / f"2018-04-0{d}.csv", index=False)
    with caplog.at_level(logging.INFO):
        publish(tmp_path / "ds", LocalSource(src), BERLIN)
    assert "1 row(s) dated outside their file's day, kept with the day they came with (late postings), in 1 " \
           f"file(s): {src / 'training' / '2018-04-05.csv'} (1)" in caplog.text
    data = Dataset(tmp_path / "ds")
    assert data.training_shards() == [f"training/2018-04-0{d}.csv" for d in range(1, 6)]
    day4 = {f["path"] for f in data.feature_inputs("training/2018-04-04.csv")}
    assert "training/2018-04-05.csv" not in day4 and "training/2018-04-03.csv" in day4
    assert len(data.examples(["training/2018-04-05.csv"]).ids) == 13  # the late row is scored with its day


def test_weeks_between_days_are_warned_of(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = tmp_path / "src"
    for role, day in (("training", "2018-01-07"), ("training", "2018-02-07"), ("testing", "2018-03-07")):
        (src / role).mkdir(parents=True, exist_ok=True)
        rows([f"{day} 10:00:00", f"{day} 11:00:00"], first_id=int(day[5:7]) * 10).to_csv(src / role / f"{day}.csv",
                                                                                         index=False)
    with caplog.at_level(logging.WARNING):
        publish(tmp_path / "ds", LocalSource(src), BERLIN)
    assert ("31 days between the dataset's days 2018-01-07 and 2018-02-07 (more than 7): days missing, or dates "
            "misread (check the declared datetime format and timezone)") in caplog.text


def test_a_csv_read_keeps_the_declared_zone_through_read_transactions(tmp_path: Path) -> None:
    rows(["2018-07-01 00:30:00"]).to_csv(tmp_path / "2018-07-01.csv", index=False)
    got = read_transactions(tmp_path / "2018-07-01.csv", reading=BERLIN)
    assert got[schema.TX_DATETIME].iloc[0] == pd.Timestamp("2018-07-01 00:30")


def test_text_ids_keep_their_zeros_and_case_and_numbers_stay_their_own_keys(tmp_path: Path) -> None:
    """'000123', '123' and 'nb1'/'NB1' are four IDs; a column of plain numbers keys as before (bit for bit)."""
    frame = rows(["2018-04-06 10:00:00"] * 4).assign(ref=["000123", "123", "nb1", "NB1"])
    frame.to_csv(tmp_path / "2018-04-06.csv", index=False)
    got = read_transactions(tmp_path / "2018-04-06.csv", reading=BERLIN)
    assert got[schema.TRANSACTION_ID].nunique() == 4 and 123 in set(got[schema.TRANSACTION_ID])
    assert sorted(got[schema.AS_GIVEN[schema.TRANSACTION_ID]]) == ["000123", "123", "NB1", "nb1"]
    numbers = rows(["2018-04-06 10:00:00"] * 3)
    numbers.to_csv(tmp_path / "n.csv", index=False)
    plain = read_transactions(tmp_path / "n.csv", reading=BERLIN)
    assert list(plain.columns) == list(schema.COLUMNS) and plain[schema.TRANSACTION_ID].tolist() == [1, 2, 3]


def test_two_text_ids_with_one_key_are_refused_never_merged(monkeypatch: pytest.MonkeyPatch) -> None:
    """A collision of the 62-bit hash cannot be found by hand: the key function is made to collide."""
    from workload.data import dayfile
    monkeypatch.setattr(dayfile, "_text_key", lambda value: 1 << 62)
    with pytest.raises(DatasetError) as err:
        validate(rows(["2018-04-06 10:00:00"] * 2).assign(card=["A1", "B2"]), "bank.csv", reading=BERLIN)
    assert str(err.value) == ("bank.csv: column card: 'A1' and 'B2' have the same internal key; they cannot be told "
                              "apart (rename one)")
