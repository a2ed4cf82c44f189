"""The rules that span the files of one dataset: transaction IDs unique across all files, no day
re-sent under new IDs, roles apart in time, training before testing, how much history the features get.

``seed`` and ``score`` check them (through ``workload.data.publish``) before a day is published."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from workload.data import features, schema
from workload.data.dayfile import (
    HISTORY,
    REQUIRED_ROLES,
    ROLES,
    SCORING,
    TESTING,
    TRAINING,
    DatasetError,
    given_ids,
    place,
    source_name,
)

# Rows of one day repeating another day's (same card, terminal, second and amount) under new IDs: a
# re-sent day. This share of the smaller day's rows (and at least this many) is no coincidence.
RESENT_SHARE, RESENT_MIN_ROWS = 0.5, 20
RESENT_NEAR = 0.3  # from this share a pair of days is warned of
GAP_DAYS = 7  # days further apart than this are warned of
_ROW_KEY = (schema.CUSTOMER_ID, schema.TERMINAL_ID, schema.TX_DATETIME, schema.TX_AMOUNT)


@dataclass(frozen=True)
class RowHashes:
    """What the rules spanning a dataset need of one file: its IDs (keys, and as the bank gave them), a hash
    of each row's card, terminal, second and amount (a re-sent day repeats those under new IDs), and each
    text ID's key (two texts with one key across files are refused)."""

    ids: np.ndarray
    rows: np.ndarray
    shown: np.ndarray | None = None
    texts: tuple[pd.DataFrame, ...] = ()

    @classmethod
    def of(cls, frame: pd.DataFrame) -> RowHashes:
        rows = pd.util.hash_pandas_object(frame[list(_ROW_KEY)], index=False).to_numpy()
        texts = tuple(pd.DataFrame({"column": c, "key": frame[c].to_numpy(), "given": frame[schema.AS_GIVEN[c]]})
                      .drop_duplicates() for c in schema.IDS if schema.AS_GIVEN[c] in frame.columns)
        shown = given_ids(frame) if schema.AS_GIVEN[schema.TRANSACTION_ID] in frame.columns else None
        return cls(ids=frame[schema.TRANSACTION_ID].to_numpy(), rows=np.unique(rows), shown=shown, texts=texts)


def check_id_keys(hashes: dict[str, RowHashes], names: dict[str, str]) -> None:
    """No two text IDs of one column share an internal key anywhere in the dataset (they would be merged)."""
    parts = [p.assign(rel=rel) for rel, h in hashes.items() for p in h.texts]
    if not parts:
        return
    pairs = pd.concat(parts, ignore_index=True).drop_duplicates(["column", "key", "given"])
    clash = pairs[pairs.duplicated(["column", "key"], keep=False)]
    if len(clash):
        a, b = clash.iloc[0], clash.iloc[1]
        raise DatasetError(f"{a['column']} {a['given']!r} ({names.get(a['rel'], a['rel'])}) and {b['given']!r} "
                           f"({names.get(b['rel'], b['rel'])}) have the same internal key; they cannot be told apart "
                           "(rename one)")


