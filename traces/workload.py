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

**Workload files** (:func:`read_workload_file`, ``twin run --trace FILE``): ``.parquet``,
``.csv`` (a header row of column names) or ``.jsonl`` (one JSON object per line), chosen by the
extension. ``arrival_s``, ``prompt_tokens`` and ``output_tokens`` are required; the other
columns are optional (``request_id``: the row order; ``adapter_id``: -1, the base model;
``adapter_rank``: 0; ``conversation_id``/``turn``: -1; ``prefix_tokens``: 0), an empty cell
or ``null`` takes the default, and a column outside the schema is refused. A bad value is
reported with its row (1-based, data rows; the file line is given too) and column: not a
number, not an integer, NaN/infinite, negative (``arrival_s`` >= 0, token counts >= 1,
``adapter_id``/``conversation_id``/``turn`` >= -1, ``adapter_rank``/``prefix_tokens`` >= 0); a rank on a
base-model request (``adapter_id`` -1), a column named twice and rows with more cells than the header
are refused too.
**Rows need not be sorted**: the table is sorted by ``arrival_s`` (ties by ``request_id``, which
defaults to the row order), as every workload is. A file with a header but no rows is refused ("holds
no requests").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces.arguments import RepeatedKey, csv_layout_problem, unique_keys_object
from traces.schema import (  # noqa: F401  (the schema, re-exported: traces.workload is its home for users)
    COLUMNS, FILE_DEFAULTS, FILE_MINIMUM, FILE_SUFFIXES, NO_RANK_COLUMN, OPTIONAL_DEFAULTS, REQUIRED_FILE_COLUMNS,
    TOKEN_COLUMNS, WorkloadError, too_large)

META_KEY = b"lora_twin"
#: columns of a twin run's per-request table (``requests.parquet`` of ``twin run --out``; ``twin.metrics.requests_frame``)
#: that no workload has: a file with them is named as such results
RUN_RESULT_MARKERS = frozenset({"outcome", "ttft_s", "e2e_s", "tokens_emitted"})


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
        unknown = sorted(set(optional) - set(OPTIONAL_DEFAULTS))
        if unknown:
            raise WorkloadError(f"Workload.from_arrays: unknown column(s) {unknown}; the optional columns are "
                                f"{sorted(set(OPTIONAL_DEFAULTS) - {'adapter_rank'})}")
        # (the columns as given: :func:`validate` casts them, refusing fractions instead of truncating)
        data = {
            "request_id": np.arange(n, dtype=np.int64),
            "arrival_s": np.asarray(arrival_s),
            "prompt_tokens": np.asarray(prompt_tokens),
            "output_tokens": np.asarray(output_tokens),
            "adapter_id": np.full(n, -1, np.int64) if adapter_id is None else np.asarray(adapter_id),
        }
        if adapter_rank is not None:  # (left out, :func:`validate` gives 0 and says so if a request names an adapter)
            data["adapter_rank"] = np.asarray(adapter_rank)
        for k, v in optional.items():
            data[k] = np.asarray(v)
        bad = {k: len(v) for k, v in data.items() if v.ndim != 1 or len(v) != n}
        if bad:
            raise WorkloadError(f"Workload.from_arrays: every column needs one value per request ({n} arrival "
                                f"times); got lengths {bad}")
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
        """A workload file (``.parquet``, ``.csv``, ``.jsonl``; see the module docstring)."""
        return read_workload_file(path)


def _read_parquet(path: Path) -> "Workload":
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError/... for a file that is not Parquet
        raise WorkloadError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0] if str(e) else e!r})"
                            ) from None
    md = table.schema.metadata or {}
    try:
        meta = json.loads(md[META_KEY]) if META_KEY in md else {}
    except (ValueError, UnicodeDecodeError):
        meta = {}
    df = table.to_pandas()
    if META_KEY in md and set(COLUMNS) == set(df.columns):  # (a column beyond them is refused, naming the file)
        _check_saved(df, path)
        try:
            return Workload(df, meta if isinstance(meta, dict) else {})
        except WorkloadError as e:
            raise WorkloadError(f"{path}: {e}") from None
    return Workload(_checked_frame(df.astype(object).where(df.notna(), None), path,
                                   lambda i: f"row {i + 1}"), meta if isinstance(meta, dict) else {})


