"""The workload table's schema (columns, defaults, bounds) and its error, without pandas: the core twin
checks a mapping of numpy columns against it (:func:`twin.requests.workload_columns`) without importing
the table machinery of :mod:`traces.workload`."""

from __future__ import annotations

import numpy as np

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
#: the token counts of one request (prompt, output, shared prefix) stay below 2**53, the bound of the workload
#: files' values (read through a float): far beyond any model's context (such a request is rejected for
#: max_model_len), and prompt + output, the engine's sums of them, can never overflow int64 (a prompt of 2**63 - 1
#: wrapped to a negative total and ran as a request that never finished). (The dataset loaders' own MAX_TOKENS,
#: 2**31 - 1, bounds an imported table's cells.)
MAX_REQUEST_TOKENS = 2**53 - 1
TOKEN_COLUMNS = ("prompt_tokens", "output_tokens", "prefix_tokens")
INT64_MAX = 2**63 - 1
#: the message for requests that name adapters without their ranks (a file without the column, a mapping or
#: Workload.from_arrays without adapter_rank)
NO_RANK_COLUMN = ("requests name adapters (column adapter_id) but {what} has no adapter_rank column; add each "
                  "adapter's LoRA rank (e.g. 8), or use adapter_id -1 for base-model requests")
#: extensions of workload files
FILE_SUFFIXES = (".parquet", ".csv", ".jsonl")


class WorkloadError(ValueError):
    """A workload table that breaks the schema."""


def too_large(col: str, values) -> str | None:
    """The problem of an integer column ``col`` holding a value above its bound (:data:`MAX_REQUEST_TOKENS` for the token
    counts, the int64 range for the others), checked before the column is cast to int64: a uint64 value of 2**63 or
    more wrapped silently (an adapter id of 2**64 - 1 became the base model's -1); None when every value is within.
    Vectorised: one ``max`` over the column (none for an int64 id column, which cannot exceed its range)."""
    v = np.asarray(values)
    if v.dtype.kind not in "iu" or not v.size:
        return None
    top = MAX_REQUEST_TOKENS if col in TOKEN_COLUMNS else INT64_MAX
    if int(np.iinfo(v.dtype).max) <= top or int(v.max()) <= top:
        return None
    row = int(np.argmax(v > top))
    if col in TOKEN_COLUMNS:
        return (f"workload column {col!r}: row {row} has {int(v[row])} tokens, above the {MAX_REQUEST_TOKENS} (2**53 - 1) a "
                f"request may have (prompt + output must not overflow); give token counts, e.g. 300")
    return (f"workload column {col!r}: row {row} has {int(v[row])}, beyond the int64 range (at most 2**63 - 1 = "
            f"{INT64_MAX}; an unsigned value this large would wrap to a negative one); give values below 2**63")