def check_not_resent(rows: dict[str, np.ndarray], names: dict[str, str], sizes: dict[str, int]) -> list[str]:
    """No day repeats another day's transactions under new IDs (an export re-sent, renumbered): it
    would be trained on twice, or tested on after training. A handful of equal rows is coincidence.

    A row in several files counts for every pair of them (a day sent three times, or a re-sent day
    that another day partly repeats, is still measured against each file it repeats). Returns a warning
    for each pair that comes near (RESENT_NEAR)."""
    if len(rows) < 2:
        return []
    rels = list(rows)
    values = np.concatenate([rows[r] for r in rels])
    owner = np.repeat(np.arange(len(rels)), [len(rows[r]) for r in rels])
    order = np.lexsort((owner, values))  # equal rows together, their files in manifest order
    v, o = values[order], owner[order]
    starts = np.flatnonzero(np.r_[True, v[1:] != v[:-1]])
    lengths = np.diff(np.r_[starts, len(v)])
    earlier, later = [], []
    for length in np.unique(lengths[lengths > 1]):  # rows in `length` files: each pair of those files
        files = o[starts[lengths == length][:, None] + np.arange(length)]
        i, j = np.triu_indices(length, 1)
        earlier.append(files[:, i].ravel())
        later.append(files[:, j].ravel())
    if not earlier:
        return []
    pairs, counts = np.unique(np.stack([np.concatenate(earlier), np.concatenate(later)]), axis=1,
                              return_counts=True)
    warnings = []
    for (a, b), n in zip(pairs.T, counts, strict=True):
        smaller = min(sizes[rels[a]], sizes[rels[b]])
        share = f"{n} of {smaller} rows, {100 * n / smaller:.1f} %"
        if n >= max(RESENT_MIN_ROWS, RESENT_SHARE * smaller):
            raise DatasetError(f"{names[rels[b]]} repeats {n} transactions of {names[rels[a]]} (same card, terminal, "
                               f"time and amount) under other transaction IDs ({share}; a day repeating "
                               f"{RESENT_SHARE:.0%} or more of another is refused): a day sent twice would be learned "
                               "twice; remove one of them")
        if n >= max(RESENT_MIN_ROWS, RESENT_NEAR * smaller):
            warnings.append(f"{names[rels[b]]} repeats {n} transactions of {names[rels[a]]} (same card, terminal, "
                            f"time and amount) under other IDs ({share}; refused from {RESENT_SHARE:.0%}): "
                            "check it is not the same day sent again")
    return warnings


def check_unique_ids(ids: dict[str, np.ndarray], names: dict[str, str],
                     shown: dict[str, np.ndarray | None] | None = None) -> None:
    """Transaction IDs unique across the whole dataset: a duplicate would be trained on twice, or
    tested on after training, and dropping one silently loses a row. Names the two files."""
    if not ids:
        return
    rels = list(ids)
    values = np.concatenate([ids[r] for r in rels])
    owner = np.repeat(np.arange(len(rels)), [len(ids[r]) for r in rels])
    order = np.argsort(values, kind="stable")
    same = np.flatnonzero(np.diff(values[order]) == 0)
    if len(same):
        a, b = order[same[0]], order[same[0] + 1]
        given = [(shown or {}).get(r) for r in rels]
        text = [g if g is not None else ids[r] for g, r in zip(given, rels, strict=True)]
        value = np.concatenate(text)[a] if any(g is not None for g in given) else values[a]
        raise DatasetError(f"{schema.TRANSACTION_ID} {value} is in both {names[rels[owner[a]]]} and "
                           f"{names[rels[owner[b]]]}; transaction IDs must be unique across the dataset")


def check_roles_apart(entries: list[dict[str, Any]]) -> None:
    """No instant belongs to two roles: a day both trained on (or used as history) and evaluated
    would score the model on what it saw. Files of different roles must not overlap in time."""
    spans = sorted(((pd.Timestamp(e["start"]), pd.Timestamp(e["end"]), e) for e in entries if "start" in e),
                   key=lambda s: (s[0], s[1]))
    for i, (_, end, a) in enumerate(spans):
        for other_start, _, b in spans[i + 1:]:
            if other_start > end:
                break
            if a["role"] != b["role"]:
                raise DatasetError(
                    f"{source_name(b)} ({b['role']}, {b['first']}..{b['last']}) overlaps {source_name(a)} "
                    f"({a['role']}, {a['first']}..{a['last']}) in time; a day is history, training, "
                    "testing or scoring, never two of them")