def _check_saved(df: pd.DataFrame, path: Path) -> None:
    """A saved workload's columns (a Parquet file :meth:`Workload.save` wrote: typed columns, read without the
    cell-by-cell checks of the text files) hold what those checks require: numbers, not true/false; ids >= 0; a
    shared prefix below its prompt; no rank on a base-model request (these passed unchecked, and ran)."""
    for col in COLUMNS:
        if df[col].dtype == bool:
            raise WorkloadError(f"{path}: column {col} holds true/false values; give numbers")
    checks = (((df["request_id"] < 0), "request_id", "is not an id >= 0"),
              ((df["prefix_tokens"] >= df["prompt_tokens"]) & (df["prefix_tokens"] > 0), "prefix_tokens",
               "is not below prompt_tokens"),
              ((df["adapter_id"] < 0) & (df["adapter_rank"] > 0), "adapter_rank",
               "is a rank on a base-model request (adapter_id -1: no adapter); give 0 there, or the adapter's id"))
    for bad, col, what in checks:
        bad = bad.to_numpy()
        if bad.any():
            i = int(bad.argmax())
            raise WorkloadError(f"{path}: row {i + 1}, column {col}: {_show(df[col].iloc[i])} {what}")


def _read_csv(path: Path) -> pd.DataFrame:
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    except pd.errors.EmptyDataError:
        raise WorkloadError(f"{path}: the file is empty; a workload CSV has a header row ({', '.join(COLUMNS)}) "
                            f"and one row per request") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: not a text file (not UTF-8); give a CSV workload") from None
    except (pd.errors.ParserError, ValueError) as e:
        raise WorkloadError(f"{path}: not a readable CSV file ({str(e).strip().splitlines()[0]})") from None
    problem = csv_layout_problem(path)
    if problem:
        raise WorkloadError(f"{path}: {problem}")
    df.columns = [str(c).strip() for c in df.columns]
    return df


def _read_jsonl(path: Path) -> tuple[pd.DataFrame, list[int]]:
    records, lines = [], []
    try:
        text = path.read_bytes().decode("utf-8-sig")  # (a byte-order mark, as some editors write, is no data)
    except UnicodeDecodeError:
        raise WorkloadError(f"{path}: not a text file (not UTF-8); give a JSON Lines workload") from None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line, object_pairs_hook=unique_keys_object)
        except RepeatedKey as e:
            raise WorkloadError(f"{path}: line {n}: the key {e.key!r} is given twice; give each column once per "
                                f"object") from None
        except (json.JSONDecodeError, RecursionError) as e:
            csv_like = n == 1 and "," in line and not line.lstrip().startswith(("{", "["))
            hint = (f"; it reads like a CSV header: name the file {path.with_suffix('.csv').name}" if csv_like else
                    "; a JSON Lines workload has one object per line, e.g. "
                    '{"arrival_s": 0.5, "prompt_tokens": 300, "output_tokens": 40}')
            raise WorkloadError(f"{path}: line {n}: not valid JSON ({e.msg if hasattr(e, 'msg') else e}){hint}") \
                from None
        if not isinstance(rec, dict):
            raise WorkloadError(f"{path}: line {n}: expected a JSON object with the workload columns, got "
                                f"{type(rec).__name__}")
        records.append(rec)
        lines.append(n)
    if not records:
        raise WorkloadError(f"{path}: the file holds no requests (no JSON object); one object per line, e.g. "
                            f'{{"arrival_s": 0.5, "prompt_tokens": 300, "output_tokens": 40}}')
    cols = list(dict.fromkeys(k for rec in records for k in rec))
    # object columns keep null as None (an empty cell) and a missing key reads as one
    return pd.DataFrame({c: pd.Series([rec.get(c) for rec in records], dtype=object) for c in cols}), lines


