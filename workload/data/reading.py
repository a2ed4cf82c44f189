"""How a dataset's files are read: the user's column names, and the date format they declared.

A bank's export says ``card_id``, ``ts``, ``is_fraud``; a mapping file (``--columns``, YAML or JSON
``{their name: our name}``) maps them to the schema's names once. Dates in ISO 8601 (with or
without an offset or ``Z``) and Parquet timestamps are read as they are; any other text format
must be declared (``--datetime-format '%d/%m/%Y %H:%M'``), and numbers are read as epoch seconds
or milliseconds only when declared (``epoch-s``, ``epoch-ms``): a date is never guessed
(``05/04/2018`` read month-first silently moves a day across the test period).

Both are part of a dataset's identity: the manifest records them, every reader of the dataset
(seed, workers, score) reads its files through them, and a changed mapping is a new dataset.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from workload.data import schema

EPOCHS = {"epoch-s": "s", "epoch-ms": "ms"}  # declared numeric timestamps -> pandas unit


class ReadingError(ValueError):
    """A column mapping or date format that can never be used: one line naming the flag or file."""


@dataclass(frozen=True)
class Reading:
    """The user's column names -> the schema's, and their declared date format (None: ISO 8601 only)."""

    columns: tuple[tuple[str, str], ...] = ()
    datetime_format: str | None = None

    def renames(self) -> dict[str, str]:
        return dict(self.columns)

    def source_of(self, target: str) -> str:
        """The user's name for schema column `target` (the schema's own name when unmapped)."""
        return next((src for src, dst in self.columns if dst == target), target)

    def record(self) -> dict[str, Any]:
        """What the manifest records (and compares: a dataset is read one way for its whole life)."""
        return {"columns": dict(self.columns), "datetime_format": self.datetime_format}

    @classmethod
    def from_record(cls, record: dict[str, Any] | None) -> Reading:
        record = record or {}
        return cls(columns=tuple(sorted((record.get("columns") or {}).items())),
                   datetime_format=record.get("datetime_format"))

    def describe(self) -> str:
        mapping = ", ".join(f"{s}->{d}" for s, d in self.columns) or "none"
        return f"column mapping {{{mapping}}}, datetime format {self.datetime_format or 'ISO 8601'}"


AS_IS = Reading()  # the schema's own names, ISO 8601 dates: files written by the simulator or as the tutorial's


def check_columns(mapping: Any, where: str) -> tuple[tuple[str, str], ...]:
    """A mapping {user's column: schema column}, validated: known targets, one source per target."""
    if not isinstance(mapping, dict) or not mapping:
        raise ReadingError(f"{where}: expected a mapping of your column names to ours, e.g. "
                           f"{{card_id: {schema.CUSTOMER_ID}, ts: {schema.TX_DATETIME}}}; saw {type(mapping).__name__}")
    seen: dict[str, str] = {}
    for src, dst in mapping.items():
        if not isinstance(src, str) or not isinstance(dst, str):
            raise ReadingError(f"{where}: {src!r}: {dst!r}: column names must be text")
        if dst not in schema.KNOWN:
            raise ReadingError(f"{where}: {src!r} maps to unknown column {dst!r}; allowed: {', '.join(schema.KNOWN)}")
        if dst in seen:
            raise ReadingError(f"{where}: both {seen[dst]!r} and {src!r} map to {dst}; one column per target")
        seen[dst] = src
    return tuple(sorted(mapping.items()))


def load_columns(path: str | Path, flag: str = "--columns") -> tuple[tuple[str, str], ...]:
    """The mapping file at `path` (YAML or JSON), validated."""
    where = f"{flag} {path}"
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ReadingError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    try:
        mapping = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ReadingError(f"{where}: not YAML or JSON ({first})") from None
    return check_columns(mapping, where)


def check_format(fmt: str | None, flag: str = "--datetime-format") -> str | None:
    """A declared date format: an epoch unit, or strftime directives that read back what they write."""
    if not fmt or fmt in EPOCHS:
        return fmt or None
    try:
        sample = time.strftime(fmt, time.struct_time((2018, 4, 5, 20, 21, 7, 3, 95, 0)))
        time.strptime(sample, fmt)
        ok = bool(re.search(r"%[dj]", fmt)) and bool(re.search(r"%[mbB]", fmt)) or "%j" in fmt
    except (ValueError, TypeError):
        ok = False
    if not ok:
        raise ReadingError(f"{flag} {fmt!r} is not a date format; give strftime directives with the day and month "
                           f"(e.g. '%d/%m/%Y %H:%M'), or {' / '.join(EPOCHS)} for numbers")
    return fmt


def reading(columns: str | None, datetime_format: str | None, prefix: str = "--") -> Reading:
    """The Reading of `--columns FILE` and `--datetime-format FMT` (or their environment variables)."""
    mapped = load_columns(columns, f"{prefix}columns") if columns else ()
    return Reading(columns=mapped, datetime_format=check_format(datetime_format, f"{prefix}datetime-format"))
