"""How a dataset's files are read, in-process: the column mapping and the declared date format, each refusal one
line naming the flag or file and what is allowed, and the record the manifest keeps (test_bank_exports.py runs
the same rules through `seed` processes, which mutation testing cannot trace)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from workload.data import schema
from workload.data.reading import AS_IS, Reading, ReadingError, check_columns, check_format, load_columns, reading

MAPPED = Reading(columns=(("card_id", schema.CUSTOMER_ID), ("ts", schema.TX_DATETIME)), datetime_format="%d/%m/%Y")
NOT_A_FORMAT = ("is not a date format; give strftime directives with the day and month (e.g. '%d/%m/%Y %H:%M'), or "
                "epoch-s / epoch-ms for numbers")


def test_a_reading_is_recorded_and_read_back_as_it_was() -> None:
    assert MAPPED.record() == {"columns": {"card_id": schema.CUSTOMER_ID, "ts": schema.TX_DATETIME},
                               "datetime_format": "%d/%m/%Y"}
    assert Reading.from_record(MAPPED.record()) == MAPPED
    assert Reading.from_record(None) == Reading.from_record({}) == AS_IS
    assert MAPPED.describe() == (f"column mapping {{card_id->{schema.CUSTOMER_ID}, ts->{schema.TX_DATETIME}}}, "
                                 "datetime format %d/%m/%Y")
    assert AS_IS.describe() == "column mapping {none}, datetime format ISO 8601"
    assert MAPPED.source_of(schema.TX_DATETIME) == "ts" and MAPPED.source_of(schema.TX_AMOUNT) == schema.TX_AMOUNT


def test_a_mapping_is_text_to_known_columns_one_source_each() -> None:
    assert check_columns({"ts": schema.TX_DATETIME, "card_id": schema.CUSTOMER_ID}, "f") == MAPPED.columns
    for bad in ([("ts", schema.TX_DATETIME)], {}, None):
        with pytest.raises(ReadingError, match=rf"^f: expected a mapping of your column names to ours, e\.g\. "
                                               rf"\{{card_id: {schema.CUSTOMER_ID}, ts: {schema.TX_DATETIME}\}}; "
                                               rf"saw {type(bad).__name__}$"):
            check_columns(bad, "f")
    with pytest.raises(ReadingError, match=r"^f: 'ts': 3: column names must be text$"):
        check_columns({"ts": 3}, "f")
    with pytest.raises(ReadingError, match=r"^f: 3: 'TX_DATETIME': column names must be text$"):
        check_columns({3: schema.TX_DATETIME}, "f")
    with pytest.raises(ReadingError, match=rf"^f: 'ts' maps to unknown column 'WHEN'; allowed: "
                                           rf"{re.escape(', '.join(schema.KNOWN))}$"):
        check_columns({"ts": "WHEN"}, "f")
    with pytest.raises(ReadingError, match=rf"^f: both 'a' and 'b' map to {schema.TX_DATETIME}; one column per "
                                           "target$"):
        check_columns({"a": schema.TX_DATETIME, "b": schema.TX_DATETIME}, "f")


def test_a_mapping_file_is_yaml_or_json_and_a_bad_one_is_named(tmp_path: Path) -> None:
    yaml_file, json_file = tmp_path / "columns.yaml", tmp_path / "columns.json"
    yaml_file.write_text(f"card_id: {schema.CUSTOMER_ID}\nts: {schema.TX_DATETIME}\n")
    json_file.write_text(f'{{"ts": "{schema.TX_DATETIME}", "card_id": "{schema.CUSTOMER_ID}"}}')
    assert load_columns(yaml_file) == load_columns(str(json_file)) == MAPPED.columns
    with pytest.raises(ReadingError, match=rf"^--columns {tmp_path / 'absent'}: cannot read it \(No such file or "
                                           r"directory\)$"):
        load_columns(tmp_path / "absent")
    yaml_file.write_text("ts: [unclosed\n")
    with pytest.raises(ReadingError, match=rf"^DATASET_COLUMNS {yaml_file}: not YAML or JSON \(while parsing a flow "
                                           r"sequence\)$"):
        load_columns(yaml_file, "DATASET_COLUMNS")
    yaml_file.write_text("- ts\n")
    with pytest.raises(ReadingError, match=rf"^--columns {yaml_file}: expected a mapping .*; saw list$"):
        load_columns(yaml_file)


@pytest.mark.parametrize(("fmt", "declared"), [
    (None, None), ("", None), ("epoch-s", "epoch-s"), ("epoch-ms", "epoch-ms"), ("%d/%m/%Y %H:%M", "%d/%m/%Y %H:%M"),
    ("%d %b %Y", "%d %b %Y"), ("%B %d, %Y", "%B %d, %Y"), ("%Y-%j", "%Y-%j"), ("%j %Y %m", "%j %Y %m"),
])
def test_a_declared_format_names_the_day_and_month_or_an_epoch(fmt: str | None, declared: str | None) -> None:
    assert check_format(fmt) == declared


@pytest.mark.parametrize("fmt", ["%Y", "%d %Y", "%m/%Y", "%D/%M/%Y", "%Q %d %m", "epoch-us", "%d/%m/%Y %"])
def test_a_format_without_the_day_and_month_or_that_cannot_read_back_is_refused(fmt: str) -> None:
    with pytest.raises(ReadingError, match=f"^--datetime-format {re.escape(repr(fmt))} {re.escape(NOT_A_FORMAT)}$"):
        check_format(fmt)
    with pytest.raises(ReadingError, match=f"^DATASET_DATETIME_FORMAT {re.escape(repr(fmt))} is not a date format"):
        check_format(fmt, "DATASET_DATETIME_FORMAT")


def test_the_flags_make_one_reading_and_their_refusals_name_the_flag(tmp_path: Path) -> None:
    columns = tmp_path / "columns.yaml"
    columns.write_text(f"card_id: {schema.CUSTOMER_ID}\nts: {schema.TX_DATETIME}\n")
    assert reading(None, None) == AS_IS
    assert reading(str(columns), "%d/%m/%Y") == MAPPED
    with pytest.raises(ReadingError, match=rf"^--columns {tmp_path / 'absent'}: cannot read it"):
        reading(str(tmp_path / "absent"), None)
    with pytest.raises(ReadingError, match=r"^--datetime-format '%Y' is not a date format"):
        reading(None, "%Y")
    with pytest.raises(ReadingError, match=r"^DATASET_datetime-format '%Y' is not a date format"):
        reading(str(columns), "%Y", prefix="DATASET_")
    with pytest.raises(ReadingError, match=rf"^DATASET_columns {tmp_path / 'absent'}: cannot read it"):
        reading(str(tmp_path / "absent"), "%d/%m/%Y", prefix="DATASET_")


BOMB = ('a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
        + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
        + "TRANSACTION_ID: *i\n")


def test_a_yaml_alias_bomb_is_refused_at_once_in_one_line(tmp_path: Path) -> None:
    """A 377-byte alias bomb took 27-66 s and 2.6 GB before a MemoryError traceback."""
    import time as clock
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    assert len(BOMB) < 400
    started = clock.monotonic()
    with pytest.raises(ReadingError) as err:
        load_columns(bomb)
    assert clock.monotonic() - started < 1.0
    assert str(err.value) == (f"--columns {bomb}: aliases (*a, line 2) are not allowed: write the value out")


def test_a_mapping_key_given_twice_is_refused_not_silently_the_last(tmp_path: Path) -> None:
    twice = tmp_path / "twice.yaml"
    twice.write_text(f"ts: {schema.TX_DATETIME}\ncard_id: {schema.CUSTOMER_ID}\nts: {schema.TX_AMOUNT}\n")
    with pytest.raises(ReadingError) as err:
        load_columns(twice)
    assert str(err.value) == f"--columns {twice}: key 'ts' is given twice (line 3): give each once"


def test_a_mapping_file_is_bounded_in_size(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("".join(f"c{i}: {schema.TX_AMOUNT}\n" for i in range(6000)))
    with pytest.raises(ReadingError) as err:
        load_columns(big)
    assert str(err.value) == (f"--columns {big}: larger than 64 KiB; a mapping file names your columns and how they "
                              "are written")


def test_the_structured_mapping_declares_zone_offsets_format_and_dialect(tmp_path: Path) -> None:
    mapping = tmp_path / "bank.yaml"
    mapping.write_text("columns: {txn_ref: TRANSACTION_ID, booked_at: TX_DATETIME}\ntimezone: Europe/Berlin\n"
                       "offset_column: utc_offset\ndatetime_format: '%d.%m.%Y %H:%M:%S'\n"
                       "csv: {separator: ';', decimal: ',', encoding: latin-1}\n")
    got = reading(str(mapping), None)
    assert (got.timezone, got.offset_column) == ("Europe/Berlin", "utc_offset")
    assert got.datetime_format == "%d.%m.%Y %H:%M:%S"
    assert (got.dialect.separator, got.dialect.decimal, got.dialect.encoding) == (";", ",", "latin-1")
    assert Reading.from_record(got.record()) == got
    mapping.write_text("columns: {txn_ref: TRANSACTION_ID}\ncsv: {separator: ';', decimal: ';'}\n")
    with pytest.raises(ReadingError, match=r"csv: separator and decimal are both ';'$"):
        reading(str(mapping), None)
    mapping.write_text("columns: {txn_ref: TRANSACTION_ID}\nzone: UTC\n")
    with pytest.raises(ReadingError, match=r": unknown key\(s\) \['zone'\]; allowed: columns, timezone, offset_column, "
                                           r"datetime_format, csv$"):
        reading(str(mapping), None)
