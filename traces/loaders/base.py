"""What every loader returns (:class:`TraceTable`) and the shared validation helpers."""

from __future__ import annotations

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


def bad_row(bad: np.ndarray, values: pd.Series) -> str:
    """The first flagged row as the file counts it (data rows from 1, the header not counted) and its cell."""
    i = int(np.flatnonzero(bad)[0])
    cell = values.iloc[i]
    if cell is None or (isinstance(cell, float) and cell != cell):
        return f"data row {i + 1} (empty)"
    return f"data row {i + 1} ({cell!r})" if isinstance(cell, str) else f"data row {i + 1} ({cell})"


def seconds_from_timestamps(values: pd.Series, path: str | Path, column: str) -> np.ndarray:
    """Seconds since the earliest timestamp. Accepts datetimes, ISO strings or epoch numbers. A missing,
    unparsable or non-finite one is refused naming its row (it used to turn every arrival into NaN, and the
    trace was then re-timed with synthetic Poisson arrivals without a word)."""
    s = values
    fix = "fix or drop the row"
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
        return t
    if len(t) and not np.isfinite(t).all():
        raise TraceFormatError(f"{path}: column {column!r} has a missing or non-finite timestamp at "
                               f"{bad_row(~np.isfinite(t), s)}; {fix}")
    return t - (t.min() if len(t) else 0.0)


def int_column(df: pd.DataFrame, column: str, path: str | Path) -> np.ndarray:
    """A column of whole token counts in [0, :data:`MAX_TOKENS`], with a clear error naming the first row
    that is text, missing, negative, fractional, infinite or too large (a fractional count was truncated and
    ``1e30`` or ``inf`` became 1 token)."""
    raw = df[column]
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
