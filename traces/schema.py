"""The workload table's schema (columns, defaults, bounds) and its error, without pandas: the core twin
checks a mapping of numpy columns against it (:func:`twin.requests.workload_columns`) without importing
the table machinery of :mod:`traces.workload`."""

from __future__ import annotations

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
#: columns a workload file must have (the others take :data:`FILE_DEFAULTS`)
REQUIRED_FILE_COLUMNS = ("arrival_s", "prompt_tokens", "output_tokens")
FILE_DEFAULTS = {**OPTIONAL_DEFAULTS, "adapter_id": -1}
#: smallest value of each column in a workload file
FILE_MINIMUM = {"request_id": 0, "arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1, "adapter_id": -1,
                "adapter_rank": 0, "conversation_id": -1, "turn": -1, "prefix_tokens": 0}
#: extensions of workload files
FILE_SUFFIXES = (".parquet", ".csv", ".jsonl")


class WorkloadError(ValueError):
    """A workload table that breaks the schema."""
