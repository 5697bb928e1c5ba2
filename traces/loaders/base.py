"""What every loader returns (:class:`TraceTable`) and the shared validation helpers."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pandas as pd

#: Columns a loader may fill. ``arrival_s`` is NaN where the source has no timestamp;
#: ``prompt_tokens``/``output_tokens`` are absent for arrival-only traces (Azure Functions);
#: ``key`` is what adapters can be mapped from (a function, a model).
TABLE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens", "key", "conversation_id", "turn", "prefix_tokens")


class TraceFormatError(ValueError):
    """A trace file that does not have the schema of its format."""


@dataclass
class TraceTable:
    """A loaded trace before adapters are assigned: one row per request.

    ``meta`` records the format, the path, the rows read/dropped and, for text datasets, the
    tokenizer used.
    """

    df: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def has_timestamps(self) -> bool:
        return "arrival_s" in self.df and bool(self.df["arrival_s"].notna().any())

    @property
    def has_lengths(self) -> bool:
        return "prompt_tokens" in self.df and "output_tokens" in self.df

    def __len__(self) -> int:
        return len(self.df)


def require_columns(columns: Iterable[str], required: Iterable[str], path: str | Path, fmt: str,
                    schema_hint: str = "") -> None:
    """Raise :class:`TraceFormatError` naming the file, the missing and the found columns."""
    cols = list(columns)
    missing = [c for c in required if c not in cols]
    if missing:
        article = "an" if fmt[:1].lower() in "aeiou" else "a"  # ("not a arena file")
        raise TraceFormatError(f"{path}: not {article} {fmt} file: missing columns {missing} (found {cols[:12]}"
                               f"{'...' if len(cols) > 12 else ''}); expected schema: "
                               f"{schema_hint or ', '.join(required)}")


#: the largest token count a trace row may give (a prompt or output beyond it is a corrupt cell, not a request)
MAX_TOKENS = 2**31 - 1
#: most requests a loaded trace may expand to (the Azure Functions 2019 per-minute counts): the cap of
#: :data:`traces.registry.MAX_REQUESTS` on generated workloads, kept here because the registry imports the
#: loaders (a test holds the two equal)
MAX_REQUESTS = 5_000_000


def bad_row(bad: np.ndarray, values: pd.Series) -> str:
    """The first flagged row as the file counts it (data rows from 1, the header not counted) and its cell."""
    i = int(np.flatnonzero(bad)[0])
    cell = values.iloc[i]
    if cell is None or (isinstance(cell, float) and cell != cell):
        return f"data row {i + 1} (empty)"
    return f"data row {i + 1} ({cell!r})" if isinstance(cell, str) else f"data row {i + 1} ({cell})"


#: the magnitudes at which a numeric timestamp is read as an epoch in a finer unit than seconds: at or above
#: ``1e11`` a value is not a plausible number of seconds (1e11 s is 3,170 years: as an epoch, past 5000 AD), while
#: epochs of today are ~1.7e9 s = ~1.7e12 ms = ~1.7e15 us = ~1.7e18 ns; each band spans three orders of magnitude
#: (ms: 1e11 ms = 1973 to 1e14 ms = 5138 AD), so every epoch since 1973 falls in exactly one. This loader's rule, not
#: a standard one: numbers of seconds below 1e11 (since the epoch or since a trace's start) read as before, and a
#: column that fits no single band is refused rather than guessed (:func:`epoch_unit`)
EPOCH_UNITS: tuple[tuple[float, str, float], ...] = ((1e17, "ns", 1e-9), (1e14, "us", 1e-6), (1e11, "ms", 1e-3))
#: below this every numeric timestamp is read as seconds (an epoch in seconds, or seconds from any origin)
EPOCH_SECONDS_MAX = 1e11


def bool_cells(values: pd.Series) -> np.ndarray:
    """True where a cell is a boolean (a CSV column whose cells are all ``true``/``false`` is read as booleans,
    which numpy then counts as 1 and 0: a one-row ``ContextTokens=true`` became 1 token)."""
    if pd.api.types.is_bool_dtype(values):
        return np.ones(len(values), bool)
    if values.dtype == object:
        return values.map(lambda v: isinstance(v, (bool, np.bool_))).to_numpy(bool)
    return np.zeros(len(values), bool)


def refuse_bool_cells(values: pd.Series, path: str | Path, column: str, what: str) -> None:
    """:class:`TraceFormatError` naming the first boolean cell of ``values`` (see :func:`bool_cells`)."""
    bad = bool_cells(values)
    if bad.any():
        raise TraceFormatError(f"{path}: column {column!r} holds true/false at {bad_row(bad, values)}, not {what}; "
                               f"fix or drop the row")


def epoch_unit(t: np.ndarray, path: str | Path, column: str) -> tuple[str, float]:
    """``(unit, seconds per unit)`` of finite numeric timestamps ``t``, by magnitude (:data:`EPOCH_UNITS`):
    seconds when every value is below :data:`EPOCH_SECONDS_MAX`, else the one band of ms, us or ns that holds
    them all. A column that spans bands (a value below 1e11 with one above, or an epoch in ms with one in us)
    has no one unit and is refused naming the rows (it was read as seconds: epoch milliseconds gave arrivals
    1000 s apart for requests 1 s apart, without a word)."""
    if not len(t) or float(np.max(t)) < EPOCH_SECONDS_MAX:
        return "s", 1.0
    lo = float(np.min(t))
    for floor, unit, scale in EPOCH_UNITS:
        if lo >= floor:
            ceiling = floor * 1000.0
            if unit == "ns" or float(np.max(t)) < ceiling:
                return unit, scale
            break
    values = pd.Series(t)
    small, big = int(np.argmin(t)), int(np.argmax(t))
    raise TraceFormatError(f"{path}: column {column!r} mixes timestamp magnitudes, {bad_row(t == t[small], values)} "
                           f"and {bad_row(t == t[big], values)}: numbers below {EPOCH_SECONDS_MAX:.0e} are read as "
                           f"seconds, and epochs at or above it as milliseconds (1e11..1e14), microseconds "
                           f"(1e14..1e17) or nanoseconds (>= 1e17), one unit for the whole column; give every timestamp "
                           f"in one unit (or as date-times)")


def read_timestamps(values: pd.Series, path: str | Path, column: str) -> tuple[np.ndarray, str]:
    """``(seconds since the earliest timestamp, unit read)``: ``unit`` is ``datetime`` for date-times and ISO
    strings, else the unit of the epoch numbers by their magnitude (:func:`epoch_unit`: ``s`` below 1e11,
    ``ms``, ``us`` or ``ns`` above). A missing, unparsable, non-finite or true/false timestamp is refused naming
    its row (a missing one used to turn every arrival into NaN, and the trace was then re-timed with synthetic
    Poisson arrivals without a word)."""
    s = values
    fix = "fix or drop the row"
    refuse_bool_cells(s, path, column, "a timestamp")
    if pd.api.types.is_numeric_dtype(s):
        t = s.to_numpy(dtype=float)
    else:
        try:
            dt = pd.to_datetime(s, format="ISO8601", utc=True)
        except (ValueError, TypeError):
            try:
                dt = pd.to_datetime(s, format="mixed", utc=True)
            except (ValueError, TypeError) as e:
                raise TraceFormatError(f"{path}: column {column!r} has timestamps that cannot be parsed: {e}") from e
        if dt.isna().any():
            raise TraceFormatError(f"{path}: column {column!r} has a missing timestamp at "
                                   f"{bad_row(dt.isna().to_numpy(), s)}; {fix}")
        t = (dt - dt.min()).dt.total_seconds().to_numpy(dtype=float) if len(dt) else np.zeros(0)
        return t, "datetime"
    if len(t) and not np.isfinite(t).all():
        raise TraceFormatError(f"{path}: column {column!r} has a missing or non-finite timestamp at "
                               f"{bad_row(~np.isfinite(t), s)}; {fix}")
    unit, scale = epoch_unit(t, path, column)
    if not len(t):
        return t, unit
    if pd.api.types.is_integer_dtype(s):  # (whole epochs: the offsets in integers, exact also for ns epochs)
        i = s.to_numpy(dtype=np.int64)
        return (i - i.min()).astype(float) * scale, unit
    return (t - t.min()) * scale, unit


def seconds_from_timestamps(values: pd.Series, path: str | Path, column: str) -> np.ndarray:
    """Seconds since the earliest timestamp (:func:`read_timestamps` without the unit). Accepts datetimes, ISO
    strings or epoch numbers: seconds below 1e11, milliseconds, microseconds or nanoseconds above, by magnitude
    (:data:`EPOCH_UNITS`)."""
    return read_timestamps(values, path, column)[0]


def check_header(path: str | Path, read: Iterable[str], fmt: str) -> None:
    """Refuse a CSV whose header names a column the loader reads more than once (after stripping spaces, as
    the loaders do): pandas renames the second ``TIMESTAMP`` to ``TIMESTAMP.1`` and the loader read the first
    alone, silently; ``read`` are the columns the loader reads. Reads the header line only."""
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as fh:
        header = next(csv.reader(fh), [])
    names = [c.strip() for c in header]
    wanted = set(read)
    seen: dict[str, list[int]] = {}
    for i, c in enumerate(names):
        if c in wanted:
            seen.setdefault(c, []).append(i + 1)
    dup = {c: at for c, at in seen.items() if len(at) > 1}
    if dup:
        c, at = next(iter(dup.items()))
        more = f" (and {len(dup) - 1} more repeated column(s))" if len(dup) > 1 else ""
        raise TraceFormatError(f"{path}: column {c!r} appears {len(at)} times in the header (columns "
                               f"{', '.join(map(str, at))}){more}; {'an' if fmt[:1].lower() in 'aeiou' else 'a'} "
                               f"{fmt} file has one of each, and which one holds the data cannot be told: remove or "
                               f"rename the extra column(s)")


def float_column(df: pd.DataFrame, column: str, path: str | Path, what: str) -> np.ndarray:
    """A column of numbers as floats, with a clear error naming the first row that is text, missing or
    true/false (``what`` says what the column holds, e.g. ``seconds``); range checks are the caller's."""
    raw = df[column]
    refuse_bool_cells(raw, path, column, what)
    v = pd.to_numeric(raw, errors="coerce")
    if v.isna().any():
        raise TraceFormatError(f"{path}: column {column!r} has a missing or non-numeric value at "
                               f"{bad_row(v.isna().to_numpy(), raw)} (expected {what}); fix or drop the row")
    return v.to_numpy(dtype=float)


def int_column(df: pd.DataFrame, column: str, path: str | Path) -> np.ndarray:
    """A column of whole token counts in [0, :data:`MAX_TOKENS`], with a clear error naming the first row
    that is text, missing, true/false, negative, fractional, infinite or too large (a fractional count was
    truncated, ``1e30`` or ``inf`` became 1 token, and a one-row ``true`` 1 token)."""
    raw = df[column]
    refuse_bool_cells(raw, path, column, "a token count")
    v = pd.to_numeric(raw, errors="coerce")
    if v.isna().any():
        raise TraceFormatError(f"{path}: column {column!r} has a missing or non-numeric value at "
                               f"{bad_row(v.isna().to_numpy(), raw)}")
    a = v.to_numpy(dtype=float)
    bad = ~np.isfinite(a) | (a < 0) | (a > MAX_TOKENS) | (a != np.floor(a))
    if bad.any():
        raise TraceFormatError(f"{path}: column {column!r} has a value that is not a whole token count in 0.."
                               f"{MAX_TOKENS} at {bad_row(bad, raw)}; fix or drop the row")
    return a.astype(np.int64)
