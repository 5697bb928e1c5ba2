"""BurstGPT (Wang et al., 2024): ChatGPT/GPT-4 request logs of an Azure OpenAI service.

CSV schema (``BurstGPT_1.csv`` ...)::

    Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
    5,ChatGPT,472,18,490,Conversation log

``Timestamp`` is seconds from the start of the trace. Rows with ``Response tokens == 0`` are
failed requests and are dropped (``keep_failed=True`` keeps them with 1 output token); the
count is in ``meta['failed']``. ``Model`` becomes the ``key`` adapters can be mapped from;
``log_type`` keeps only ``"Conversation log"`` or ``"API log"`` rows when given.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from traces.loaders.base import TraceFormatError, TraceTable, bad_row, int_column, require_columns

FORMAT = "burstgpt"
COLUMNS = ("Timestamp", "Model", "Request tokens", "Response tokens")
SCHEMA = "Timestamp (s), Model, Request tokens, Response tokens, Total tokens, Log Type"


def load_burstgpt(path: str | Path, keep_failed: bool = False, log_type: str | None = None) -> TraceTable:
    """Load a BurstGPT CSV."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"BurstGPT trace {path} does not exist")
    df = pd.read_csv(path)
    df.columns = [c.strip() for c in df.columns]
    require_columns(df.columns, COLUMNS, path, "BurstGPT trace", SCHEMA)
    rows = len(df)
    if log_type is not None:
        if "Log Type" not in df.columns:
            require_columns(df.columns, COLUMNS + ("Log Type",), path, "BurstGPT trace", SCHEMA)
        df = df[df["Log Type"].astype(str).str.strip().str.lower() == log_type.strip().lower()]
    t = pd.to_numeric(df["Timestamp"], errors="coerce").to_numpy(float)
    if not np.isfinite(t).all():  # (an infinite one made every arrival NaN: the trace was then re-timed silently)
        raise TraceFormatError(f"{path}: column 'Timestamp' must be finite seconds (numbers); "
                               f"{bad_row(~np.isfinite(t), df['Timestamp'])} is not; fix or drop the row")
    p = int_column(df, "Request tokens", path)
    o = int_column(df, "Response tokens", path)
    failed = o == 0
    keep = np.ones(len(df), bool) if keep_failed else ~failed
    out = pd.DataFrame({"arrival_s": t[keep] - (t[keep].min() if keep.any() else 0.0),
                        "prompt_tokens": np.maximum(p[keep], 1), "output_tokens": np.maximum(o[keep], 1),
                        "key": df["Model"].astype(str).to_numpy()[keep]})
    out = out.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    meta = {"format": FORMAT, "path": str(path), "rows": int(rows), "failed": int(failed.sum()),
            "kept_failed": keep_failed, "log_type": log_type}
    return TraceTable(out, meta)
