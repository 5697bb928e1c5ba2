"""The workload table: one schema for every trace, synthetic or real.

Columns (one row per request, sorted by ``arrival_s``):

=================  =======  ==================================================
column             dtype    meaning
=================  =======  ==================================================
``request_id``     int64    unique id
``arrival_s``      float64  arrival time, seconds from the start of the run
``prompt_tokens``  int64    input length (tokens), >= 1
``output_tokens``  int64    output length (tokens), >= 1
``adapter_id``     int64    LoRA adapter index (``-1``: base model, no adapter)
``adapter_rank``   int64    rank of that adapter (0 for the base model)
``conversation_id`` int64   conversation, ``-1`` when not part of one
``turn``           int64    turn in the conversation (0-based, ``-1`` if none)
``prefix_tokens``  int64    prompt tokens shared with the previous turn (0 if none)
=================  =======  ==================================================

Saved as Parquet with the generation parameters (source, seed, options) in the file's
key-value metadata under ``lora_twin``, so any run can be regenerated.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

COLUMNS: dict[str, str] = {
    "request_id": "int64",
    "arrival_s": "float64",
    "prompt_tokens": "int64",
    "output_tokens": "int64",
    "adapter_id": "int64",
    "adapter_rank": "int64",
    "conversation_id": "int64",
    "turn": "int64",
    "prefix_tokens": "int64",
}
OPTIONAL_DEFAULTS = {"conversation_id": -1, "turn": -1, "prefix_tokens": 0, "adapter_rank": 0}
META_KEY = b"lora_twin"


class WorkloadError(ValueError):
    """A workload table that breaks the schema."""


@dataclass
class Workload:
    """A validated workload table plus the parameters that generated it."""

    df: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.df = validate(self.df)

    def __len__(self) -> int:
        return len(self.df)

    @classmethod
    def from_arrays(cls, arrival_s, prompt_tokens, output_tokens, adapter_id=None, adapter_rank=None,
                    meta: dict[str, Any] | None = None, **optional) -> "Workload":
        n = len(arrival_s)
        data = {
            "request_id": np.arange(n, dtype=np.int64),
            "arrival_s": np.asarray(arrival_s, dtype=np.float64),
            "prompt_tokens": np.asarray(prompt_tokens, dtype=np.int64),
            "output_tokens": np.asarray(output_tokens, dtype=np.int64),
            "adapter_id": np.full(n, -1, np.int64) if adapter_id is None else np.asarray(adapter_id, np.int64),
            "adapter_rank": np.zeros(n, np.int64) if adapter_rank is None else np.asarray(adapter_rank, np.int64),
        }
        for k, v in optional.items():
            data[k] = np.asarray(v, dtype=np.int64)
        return cls(pd.DataFrame(data), dict(meta or {}))

    @property
    def duration_s(self) -> float:
        return float(self.df["arrival_s"].iloc[-1]) if len(self.df) else 0.0

    def adapters(self) -> pd.DataFrame:
        """One row per adapter: id, rank, request count."""
        d = self.df[self.df["adapter_id"] >= 0]
        return (d.groupby("adapter_id").agg(adapter_rank=("adapter_rank", "first"), requests=("request_id", "size"))
                .reset_index())

    def save(self, path: str | Path) -> Path:
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = Path(path)
        table = pa.Table.from_pandas(self.df, preserve_index=False)
        md = dict(table.schema.metadata or {})
        md[META_KEY] = json.dumps(self.meta, default=str).encode()
        pq.write_table(table.replace_schema_metadata(md), path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> "Workload":
        import pyarrow.parquet as pq

        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"workload file {path} does not exist")
        table = pq.read_table(path)
        md = table.schema.metadata or {}
        meta = json.loads(md[META_KEY]) if META_KEY in md else {}
        return cls(table.to_pandas(), meta)


def validate(df: pd.DataFrame) -> pd.DataFrame:
    """Check and normalise a workload table; raise :class:`WorkloadError` naming the problem."""
    df = df.copy()
    for col, default in OPTIONAL_DEFAULTS.items():
        if col not in df.columns:
            df[col] = default
    if "request_id" not in df.columns:
        df["request_id"] = np.arange(len(df), dtype=np.int64)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise WorkloadError(f"workload table lacks columns {missing}; required: {list(COLUMNS)}")
    for col, dtype in COLUMNS.items():
        if df[col].isna().any():
            if col in OPTIONAL_DEFAULTS:
                df[col] = df[col].fillna(OPTIONAL_DEFAULTS[col])
            else:
                bad = int(df[col].isna().idxmax())
                raise WorkloadError(f"workload column {col!r} has missing values (first at row {bad})")
        try:
            df[col] = df[col].astype(dtype)
        except (TypeError, ValueError) as e:
            raise WorkloadError(f"workload column {col!r} cannot be read as {dtype}: {e}") from e
    if len(df):
        if not np.isfinite(df["arrival_s"].to_numpy()).all() or (df["arrival_s"] < 0).any():
            raise WorkloadError("workload column 'arrival_s' must be finite and >= 0")
        for col in ("prompt_tokens", "output_tokens"):
            if (df[col] < 1).any():
                row = int((df[col] < 1).to_numpy().argmax())
                raise WorkloadError(f"workload column {col!r} must be >= 1 (row {row} has {df[col].iloc[row]})")
        if df["request_id"].duplicated().any():
            raise WorkloadError("workload column 'request_id' has duplicates")
        if ((df["adapter_id"] >= 0) & (df["adapter_rank"] <= 0)).any():
            raise WorkloadError("requests with an adapter (adapter_id >= 0) need adapter_rank >= 1")
        ranks = df[df["adapter_id"] >= 0].groupby("adapter_id")["adapter_rank"].nunique()
        if (ranks > 1).any():
            raise WorkloadError(f"adapter {int(ranks.idxmax())} appears with more than one rank")
    df = df.sort_values(["arrival_s", "request_id"], kind="stable").reset_index(drop=True)
    return df[list(COLUMNS)]
