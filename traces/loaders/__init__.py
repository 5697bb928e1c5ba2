"""Loaders for the real trace formats, by format name or by sniffing a file.

========================  =====================================================  ==========================
format                    file                                                   loader
========================  =====================================================  ==========================
``azure-llm``             ``TIMESTAMP,ContextTokens,GeneratedTokens`` CSV         :func:`load_azure_llm`
``azure-functions-2019``  ``HashOwner,HashApp,HashFunction,Trigger,1..1440``      :func:`load_functions_2019`
``azure-functions-2021``  ``app,func,end_timestamp,duration``                     :func:`load_functions_2021`
``burstgpt``              ``Timestamp,Model,Request tokens,Response tokens,...``  :func:`load_burstgpt`
``sharegpt``              JSON list of ``{id, conversations}``                    :func:`load_sharegpt`
``lmsys``                 parquet ``conversation_id, model, conversation``        :func:`load_lmsys`
``arena``                 ``conversation_a/_b, model_a/_b, tstamp``               :func:`load_arena`
``wildchat``              parquet ``conversation_hash, model, timestamp, ...``    :func:`load_wildchat`
``workload``              a saved :class:`traces.workload.Workload` parquet       ``Workload.load``
========================  =====================================================  ==========================

:func:`detect_format` reads only a header (CSV/TXT), the first object (JSON) or the schema
(parquet). Every loader returns a :class:`TraceTable` and raises :class:`TraceFormatError`
naming the file and the missing columns when the schema does not match.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from traces.loaders.azure_functions import load_functions_2019, load_functions_2021
from traces.loaders.azure_llm import load_azure_llm
from traces.loaders.base import TraceFormatError, TraceTable
from traces.loaders.burstgpt import load_burstgpt
from traces.loaders.conversations import (CONVERSATION_FORMATS, UNTIMED_FORMATS, load_arena, load_lmsys, load_sharegpt,
                                         load_wildchat)

LOADERS: dict[str, Callable[..., TraceTable]] = {
    "azure-llm": load_azure_llm,
    "azure-functions-2019": load_functions_2019,
    "azure-functions-2021": load_functions_2021,
    "burstgpt": load_burstgpt,
    "sharegpt": load_sharegpt,
    "lmsys": load_lmsys,
    "arena": load_arena,
    "wildchat": load_wildchat,
}
FORMATS = tuple(LOADERS) + ("workload",)

__all__ = ["LOADERS", "FORMATS", "CONVERSATION_FORMATS", "UNTIMED_FORMATS", "TraceTable", "TraceFormatError",
           "detect_format", "load_trace", "load_azure_llm", "load_functions_2019", "load_functions_2021",
           "load_burstgpt", "load_sharegpt", "load_lmsys", "load_arena", "load_wildchat"]


def _format_from_columns(cols: list[str], path: Path) -> str:
    s = set(cols)
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= s:
        return "azure-llm"
    if {"HashOwner", "HashApp", "HashFunction"} <= s:
        return "azure-functions-2019"
    if {"app", "func", "end_timestamp", "duration"} <= s:
        return "azure-functions-2021"
    if {"Timestamp", "Request tokens", "Response tokens"} <= s:
        return "burstgpt"
    if {"request_id", "arrival_s", "prompt_tokens", "output_tokens"} <= s:
        return "workload"
    if {"arrival_s", "prompt_tokens", "output_tokens"} <= s:  # a workload's columns, in no workload file
        if path.suffix.lower() in (".parquet", ".csv", ".jsonl"):  # (met only inside a directory)
            raise TraceFormatError(f"{path}: a workload file inside a directory; a directory is read as the parts "
                                   f"of one raw trace, so give the workload file itself (--trace {path})")
        kind = f"a {path.suffix}" if path.suffix else "an extension-less"
        raise TraceFormatError(f"{path}: the workload columns in {kind} file; a workload "
                               f"is read from .parquet, .csv (a header row) or .jsonl (one JSON object per line): "
                               f"save it as one of those")
    if "conversations" in s:
        return "sharegpt"
    if {"conversation_a", "model_a"} <= s:
        return "arena"
    if "conversation" in s and "timestamp" in s:
        return "wildchat"
    if "conversation" in s:
        return "lmsys"
    raise TraceFormatError(f"{path}: unrecognised trace format (columns {cols[:12]}); known formats: "
                           f"{', '.join(FORMATS)}")


def detect_format(path: str | Path) -> str:
    """The format name of a trace file or directory (see the module table)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"trace file {path} does not exist")
    if path.is_dir():
        if any(path.glob("invocations_per_function_md.anon.d*.csv")):
            return "azure-functions-2019"
        for pattern in ("*.parquet", "*.csv", "*.json", "*.jsonl", "*.txt"):
            # the directory's own files, else those one level below it (a dataset's data/ folder); not a walk of
            # everything under it (--trace / walked the whole filesystem and named an unrelated file)
            first = min(path.glob(pattern), default=None) or min(path.glob(f"*/{pattern}"), default=None)
            if first is None:
                continue
            try:
                fmt = detect_format(first)
            except TraceFormatError as e:
                raise TraceFormatError(f"{path}: a directory whose first {pattern[1:]} file is not a trace ({e}); give "
                                       f"a trace file, or a directory of one dataset's files") from None
            if fmt in CONVERSATION_FORMATS and first.suffix == ".parquet":
                return fmt  # (a dataset's Parquet shards: its loader reads them all)
            raise TraceFormatError(f"{path}: a directory; a directory is read as the Parquet shards of one "
                                   f"conversation dataset or the day files of the Azure Functions 2019 trace, and "
                                   f"this one holds {fmt} files (e.g. {first}), which are read one file at a time: "
                                   f"give the file (--trace {first})")
        raise TraceFormatError(f"{path}: directory holds no trace files (.parquet/.csv/.json/.jsonl/.txt)")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        schema = pq.read_schema(path)
        if schema.metadata and b"lora_twin" in schema.metadata:
            return "workload"
        return _format_from_columns(schema.names, path)
    if suffix in (".json", ".jsonl"):
        with open(path, encoding="utf-8") as fh:
            text = fh.read(1 << 16)
        first = text.lstrip()[:1]
        if first == "[" and suffix == ".jsonl":
            raise TraceFormatError(f"{path}: a JSON Lines file holds one JSON object per line, but its first line is "
                                   f"a JSON array; write each record as an object on a line of its own (or save the "
                                   f"array as a .json file)")
        if first == "[":
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            obj: Any = data[0] if data else {}
        else:
            obj = json.loads(text.splitlines()[0]) if text.strip() else {}
        if not isinstance(obj, dict):
            raise TraceFormatError(f"{path}: JSON records must be objects")
        return _format_from_columns(list(obj.keys()), path)
    with open(path, encoding="utf-8", errors="replace") as fh:
        header = fh.readline().strip()
    return _format_from_columns([c.strip() for c in header.split(",")], path)


def load_trace(path: str | Path, fmt: str | None = None, **kwargs: Any) -> TraceTable:
    """Load ``path`` with the loader of ``fmt`` (sniffed when None)."""
    fmt = fmt or detect_format(path)
    if fmt == "workload":
        raise TraceFormatError(f"{path} is a saved workload; load it with traces.workload.Workload.load")
    if fmt not in LOADERS:
        raise KeyError(f"unknown trace format {fmt!r}; known: {', '.join(LOADERS)}")
    return LOADERS[fmt](path, **kwargs)
