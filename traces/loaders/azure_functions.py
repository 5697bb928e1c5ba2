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
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from traces.loaders.base import TraceFormatError, TraceTable, require_columns

FORMAT_2019 = "azure-functions-2019"
FORMAT_2021 = "azure-functions-2021"
ID_2019 = ("HashOwner", "HashApp", "HashFunction", "Trigger")
COLUMNS_2021 = ("app", "func", "end_timestamp", "duration")
SCHEMA_2019 = "HashOwner, HashApp, HashFunction, Trigger, 1, 2, ..., 1440 (invocations per minute)"
SCHEMA_2021 = "app, func, end_timestamp (s), duration (s)"
DAY_GLOB = "invocations_per_function_md.anon.d*.csv"


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
        df = pd.read_csv(f)
        require_columns(df.columns, ID_2019 + ("1", "1440"), f, "Azure Functions 2019 per-minute trace", SCHEMA_2019)
        minute_cols = [str(m) for m in range(1, 1441)]
        missing = [c for c in minute_cols if c not in df.columns]
        if missing:
            raise TraceFormatError(f"{f}: Azure Functions 2019 trace lacks minute columns {missing[:5]}...; "
                                   f"expected schema: {SCHEMA_2019}")
        key = df["HashOwner"].astype(str) + "/" + df["HashApp"].astype(str) + "/" + df["HashFunction"].astype(str)
        block = df[minute_cols]
        if not all(pd.api.types.is_numeric_dtype(dt) for dt in block.dtypes):
            block = block.apply(pd.to_numeric, errors="coerce")
        counts = block.fillna(0).to_numpy(np.int64)
        frames.append(pd.DataFrame(counts, index=key, columns=np.arange(d * 1440, (d + 1) * 1440)))
    wide = pd.concat(frames, axis=1).fillna(0).astype(np.int64)
    wide = wide.groupby(level=0).sum()  # a function may appear on several days / rows
    total_min = wide.shape[1]
    end_min = total_min if end_min is None else min(end_min, total_min)
    if not 0 <= start_min < end_min:
        raise ValueError(f"minute window [{start_min}, {end_min}) is empty (the trace has {total_min} minutes)")
    win = wide.iloc[:, start_min:end_min]
    tot = win.sum(axis=1).to_numpy()
    order = np.lexsort((np.arange(len(tot)), -tot))[:n_functions]
    order = order[tot[order] > 0]
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
    """Invocations of the ``n_functions`` most-invoked functions; arrival = end - duration."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Azure Functions 2021 trace {path} does not exist")
    df = pd.read_csv(path)
    df.columns = [c.strip() for c in df.columns]
    require_columns(df.columns, COLUMNS_2021, path, "Azure Functions 2021 invocation trace", SCHEMA_2021)
    end = pd.to_numeric(df["end_timestamp"], errors="coerce")
    dur = pd.to_numeric(df["duration"], errors="coerce")
    if end.isna().any() or dur.isna().any():
        raise TraceFormatError(f"{path}: non-numeric end_timestamp/duration values (expected seconds)")
    start = (end - dur).to_numpy(float)
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