def read_workload_file(path: str | Path) -> "Workload":
    """Read a workload file by its extension (``.parquet``, ``.csv``, ``.jsonl``); every problem
    is a :class:`WorkloadError` naming the file (and the row and column of a bad value)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"workload file {path} does not exist")
    if path.is_dir():
        raise WorkloadError(f"{path} is a directory; give a workload file ({', '.join(FILE_SUFFIXES)})")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _read_parquet(path)
    if suffix == ".csv":
        df = _read_csv(path)
        return Workload(_checked_frame(df, path, lambda i: f"row {i + 1} (line {i + 2})"),
                        {"source": str(path), "kind": "file", "format": "csv"})
    if suffix == ".jsonl":
        df, lines = _read_jsonl(path)
        return Workload(_checked_frame(df, path, lambda i: f"row {i + 1} (line {lines[i]})"),
                        {"source": str(path), "kind": "file", "format": "jsonl"})
    raise WorkloadError(f"{path}: unknown workload file type {suffix or '(no extension)'!r}; give "
                        f"{', '.join(FILE_SUFFIXES)}")


def _show(v: Any) -> str:
    """A cell as the file wrote it (numpy scalars as Python values, arrays as lists)."""
    if isinstance(v, np.ndarray):
        return repr(v.tolist())
    return repr(v.item() if hasattr(v, "item") else v)


def _checked_frame(df: pd.DataFrame, path: Path, where) -> pd.DataFrame:
    """The workload columns of a file's table (cells as text or JSON values), every value
    checked; ``where(i)`` names data row ``i`` (0-based) as the file does."""
    cols = [str(c) for c in df.columns]
    unknown = [c for c in cols if c not in COLUMNS]
    missing = [c for c in REQUIRED_FILE_COLUMNS if c not in cols]
    if missing:
        raise WorkloadError(f"{path}: missing column(s) {', '.join(missing)} (found {', '.join(cols[:12]) or 'none'}); "
                            f"a workload needs {', '.join(REQUIRED_FILE_COLUMNS)} and may have "
                            f"{', '.join(c for c in COLUMNS if c not in REQUIRED_FILE_COLUMNS)}")
    if unknown and RUN_RESULT_MARKERS <= set(unknown):  # (twin run --out's requests.parquet given as a trace)
        raise WorkloadError(f"{path}: a twin run's per-request results (columns {', '.join(sorted(RUN_RESULT_MARKERS))}"
                            f", ...), not a workload: it keeps no conversation or prefix columns, so it cannot stand "
                            f"for the run's workload; replay the run with its scenario, `twin run --config "
                            f"{path.parent / 'summary.json'}` (the summary.json beside it), or write a workload file "
                            f"with `twin traces synth --out FILE`")
    if unknown:
        raise WorkloadError(f"{path}: unknown column(s) {', '.join(unknown)}; the workload columns are "
                            f"{', '.join(COLUMNS)}")
    if len(df) == 0:
        raise WorkloadError(f"{path}: the file holds no requests (a header but no rows)")
    out = {}
    for col in COLUMNS:
        if col not in df.columns:
            continue
        cells = df[col]
        nested = cells.map(lambda v: isinstance(v, (list, tuple, dict, set, np.ndarray))).to_numpy(dtype=bool)
        if nested.any():  # (a Parquet list column: its cells are arrays, "[1]" read as the number 1)
            i = int(nested.argmax())
            raise WorkloadError(f"{path}: {where(i)}, column {col}: {_show(cells.iloc[i])} is a list, not a number; "
                                f"give one number per request")
        text = cells.map(lambda v: "" if v is None else (str(v).strip() if not isinstance(v, bool) else "bool"))
        empty = (text == "").to_numpy()
        nums = pd.to_numeric(text.where(~empty, "0"), errors="coerce").to_numpy(dtype=float, copy=True)  # (written below)
        bad = np.isnan(nums) & ~empty
        if bad.any():
            i = int(bad.argmax())
            raise WorkloadError(f"{path}: {where(i)}, column {col}: {_show(cells.iloc[i])} is not a number")
        if empty.any():
            if col in FILE_DEFAULTS:
                nums[empty] = FILE_DEFAULTS[col]
            elif col == "request_id":
                raise WorkloadError(f"{path}: {where(int(empty.argmax()))}, column request_id: empty; give every "
                                    f"request an id or drop the column")
            else:
                i = int(empty.argmax())
                raise WorkloadError(f"{path}: {where(i)}, column {col}: empty (the column is required)")
        inf = ~np.isfinite(nums)
        if inf.any():
            i = int(inf.argmax())
            raise WorkloadError(f"{path}: {where(i)}, column {col}: {_show(cells.iloc[i])} is not a finite number")
        if COLUMNS[col] == "int64":
            big = np.abs(nums) >= 2.0 ** 53  # (read through a float: 2**53 + 1 would become 2**53)
            if big.any():
                i = int(big.argmax())
                raise WorkloadError(f"{path}: {where(i)}, column {col}: {_show(cells.iloc[i])} is too large; the "
                                    f"values of {col} must be below 2**53 = 9007199254740992")
            frac = nums != np.floor(nums)
            if frac.any():
                i = int(frac.argmax())
                raise WorkloadError(f"{path}: {where(i)}, column {col}: {_show(cells.iloc[i])} is not an integer")
        low = nums < FILE_MINIMUM[col]
        if low.any():
            i = int(low.argmax())
            raise WorkloadError(f"{path}: {where(i)}, column {col}: {_show(cells.iloc[i])} is below the minimum "
                                f"{FILE_MINIMUM[col]}")
        out[col] = nums.astype(COLUMNS[col])
    frame = pd.DataFrame(out)
    rank_given = "adapter_rank" in frame
    for col, default in FILE_DEFAULTS.items():
        if col not in frame:
            frame[col] = np.full(len(frame), default, np.int64)
    if "prefix_tokens" in frame:
        over = (frame["prefix_tokens"] >= frame["prompt_tokens"]).to_numpy()
        if over.any():
            i = int(over.argmax())
            raise WorkloadError(f"{path}: {where(i)}, column prefix_tokens: {frame['prefix_tokens'].iloc[i]} is not "
                                f"below prompt_tokens ({frame['prompt_tokens'].iloc[i]})")
    if "request_id" in frame and frame["request_id"].duplicated().any():
        i = int(frame["request_id"].duplicated().to_numpy().argmax())
        raise WorkloadError(f"{path}: {where(i)}, column request_id: {frame['request_id'].iloc[i]} repeats an "
                            f"earlier id")
    has = (frame["adapter_id"] >= 0).to_numpy()
    rank = frame["adapter_rank"].to_numpy()
    norank = has & (rank < 1)
    if norank.any():
        i = int(norank.argmax())
        if not rank_given:
            raise WorkloadError(f"{path}: {NO_RANK_COLUMN.format(what='the file')}")
        raise WorkloadError(f"{path}: {where(i)}, column adapter_rank: a request for adapter "
                            f"{frame['adapter_id'].iloc[i]} needs adapter_rank >= 1")
    base_rank = ~has & (rank > 0)
    if base_rank.any():  # (the engine serves it without an adapter: the rank would be dropped)
        i = int(base_rank.argmax())
        raise WorkloadError(f"{path}: {where(i)}, column adapter_rank: {rank[i]} on a base-model request (adapter_id "
                            f"-1: no adapter); leave adapter_rank empty or 0 there, or give the adapter's id")
    first = pd.Series(rank[has]).groupby(frame["adapter_id"].to_numpy()[has]).transform("first").to_numpy()
    clash = np.flatnonzero(has)[first != rank[has]]
    if clash.size:
        i = int(clash[0])
        raise WorkloadError(f"{path}: {where(i)}, column adapter_rank: adapter {frame['adapter_id'].iloc[i]} "
                            f"has rank {rank[i]} here and {first[np.flatnonzero(has) == i][0]} earlier; one rank "
                            f"per adapter")
    _check_conversations(frame, path, where)
    return frame


def _check_conversations(frame: pd.DataFrame, path: Path, where) -> None:
    """A turn and a shared prefix belong to a conversation (``conversation_id`` >= 0), and a conversation's turns
    arrive in their order (a later turn's prefix is the history of the earlier ones: prefix-KV reuse reads them so).
    These were accepted and ran: a turn 5 before turn 0, turns and prefixes of no conversation."""
    conv = frame["conversation_id"].to_numpy()
    turn = frame["turn"].to_numpy()
    orphan = (conv < 0) & ((turn >= 0) | (frame["prefix_tokens"].to_numpy() > 0))
    if orphan.any():
        i = int(orphan.argmax())
        col = "turn" if turn[i] >= 0 else "prefix_tokens"
        raise WorkloadError(f"{path}: {where(i)}, column {col}: {frame[col].iloc[i]} on a request of no conversation "
                            f"(conversation_id -1); give its conversation_id, or leave {col} empty")
    inside = np.flatnonzero(conv >= 0)
    untold = inside[turn[inside] < 0]
    if untold.size:  # (a file with conversation_id but no turn column: "turn -1 ... after its turn -1")
        i = int(untold[0])
        raise WorkloadError(f"{path}: {where(i)}, column turn: a request of conversation {conv[i]} without its turn "
                            f"(no turn column, or an empty cell); give each turn of a conversation its number (0, 1, "
                            f"... in arrival order), or leave conversation_id out")
    if inside.size < 2:
        return
    rid = frame["request_id"].to_numpy() if "request_id" in frame else np.arange(len(frame))  # (the file's order)
    order = inside[np.lexsort((rid[inside], frame["arrival_s"].to_numpy()[inside], conv[inside]))]
    same = conv[order][1:] == conv[order][:-1]
    back = same & (turn[order][1:] <= turn[order][:-1])
    if back.any():
        k = int(back.argmax())
        i, j = int(order[k + 1]), int(order[k])
        raise WorkloadError(f"{path}: {where(i)}, column turn: turn {turn[i]} of conversation {conv[i]} arrives at or "
                            f"after its turn {turn[j]} ({where(j)}); a conversation's turns arrive in their order, once "
                            f"each")


def validate(df: pd.DataFrame) -> pd.DataFrame:
    """Check and normalise a workload table; raise :class:`WorkloadError` naming the problem. A column
    outside :data:`COLUMNS` is refused, as the file readers and :meth:`Workload.from_arrays` refuse one
    (dropped silently, a misspelt ``prefix_token`` column would leave every turn without its shared prefix)."""
    if not isinstance(df, pd.DataFrame):
        raise WorkloadError(f"a workload table is a pandas DataFrame, got {type(df).__name__}; build one with "
                            f"Workload.from_arrays(arrival_s, prompt_tokens, output_tokens, ...) or pd.DataFrame(...)")
    unknown = [str(c) for c in df.columns if c not in COLUMNS]
    if unknown:  # (as the file readers and Workload.from_arrays refuse them: a misspelt column would be lost)
        raise WorkloadError(f"workload table: unknown column(s) {', '.join(unknown)}; the workload columns are "
                            f"{', '.join(COLUMNS)}; rename a misspelt one, or drop the others first "
                            f"(df.drop(columns={unknown!r}))")
    df = df.copy()
    rank_given = "adapter_rank" in df.columns
    for col, default in FILE_DEFAULTS.items():  # (adapter_id: -1, the base model, as in a file)
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
        if dtype == "int64" and df[col].dtype.kind == "f":  # a float column: only whole numbers (no truncation)
            v = df[col].to_numpy()
            frac = ~np.isfinite(v) | (v != np.floor(v)) | (np.abs(v) > 2.0 ** 53)
            if frac.any():
                row = int(frac.argmax())
                raise WorkloadError(f"workload column {col!r} holds integers; row {row} has {float(v[row])!r}")
        if dtype == "int64" and df[col].dtype.kind == "u":  # (before the cast: >= 2**63 would wrap to a negative)
            problem = too_large(col, df[col].to_numpy())
            if problem:
                raise WorkloadError(problem)
        try:
            df[col] = df[col].astype(dtype)
        except (TypeError, ValueError, OverflowError) as e:
            raise WorkloadError(f"workload column {col!r} cannot be read as {dtype}: {e}") from e
        if col in TOKEN_COLUMNS:  # (prompt + output must not overflow int64: a prompt of 2**63 - 1 never finished)
            problem = too_large(col, df[col].to_numpy())
            if problem:
                raise WorkloadError(problem)
    if len(df):
        if not np.isfinite(df["arrival_s"].to_numpy()).all() or (df["arrival_s"] < 0).any():
            raise WorkloadError("workload column 'arrival_s' must be finite and >= 0")
        for col in ("prompt_tokens", "output_tokens", "adapter_id", "adapter_rank", "conversation_id", "turn",
                    "prefix_tokens"):
            low = (df[col] < FILE_MINIMUM[col]).to_numpy()
            if low.any():
                row = int(low.argmax())
                raise WorkloadError(f"workload column {col!r} must be >= {FILE_MINIMUM[col]} (row {row} has "
                                    f"{df[col].iloc[row]})")
        if df["request_id"].duplicated().any():
            raise WorkloadError("workload column 'request_id' has duplicates")
        if not rank_given and (df["adapter_id"] >= 0).any():
            raise WorkloadError(NO_RANK_COLUMN.format(what="the workload"))
        if ((df["adapter_id"] >= 0) & (df["adapter_rank"] <= 0)).any():
            raise WorkloadError("requests with an adapter (adapter_id >= 0) need adapter_rank >= 1")
        ranks = df[df["adapter_id"] >= 0].groupby("adapter_id")["adapter_rank"].nunique()
        if (ranks > 1).any():
            raise WorkloadError(f"adapter {int(ranks.idxmax())} appears with more than one rank")
    df = df.sort_values(["arrival_s", "request_id"], kind="stable").reset_index(drop=True)
    return df[list(COLUMNS)]
