"""Azure Functions invocation traces, used as arrival processes (no lengths).

* 2019 (Shahrad et al., ATC 2020; ``azurefunctions-dataset2019``): per-minute invocation
  counts, one file per day ``invocations_per_function_md.anon.dNN.csv``::

      HashOwner,HashApp,HashFunction,Trigger,1,2,...,1440

  A path may be one day's file or the directory of day files (concatenated in day order,
  ``days`` limits how many). Within a minute the ``c`` invocations of a function are placed
  uniformly at random (the per-minute counts are all the trace says).
* 2021 (Zhang et al., SOSP 2021; ``AzureFunctionsInvocationTraceForTwoWeeksJan2021.txt``),
  one row per invocation::

      app,func,end_timestamp,duration

  with the arrival at ``end_timestamp - duration`` (seconds).

Only the ``n_functions`` most-invoked functions are kept, as keys (``owner/app/function`` or
``app/func``) that the registry maps to adapters 0..n-1, the most invoked first -- FastLibra's
use of these traces for tasks without timestamps.

Bad input is refused before anything is drawn, naming the file, the row and the column: a 2019
minute cell that is not a whole count >= 0 (text, empty, fractional, negative, infinite; they were
read as 0 or truncated, silently), a 2021 ``end_timestamp`` or ``duration`` that is missing or not
finite, or a negative ``duration`` (an ``inf`` end re-timed the whole trace as Poisson; a negative
duration put the arrival after the end), and a column the loader reads named twice in the header.
A 2019 selection holding more invocations than a run may generate
(:data:`traces.loaders.base.MAX_REQUESTS`, the cap :func:`traces.registry.check_size` applies to
synthetic workloads) is refused before its arrivals are allocated.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from traces.loaders.base import (MAX_REQUESTS, TraceFormatError, TraceTable, bad_row, bool_cells, check_header,
                                 float_column, require_columns)

FORMAT_2019 = "azure-functions-2019"
FORMAT_2021 = "azure-functions-2021"
ID_2019 = ("HashOwner", "HashApp", "HashFunction", "Trigger")
COLUMNS_2021 = ("app", "func", "end_timestamp", "duration")
SCHEMA_2019 = "HashOwner, HashApp, HashFunction, Trigger, 1, 2, ..., 1440 (invocations per minute)"
SCHEMA_2021 = "app, func, end_timestamp (s), duration (s)"
DAY_GLOB = "invocations_per_function_md.anon.d*.csv"
MINUTE_COLUMNS = tuple(str(m) for m in range(1, 1441))


def _minute_counts(block: pd.DataFrame, keys: pd.Series, path: Path) -> np.ndarray:
    """The per-minute invocation counts of one day file as int64, refusing (naming the function, its data row
    and the minute column) a cell that is not a whole count in 0..MAX_REQUESTS: text, empty, true/false,
    fractional, negative or infinite (``abc`` and empty cells were read as 0 and 2.7 as 2, silently), or more
    invocations in one minute than a whole run may hold (a corrupt cell, which overflowed the allocation)."""
    cap = MAX_REQUESTS
    plain = [pd.api.types.is_numeric_dtype(t) and not pd.api.types.is_bool_dtype(t) for t in block.dtypes]
    numeric = block if all(plain) else block.apply(pd.to_numeric, errors="coerce")
    a = numeric.to_numpy(dtype=float)
    bad = np.zeros(a.shape, bool)
    for j in np.flatnonzero(~np.asarray(plain, bool)):  # (text or true/false columns: cells pandas did not read)
        bad[:, j] = bool_cells(block.iloc[:, j])
    with np.errstate(invalid="ignore"):
        bad |= ~np.isfinite(a) | (a < 0) | (a > cap) | (a != np.floor(a))
    if bad.any():
        i, j = (int(x) for x in np.argwhere(bad)[0])
        col = block.columns[j]
        cell = block.iat[i, j]
        shown = "an empty (or NA) cell" if cell is None or (isinstance(cell, float) and cell != cell) else repr(cell) \
            if isinstance(cell, str) else str(cell)
        why = f"more than the {cap:,} invocations a run may generate" if np.isfinite(a[i, j]) and a[i, j] > cap \
            else "not a whole invocation count >= 0"
        more = int(bad.sum()) - 1
        raise TraceFormatError(f"{path}: function {keys.iloc[i]} (data row {i + 1}), minute column {col!r}: {shown} "
                               f"is {why}{f' (and {more} more such cell(s))' if more else ''}; fix the cell or drop "
                               f"the row")
    return a.astype(np.int64)


def _day_files(path: Path, days: int | None) -> list[Path]:
    if path.is_dir():
        files = sorted(path.glob(DAY_GLOB), key=lambda p: int(re.sub(r"\D", "", p.name.split(".d")[-1]) or 0))
        if not files:
            raise FileNotFoundError(f"no Azure Functions 2019 day files ({DAY_GLOB}) in {path}")
    elif path.exists():
        files = [path]
    else:
        raise FileNotFoundError(f"Azure Functions 2019 trace {path} does not exist")
    return files[:days] if days else files


def load_functions_2019(path: str | Path, n_functions: int = 100, rng: np.random.Generator | None = None,
                        days: int | None = 1, start_min: int = 0, end_min: int | None = None) -> TraceTable:
    """Arrivals of the ``n_functions`` most-invoked functions in minutes ``[start_min, end_min)``.

    Minutes count from the start of the first loaded day (1440 per day).
    """
    rng = rng if rng is not None else np.random.default_rng(0)
    path = Path(path)
    frames = []
    for d, f in enumerate(_day_files(path, days)):
        check_header(f, ID_2019 + MINUTE_COLUMNS, "Azure Functions 2019 per-minute trace")
        df = pd.read_csv(f)
        require_columns(df.columns, ID_2019 + ("1", "1440"), f, "Azure Functions 2019 per-minute trace", SCHEMA_2019)
        minute_cols = list(MINUTE_COLUMNS)
        missing = [c for c in minute_cols if c not in df.columns]
        if missing:
            raise TraceFormatError(f"{f}: Azure Functions 2019 trace lacks minute columns {missing[:5]}...; "
                                   f"expected schema: {SCHEMA_2019}")
        key = df["HashOwner"].astype(str) + "/" + df["HashApp"].astype(str) + "/" + df["HashFunction"].astype(str)
        counts = _minute_counts(df[minute_cols], key, f)
        frames.append(pd.DataFrame(counts, index=key, columns=np.arange(d * 1440, (d + 1) * 1440)))
    wide = pd.concat(frames, axis=1).fillna(0).astype(np.int64)  # (0: a function absent from a day's file)
    wide = wide.groupby(level=0).sum()  # a function may appear on several days / rows
    total_min = wide.shape[1]
    end_min = total_min if end_min is None else min(end_min, total_min)
    if not 0 <= start_min < end_min:
        raise ValueError(f"minute window [{start_min}, {end_min}) is empty (the trace has {total_min} minutes)")
    win = wide.iloc[:, start_min:end_min]
    tot = win.sum(axis=1).to_numpy()
    order = np.lexsort((np.arange(len(tot)), -tot))[:n_functions]
    order = order[tot[order] > 0]
    total, cap = int(tot[order].sum()), MAX_REQUESTS
    if total > cap:  # (before the arrivals are allocated: 1e12 invocations asked numpy for 7 TiB)
        per_min = total / (end_min - start_min)
        raise ValueError(f"{path}: the {len(order)} most-invoked functions hold {total:,} invocations in minutes "
                         f"[{start_min}, {end_min}), more than the {cap:,} a run may generate; narrow the minute "
                         f"window (start_min/end_min: at their {per_min:,.0f} invocations a minute about "
                         f"{max(int(cap // max(per_min, 1.0)), 1):,} minutes fit) or keep fewer functions "
                         f"(n_functions, --adapters)")
    counts = win.to_numpy()[order]  # (functions, minutes)
    keys = win.index.to_numpy()[order]
    fn_idx, minute = np.nonzero(counts)
    c = counts[fn_idx, minute]
    fn = np.repeat(fn_idx, c)
    t = (start_min + np.repeat(minute, c) + rng.random(int(c.sum()))) * 60.0
    o = np.argsort(t, kind="stable")
    out = pd.DataFrame({"arrival_s": t[o], "key": keys[fn[o]]})
    meta = {"format": FORMAT_2019, "path": str(path), "functions_in_trace": int(len(wide)),
            "functions_kept": int(len(order)), "minutes": [int(start_min), int(end_min)],
            "placement": "uniform within each minute"}
    return TraceTable(out, meta)


def load_functions_2021(path: str | Path, n_functions: int = 100) -> TraceTable:
    """Invocations of the ``n_functions`` most-invoked functions; arrival = end - duration.

    ``end_timestamp`` must be finite seconds and ``duration`` finite seconds >= 0 on every row (Zhang et al.'s
    schema: an invocation ends ``duration`` seconds after it starts); a row that breaks this is refused naming
    it, before anything is kept."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Azure Functions 2021 trace {path} does not exist")
    check_header(path, COLUMNS_2021, "Azure Functions 2021 invocation trace")
    df = pd.read_csv(path)
    df.columns = [c.strip() for c in df.columns]
    require_columns(df.columns, COLUMNS_2021, path, "Azure Functions 2021 invocation trace", SCHEMA_2021)
    end = float_column(df, "end_timestamp", path, "seconds")
    dur = float_column(df, "duration", path, "seconds")
    if not np.isfinite(end).all():  # (an inf end made that arrival inf: the registry re-timed the trace as Poisson)
        raise TraceFormatError(f"{path}: column 'end_timestamp' must be finite seconds; "
                               f"{bad_row(~np.isfinite(end), df['end_timestamp'])} is not; fix or drop the row")
    bad = ~np.isfinite(dur) | (dur < 0)
    if bad.any():  # (a negative duration put the arrival after the invocation's end)
        raise TraceFormatError(f"{path}: column 'duration' must be finite seconds >= 0 (the invocation's run time; "
                               f"its arrival is end_timestamp - duration); {bad_row(bad, df['duration'])} is not; "
                               f"fix or drop the row")
    start = end - dur
    key = (df["app"].astype(str) + "/" + df["func"].astype(str)).to_numpy()
    uniq, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
    top = np.lexsort((np.arange(uniq.size), -cnt))[:n_functions]
    keep = np.isin(inv.ravel(), top)
    t = start[keep]
    out = pd.DataFrame({"arrival_s": t - t.min() if t.size else t, "key": key[keep]})
    out = out.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    meta = {"format": FORMAT_2021, "path": str(path), "rows": int(len(df)), "functions_in_trace": int(uniq.size),
            "functions_kept": int(top.size), "arrival": "end_timestamp - duration"}
    return TraceTable(out, meta)
