"""How a dataset's files are read: the user's column names, their date format, time zone and CSV dialect.

A bank's export says ``card_id``, ``ts``, ``is_fraud``; a mapping file (``--columns``, YAML or JSON
``{their name: our name}``) maps them to the schema's names once. Dates in ISO 8601 (with or
without an offset or ``Z``) and Parquet timestamps are read as they are; any other text format
must be declared (``--datetime-format '%d/%m/%Y %H:%M'``), and numbers are read as epoch seconds
or milliseconds only when declared (``epoch-s``, ``epoch-ms``): a date is never guessed
(``05/04/2018`` read month-first silently moves a day across the test period).

A mapping file may also say more than the names (the structured form)::

    columns: {txn_ref: TRANSACTION_ID, booked_at: TX_DATETIME, card_hash: CUSTOMER_ID, ...}
    timezone: Europe/Berlin      # naive timestamps are wall-clock times there; days are its calendar days
    offset_column: utc_offset    # optional: a column of offsets (+02:00) that makes each timestamp exact
    datetime_format: "%d.%m.%Y %H:%M:%S"
    csv: {separator: ";", decimal: ",", quote: '"', encoding: utf-8, header: 1}

A bank's export (any column mapped) with timestamps that carry no offset must declare its zone
(``timezone: Europe/Berlin``, or ``UTC``): local times are never taken for UTC silently. The product's
own form (no mapping) is the tutorial's, in UTC.

All of it is part of a dataset's identity: the manifest records them, every reader of the dataset
(seed, workers, score) reads its files through them, and a changed mapping is a new dataset.
"""

from __future__ import annotations

import codecs
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml

from workload.data import schema

EPOCHS = {"epoch-s": "s", "epoch-ms": "ms"}  # declared numeric timestamps -> pandas unit
UTC = "UTC"
_STRUCTURED = ("columns", "timezone", "offset_column", "datetime_format", "csv")


class ReadingError(ValueError):
    """A column mapping or date format that can never be used: one line naming the flag or file."""


@dataclass(frozen=True)
class Dialect:
    """How a CSV file is written: separator, decimal mark, quote character, encoding, the header's line."""

    separator: str = ","
    decimal: str = "."
    quote: str = '"'
    encoding: str = "utf-8"
    header: int = 1

    def record(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if v != getattr(COMMA, k)}

    def describe(self) -> str:
        return (f"separator {self.separator!r}, decimal {self.decimal!r}, quote {self.quote!r}, encoding "
                f"{self.encoding}, header on line {self.header}")


COMMA = Dialect()  # what pandas and the simulator write


@dataclass(frozen=True)
class Reading:
    """The user's column names -> the schema's, their declared date format (None: ISO 8601 only), time
    zone (None: UTC for the product's own form; required for a mapped export's naive timestamps), the
    column of UTC offsets, and the CSV dialect."""

    columns: tuple[tuple[str, str], ...] = ()
    datetime_format: str | None = None
    timezone: str | None = None
    offset_column: str | None = None
    dialect: Dialect = field(default=COMMA)

    def renames(self) -> dict[str, str]:
        return dict(self.columns)

    def source_of(self, target: str) -> str:
        """The user's name for schema column `target` (the schema's own name when unmapped)."""
        return next((src for src, dst in self.columns if dst == target), target)

    def naive_zone(self) -> str | None:
        """The zone naive timestamps are wall-clock times in: the declared one, else UTC for the product's
        own form (no mapping: the tutorial's files), else None (a mapped export must declare it)."""
        return self.timezone or (None if self.columns else UTC)

    def day_zone(self) -> str:
        """The zone whose calendar days a dataset's days are."""
        return self.timezone or UTC

    def record(self) -> dict[str, Any]:
        """What the manifest records (and compares: a dataset is read one way for its whole life)."""
        extra = {"timezone": self.timezone, "offset_column": self.offset_column, "csv": self.dialect.record()}
        return {"columns": dict(self.columns), "datetime_format": self.datetime_format,
                **{k: v for k, v in extra.items() if v}}

    @classmethod
    def from_record(cls, record: dict[str, Any] | None) -> Reading:
        record = record or {}
        return cls(columns=tuple(sorted((record.get("columns") or {}).items())),
                   datetime_format=record.get("datetime_format"), timezone=record.get("timezone"),
                   offset_column=record.get("offset_column"), dialect=Dialect(**(record.get("csv") or {})))

    def describe(self) -> str:
        mapping = ", ".join(f"{s}->{d}" for s, d in self.columns) or "none"
        out = f"column mapping {{{mapping}}}, datetime format {self.datetime_format or 'ISO 8601'}"
        if self.timezone or self.offset_column:
            out += f", timezone {self.timezone or UTC}" + (f", offsets in {self.offset_column}"
                                                           if self.offset_column else "")
        return out + (f", CSV {self.dialect.describe()}" if self.dialect != COMMA else "")


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