def check_layout(entries: list[dict[str, Any]], where: str, required: tuple[str, ...] = REQUIRED_ROLES) -> None:
    for role in required:
        if not any(e["role"] == role for e in entries):
            raise DatasetError(f"{where}: no {role}/ files; a dataset has {TRAINING}/ and {TESTING}/ folders of "
                               f"Parquet or CSV files (and optionally {HISTORY}/ for feature history, {SCORING}/ for "
                               "unlabelled days to score)")
    if not entries:
        raise DatasetError(f"{where}: no day files in {'/, '.join(ROLES)}/")


def history_shortfall(entries: list[dict[str, Any]]) -> str | None:
    """A warning when the first training or test days' feature windows reach before the first day
    the dataset has; None when every one gets its full LOOKBACK_DAYS."""
    if not entries:
        return None
    first_available = min(pd.Timestamp(e["first"]) for e in entries)
    targets = sorted(pd.Timestamp(place(e)) for e in entries if e["role"] in (TRAINING, TESTING))
    want = features.LOOKBACK_DAYS
    short = [t for t in targets if (t - first_available).days < want]
    if not short:
        return None
    have = (targets[0] - first_available).days
    return (f"features look back {want} days (features.LOOKBACK_DAYS), but the first training/test day "
            f"{targets[0].date()} has {have} day(s) of history before it: {len(short)} training/test file(s) "
            f"get shortened feature windows; put earlier days in {HISTORY}/ to give them full history")


def calendar_gaps(entries: list[dict[str, Any]]) -> str | None:
    """A warning when consecutive days of the dataset are more than GAP_DAYS apart: daily files whose dates
    were misread (a month-first format on day-first dates spreads days over months) or days missing."""
    days = sorted({pd.Timestamp(place(e)) for e in entries})
    gaps = [(b - a).days for a, b in zip(days, days[1:], strict=False)]
    if not gaps or max(gaps) <= GAP_DAYS:
        return None
    i = int(np.argmax(gaps))
    return (f"{gaps[i]} days between the dataset's days {days[i].date()} and {days[i + 1].date()} (more than "
            f"{GAP_DAYS}): days missing, or dates misread (check the declared datetime format and timezone)")


def late_postings(entries: list[dict[str, Any]]) -> str | None:
    """A line naming the files that carry rows dated before or after their day (kept with that day)."""
    late = [e for e in entries if e.get("late")]
    if not late:
        return None
    shown = ", ".join(f"{source_name(e)} ({e['late']})" for e in late[:5])
    return (f"{sum(e['late'] for e in late)} row(s) dated outside their file's day, kept with the day they came with "
            f"(late postings), in {len(late)} file(s): {shown}{' ...' if len(late) > 5 else ''}")


def check_training_before_testing(entries: list[dict[str, Any]]) -> None:
    """No training day after the first testing day: its features and labels would carry what
    happened during the test period into the model that is tested on it."""
    tests = [place(e) for e in entries if e["role"] == TESTING]
    late = sorted((e for e in entries if e["role"] == TRAINING and tests and place(e) > min(tests)), key=place)
    if late:
        raise DatasetError(f"{source_name(late[0])} ({place(late[0])}) is after the first testing day {min(tests)}: "
                           "features and labels from after the test period would leak into training")


def check_dataset(entries: list[dict[str, Any]], keys: dict[str, RowHashes], where: str,
                  required: tuple[str, ...] = REQUIRED_ROLES) -> list[str]:
    """Every rule that spans the files of one dataset; returns the warnings (near misses) to log."""
    check_layout(entries, where, required)
    check_roles_apart(entries)
    check_training_before_testing(entries)
    names = {e["path"]: source_name(e) for e in entries}
    check_unique_ids({rel: k.ids for rel, k in keys.items()}, names, {rel: k.shown for rel, k in keys.items()})
    check_id_keys(keys, names)
    return check_not_resent({e["path"]: keys[e["path"]].rows for e in entries if e["path"] in keys}, names,
                     {e["path"]: e["rows"] for e in entries})
