"""BurstGPT (Wang et al., 2024): ChatGPT/GPT-4 request logs of an Azure OpenAI service.

CSV schema (``BurstGPT_1.csv`` ...)::

    Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
    5,ChatGPT,472,18,490,Conversation log

``Timestamp`` is seconds from the start of the trace. Rows with ``Response tokens == 0`` are
failed requests and are dropped (``keep_failed=True`` keeps them with 1 output token); the
count is in ``meta['failed']``. ``Model`` becomes the ``key`` adapters can be mapped from;
``log_type`` keeps only ``"Conversation log"`` or ``"API log"`` rows when given.

A file (or log type) whose every row is a failed request, a ``log_type`` no row has and a column
the loader reads named twice in the header are refused saying so and what to give instead (the
first two were reported as "the trace holds no requests (a header but no rows?)").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from traces.loaders.base import (TraceFormatError, TraceTable, bad_row, check_header, int_column, refuse_bool_cells,
                                 require_columns)

FORMAT = "burstgpt"
COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
SCHEMA = "Timestamp (s), Model, Request tokens, Response tokens, Total tokens, Log Type"


def load_burstgpt(path: str | Path, keep_failed: bool = False, log_type: str | None = None) -> TraceTable:
    """Load a BurstGPT CSV."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"BurstGPT trace {path} does not exist")
    check_header(path, COLUMNS + (("Log Type",) if log_type is not None else ()), "BurstGPT trace")
    df = pd.read_csv(path)
    df.columns = [c.strip() for c in df.columns]
    require_columns(df.columns, COLUMNS, path, "BurstGPT trace", SCHEMA)
    rows = len(df)
    if log_type is not None:
        if "Log Type" not in df.columns:
            require_columns(df.columns, COLUMNS + ("Log Type",), path, "BurstGPT trace", SCHEMA)
        types = df["Log Type"].astype(str).str.strip()
        df = df[types.str.lower() == log_type.strip().lower()]
        if rows and df.empty:
            found = sorted(set(types))
            raise TraceFormatError(f"{path}: no row has Log Type {log_type!r} (its {rows:,} rows have "
                                   f"{', '.join(repr(x) for x in found[:6])}{', ...' if len(found) > 6 else ''}); give "
                                   f"one of those as log_type, or leave log_type out")
    refuse_bool_cells(df["Timestamp"], path, "Timestamp", "seconds")
    t = pd.to_numeric(df["Timestamp"], errors="coerce").to_numpy(float)
    if not np.isfinite(t).all():  # (an infinite one made every arrival NaN: the trace was then re-timed silently)
        raise TraceFormatError(f"{path}: column 'Timestamp' must be finite seconds (numbers); "
                               f"{bad_row(~np.isfinite(t), df['Timestamp'])} is not; fix or drop the row")
    p = int_column(df, "Request tokens", path)
    o = int_column(df, "Response tokens", path)
    failed = o == 0
    keep = np.ones(len(df), bool) if keep_failed else ~failed
    if len(df) and not keep.any():  # (the registry said "a header but no rows?")
        of = f" of Log Type {log_type!r}" if log_type is not None else ""
        raise TraceFormatError(f"{path}: every one of its {len(df):,} rows{of} is a failed request (Response tokens "
                               f"0), and failed requests are dropped, so no request is left; give keep_failed=true "
                               f"(twin traces show/synth --keep-failed, twin run --trace-opt keep_failed=true) to "
                               f"replay them with 1 output token each, or a file that holds successful requests")
    out = pd.DataFrame({"arrival_s": t[keep] - (t[keep].min() if keep.any() else 0.0),
                        "prompt_tokens": np.maximum(p[keep], 1), "output_tokens": np.maximum(o[keep], 1),
                        "key": df["Model"].astype(str).to_numpy()[keep]})
    out = out.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    meta = {"format": FORMAT, "path": str(path), "rows": int(rows), "failed": int(failed.sum()),
            "kept_failed": keep_failed, "log_type": log_type}
    return TraceTable(out, meta)
