"""Azure LLM inference traces (Splitwise, Patel et al., ISCA 2024).

2023 (``AzureLLMInferenceTrace_{conv,code}.csv``, one hour on 2023-11-16) and 2024
(``AzureLLMInferenceTrace_{conv,code}_1week.csv``, one week) share one schema::

    TIMESTAMP,ContextTokens,GeneratedTokens
    2023-11-16 18:15:46.6805900,374,44

``arrival_s`` is seconds since the first request; ``ContextTokens`` -> ``prompt_tokens``,
``GeneratedTokens`` -> ``output_tokens``. Token counts of 0 (a few rows of the 2024 traces)
are raised to 1 (the workload needs >= 1) and counted in ``meta['clipped_to_1']``.

``TIMESTAMP`` may also be epoch numbers (another tool's export): seconds below 1e11, milliseconds,
microseconds or nanoseconds above, by magnitude (:func:`traces.loaders.base.epoch_unit`); the unit read is
``meta['timestamp_unit']`` (``datetime`` for the published files). A column named twice in the header, a
true/false cell and a column that mixes epoch units are refused naming the column or row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from traces.loaders.base import TraceTable, check_header, int_column, read_timestamps, require_columns

FORMAT = "azure-llm"
COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
SCHEMA = "TIMESTAMP (datetime), ContextTokens (int), GeneratedTokens (int)"


def load_azure_llm(path: str | Path) -> TraceTable:
    """Load an Azure LLM inference trace (2023 or 2024 schema)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"Azure LLM trace {path} does not exist")
    check_header(path, COLUMNS, "Azure LLM inference trace")
    df = pd.read_csv(path)
    df.columns = [c.strip() for c in df.columns]
    require_columns(df.columns, COLUMNS, path, "Azure LLM inference trace", SCHEMA)
    t, unit = read_timestamps(df["TIMESTAMP"], path, "TIMESTAMP")
    p = int_column(df, "ContextTokens", path)
    o = int_column(df, "GeneratedTokens", path)
    clipped = int(((p < 1) | (o < 1)).sum())
    out = pd.DataFrame({"arrival_s": t, "prompt_tokens": np.maximum(p, 1), "output_tokens": np.maximum(o, 1)})
    out = out.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    return TraceTable(out, {"format": FORMAT, "path": str(path), "rows": int(len(df)), "clipped_to_1": clipped,
                            "timestamp_unit": unit})