def _text(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ReadingError(f"{where}: {key}: {value!r} must be text")
    return value


def check_timezone(zone: Any, where: str) -> str | None:
    """A declared zone: an IANA name (Europe/Berlin; DST is the zone's) or UTC."""
    if zone is None:
        return None
    zone = _text(zone, "timezone", where)
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ReadingError(f"{where}: timezone {zone!r} is not a time zone; give an IANA name such as "
                           "Europe/Berlin, or UTC") from None
    return zone


def check_dialect(csv: Any, where: str) -> Dialect:
    """The CSV dialect a mapping file declares (``csv: {separator: ";", decimal: ",", ...}``)."""
    if csv is None:
        return COMMA
    allowed = ", ".join(vars(COMMA))
    if not isinstance(csv, dict):
        raise ReadingError(f"{where}: csv: expected a mapping of {allowed}; saw {type(csv).__name__}")
    unknown = sorted(str(k) for k in csv if k not in vars(COMMA))
    if unknown:
        raise ReadingError(f"{where}: csv: unknown key(s) {unknown}; allowed: {allowed}")
    out = {}
    for key in ("separator", "decimal", "quote"):
        if key in csv:
            value = _text(csv[key], f"csv.{key}", where)
            if len(value) != 1:
                raise ReadingError(f"{where}: csv.{key}: {value!r} must be one character")
            out[key] = value
    if "encoding" in csv:
        out["encoding"] = _text(csv["encoding"], "csv.encoding", where)
        try:
            codecs.lookup(out["encoding"])
        except LookupError:
            raise ReadingError(f"{where}: csv.encoding: {out['encoding']!r} is not an encoding; e.g. utf-8, "
                               "latin-1, cp1252") from None
    if "header" in csv:
        if type(csv["header"]) is not int or csv["header"] < 1:
            raise ReadingError(f"{where}: csv.header: {csv['header']!r} must be the header's line number (1 or more)")
        out["header"] = csv["header"]
    dialect = Dialect(**out)
    if dialect.separator == dialect.decimal:
        raise ReadingError(f"{where}: csv: separator and decimal are both {dialect.separator!r}")
    return dialect


def check_mapping(mapping: Any, where: str) -> Reading:
    """A mapping file's content: the flat form {their column: ours}, or the structured form (``columns``
    with ``timezone``, ``offset_column``, ``datetime_format``, ``csv``)."""
    if not (isinstance(mapping, dict) and isinstance(mapping.get("columns"), dict)):
        return Reading(columns=check_columns(mapping, where))
    unknown = sorted(str(k) for k in mapping if k not in _STRUCTURED)
    if unknown:
        raise ReadingError(f"{where}: unknown key(s) {unknown}; allowed: {', '.join(_STRUCTURED)}")
    offset = mapping.get("offset_column")
    return Reading(columns=check_columns(mapping["columns"], f"{where}: columns"),
                   datetime_format=check_format(mapping.get("datetime_format"), f"{where}: datetime_format"),
                   timezone=check_timezone(mapping.get("timezone"), where),
                   offset_column=_text(offset, "offset_column", where) if offset is not None else None,
                   dialect=check_dialect(mapping.get("csv"), where))


MAX_MAPPING_BYTES = 64 * 1024  # a mapping file names a few dozen columns; anything larger is no mapping


class _Refused(yaml.YAMLError):
    """Raised by the strict loader: the message is the user's one line."""


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases (a 377-byte alias bomb expands to gigabytes) and without
    duplicate keys (silently keeping the last hides a typo)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(f"aliases (*{event.anchor}, line {event.start_mark.line + 1}) are not allowed: write the "
                           "value out")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise _Refused(f"key {key!r} is given twice (line {key_node.start_mark.line + 1}): give each once")
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_mapping(path: str | Path, flag: str = "--columns") -> Reading:
    """The mapping file at `path` (YAML or JSON), bounded in size, without aliases or repeated keys, validated."""
    where = f"{flag} {path}"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_MAPPING_BYTES + 1)
    except OSError as exc:
        raise ReadingError(f"{where}: cannot read it ({exc.strerror or exc})") from None
    if len(data) > MAX_MAPPING_BYTES:
        raise ReadingError(f"{where}: larger than {MAX_MAPPING_BYTES // 1024} KiB; a mapping file names your columns "
                           "and how they are written")
    try:
        mapping = yaml.load(data.decode("utf-8"), Loader=_StrictLoader)  # noqa: S506 - a safe loader, stricter
    except _Refused as exc:
        raise ReadingError(f"{where}: {exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ReadingError(f"{where}: not YAML or JSON ({first[:200]})") from None
    return check_mapping(mapping, where)


def load_columns(path: str | Path, flag: str = "--columns") -> tuple[tuple[str, str], ...]:
    """The column names of the mapping file at `path`."""
    return load_mapping(path, flag).columns


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


def reading(columns: str | None, datetime_format: str | None, prefix: str = "--", timezone: str | None = None,
            inline: Any = None) -> Reading:
    """The Reading of `--columns FILE` (or `inline`, the mapping itself: the stack's setting), `--datetime-format
    FMT` and `--timezone ZONE`; a flag and the mapping file declaring one thing two ways is refused."""
    declared = (load_mapping(columns, f"{prefix}columns") if columns else
                check_mapping(inline, "DATASET_COLUMNS") if inline is not None else AS_IS)
    fmt = check_format(datetime_format, f"{prefix}datetime-format")
    zone = check_timezone(timezone, f"{prefix}timezone")
    for flag, given, mapped in (("datetime-format", fmt, declared.datetime_format),
                                ("timezone", zone, declared.timezone)):
        if given and mapped and given != mapped:
            raise ReadingError(f"{prefix}{flag} {given!r} and the mapping file's {mapped!r} disagree; declare it once")
    return replace(declared, datetime_format=fmt or declared.datetime_format, timezone=zone or declared.timezone)
