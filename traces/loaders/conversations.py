"""Conversation datasets: request lengths and multi-turn structure from chat logs.

Formats (published schemas; a path is a file, or a directory of parquet shards):

* **ShareGPT** (``ShareGPT_V3_unfiltered_cleaned_split.json``): a JSON list of
  ``{"id": str, "conversations": [{"from": "human"|"gpt"|"system", "value": str}, ...]}``.
* **LMSYS-Chat-1M** (Zheng et al., ICLR 2024; parquet): ``conversation_id``, ``model``,
  ``conversation`` (list of ``{"role": "user"|"assistant", "content": str}``), ``turn``, ...
  No timestamps.
* **Chatbot Arena conversations** (parquet or JSON): ``question_id``, ``model_a``, ``model_b``,
  ``conversation_a``, ``conversation_b`` (role/content lists), ``tstamp`` (epoch s), ...
  ``side="a"`` (default), ``"b"`` or ``"both"`` chooses which conversation(s) to use.
* **WildChat / WildChat-1M** (Zhao et al., ICLR 2024; parquet): ``conversation_hash`` (or
  ``conversation_id``), ``model``, ``timestamp``, ``conversation`` (role/content, and in
  WildChat-1M a per-utterance ``timestamp``), ``turn``, ...

Turns: a *turn* is the user (and system) messages since the last assistant reply plus the
assistant reply that follows; assistant messages before the first user message are context of
turn 0; a trailing user message without a reply is dropped. With ``turns="all"`` (default),
turn ``k`` of a conversation is one request whose prompt is the whole history plus its new
user text, ``prompt_k = prefix_k + new_k`` with ``prefix_k = prompt_{k-1} + output_{k-1}``
(``prefix_0 = 0``) -- the multi-turn prefix structure the workload's ``prefix_tokens`` records.
``turns="first"`` keeps only the first turn of each conversation (the usual single-turn
ShareGPT benchmark).

Arrivals: per-utterance timestamps where the dataset has them (WildChat-1M), else the
conversation timestamp for turn 0 (Arena, WildChat) and NaN for later turns (the registry fills
those from a think-time model), else NaN everywhere (LMSYS, ShareGPT: the registry draws
conversation starts from an arrival process). The ``model`` becomes the ``key`` column, which
adapters can be mapped from.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import pandas as pd

from traces.loaders.base import TraceFormatError, TraceTable, require_columns
from traces.loaders.tokens import get_token_counter

USER_ROLES = {"user", "human", "prompter"}
ASSISTANT_ROLES = {"assistant", "gpt", "chatgpt", "bard", "bing", "model", "bot"}
SYSTEM_ROLES = {"system"}

SCHEMAS = {
    "sharegpt": "JSON list of {id, conversations: [{from: human|gpt|system, value}]}",
    "lmsys": "conversation_id, model, conversation: [{role, content}], turn, ...",
    "arena": "question_id, model_a, model_b, conversation_a, conversation_b: [{role, content}], tstamp, ...",
    "wildchat": "conversation_hash|conversation_id, model, timestamp, conversation: [{role, content, timestamp?}], ...",
}
#: the loader formats that are conversation datasets: multi-turn, every turn a request that resends the history
#: (the others, e.g. ``azure-llm``, hold single requests with no turns)
CONVERSATION_FORMATS: tuple[str, ...] = tuple(SCHEMAS)
#: the conversation formats that record no time at all: their arrivals are always drawn from an arrival process
UNTIMED_FORMATS: tuple[str, ...] = ("sharegpt", "lmsys")


@dataclass
class Conversation:
    """One conversation: ``messages`` are ``(role, text, timestamp or None)``."""

    model: str | None
    timestamp: Any
    messages: list[tuple[str, str, Any]] = field(default_factory=list)


def _role(r: Any) -> str:
    r = str(r).strip().lower()
    if r in USER_ROLES:
        return "user"
    if r in ASSISTANT_ROLES:
        return "assistant"
    if r in SYSTEM_ROLES:
        return "system"
    return "user"


def _epoch(ts: Any) -> float:
    """Seconds since the epoch of a timestamp (number, string, datetime); NaN when missing."""
    if ts is None:
        return float("nan")
    if isinstance(ts, (int, float, np.integer, np.floating)):
        return float(ts)
    try:
        v = pd.Timestamp(ts)
    except (ValueError, TypeError):
        return float("nan")
    if v is pd.NaT:
        return float("nan")
    if v.tzinfo is None:
        v = v.tz_localize("UTC")
    return v.timestamp()


def conversations_to_table(convs: Iterable[Conversation], source: str, fmt: str, tokenizer: str = "auto",
                           turns: str = "all") -> TraceTable:
    """Turn conversations into requests (see the module docstring for the turn rules)."""
    if turns not in ("all", "first"):
        raise ValueError(f"turns must be 'all' or 'first', got {turns!r}")
    counter = get_token_counter(tokenizer)
    new_text: list[str] = []
    out_text: list[str] = []
    conv_idx: list[int] = []
    turn_ts: list[float] = []
    models: list[Any] = []
    n_conv = 0
    for conv in convs:
        pending: list[str] = []
        pending_ts = float("nan")
        k = 0
        i = 0
        msgs = conv.messages
        base_ts = _epoch(conv.timestamp)
        while i < len(msgs):
            role, text, ts = msgs[i]
            if role == "assistant" and (pending or k > 0):
                reply = [text]
                while i + 1 < len(msgs) and msgs[i + 1][0] == "assistant":
                    i += 1
                    reply.append(msgs[i][1])
                new_text.append("\n".join(pending))
                out_text.append("\n".join(reply))
                conv_idx.append(n_conv)
                t = pending_ts if np.isfinite(pending_ts) else (base_ts if k == 0 else float("nan"))
                turn_ts.append(t)
                models.append(conv.model)
                pending, pending_ts = [], float("nan")
                k += 1
                if turns == "first":
                    break
            else:
                pending.append(text or "")
                if role == "user" and not np.isfinite(pending_ts):
                    pending_ts = _epoch(ts)
            i += 1
        if k:
            n_conv += 1
    if not new_text:
        raise TraceFormatError(f"{source}: no (user, assistant) turn found in any conversation")
    new_tok = np.maximum(counter.count(new_text), 0)
    out_tok = np.maximum(counter.count(out_text), 1)
    cid = np.asarray(conv_idx, np.int64)
    df = pd.DataFrame({"conversation_id": cid, "new": new_tok, "output_tokens": out_tok})
    g = df.groupby("conversation_id", sort=False)
    df["turn"] = g.cumcount().astype(np.int64)
    step = df["new"] + df["output_tokens"]
    df["prefix_tokens"] = (g["new"].cumsum() + g["output_tokens"].cumsum() - step).astype(np.int64)
    df["prompt_tokens"] = np.maximum(df["prefix_tokens"] + df["new"], 1).astype(np.int64)
    ts = np.asarray(turn_ts, float)
    t0 = np.nanmin(ts) if np.isfinite(ts).any() else 0.0
    df["arrival_s"] = ts - t0
    df["key"] = pd.Series(models, dtype=object).fillna("unknown").astype(str).to_numpy()
    df = df.drop(columns="new")
    meta = {"format": fmt, "path": str(source), "conversations": int(n_conv), "requests": int(len(df)),
            "tokenizer": counter.name, "turns": turns,
            "timestamps": "per-turn" if np.isfinite(ts).sum() > n_conv else
                          "per-conversation" if np.isfinite(ts).any() else "none"}
    return TraceTable(df[["arrival_s", "prompt_tokens", "output_tokens", "key", "conversation_id", "turn",
                          "prefix_tokens"]], meta)


# --------------------------------------------------------------------------- readers
def _parquet_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(path.rglob("*.parquet"))
        if not files:
            raise FileNotFoundError(f"no .parquet files in the directory {path}")
        return files
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    return [path]


def _records(path: Path, required: tuple[str, ...], fmt: str, columns: tuple[str, ...] = (),
             limit: int | None = None) -> Iterator[dict[str, Any]]:
    """Rows of a parquet file/directory or a JSON/JSONL file as dicts, schema-checked."""
    if path.is_dir() or path.suffix == ".parquet":
        import pyarrow.parquet as pq

        n = 0
        for f in _parquet_files(path):
            pf = pq.ParquetFile(f)
            names = pf.schema_arrow.names
            require_columns(names, required, f, fmt, SCHEMAS.get(fmt, ""))
            cols = [c for c in dict.fromkeys(required + columns) if c in names]
            for batch in pf.iter_batches(columns=cols, batch_size=4096):
                for row in batch.to_pylist():
                    yield row
                    n += 1
                    if limit is not None and n >= limit:
                        return
        return
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    with open(path, encoding="utf-8") as fh:
        head = fh.read(1)
        while head and head.isspace():
            head = fh.read(1)
        fh.seek(0)
        if head == "[":
            rows = json.load(fh)
        else:
            rows = (json.loads(line) for line in fh if line.strip())
        n = 0
        for row in rows:
            if not isinstance(row, dict):
                raise TraceFormatError(f"{path}: expected JSON objects ({SCHEMAS.get(fmt, fmt)}), got {type(row).__name__}")
            if n == 0:
                require_columns(row.keys(), required, path, fmt, SCHEMAS.get(fmt, ""))
            else:
                missing = [c for c in required if c not in row]
                if missing:
                    raise TraceFormatError(f"{path}: record {n + 1} lacks {', '.join(map(repr, missing))} (the first "
                                           f"has it; every record needs it: {SCHEMAS.get(fmt, fmt)}); got keys "
                                           f"{sorted(row)[:8]}")
            yield row
            n += 1
            if limit is not None and n >= limit:
                return


def _messages(turns: Any, path: Path, role_key: str = "role", text_key: str = "content") -> list[tuple[str, str, Any]]:
    if turns is None:
        return []
    if isinstance(turns, str):
        try:
            turns = json.loads(turns)
        except json.JSONDecodeError as e:
            raise TraceFormatError(f"{path}: conversation is a string that is not JSON") from e
    if hasattr(turns, "tolist") and not isinstance(turns, dict):  # (a numpy array of a parquet list column)
        turns = turns.tolist()
    if not isinstance(turns, (list, tuple)):
        raise TraceFormatError(f"{path}: a conversation must be a list of messages (objects with {role_key!r} and "
                               f"{text_key!r}), got {type(turns).__name__} {str(turns)[:80]}")
    out = []
    for m in turns:
        if not isinstance(m, dict) or role_key not in m or text_key not in m:
            raise TraceFormatError(f"{path}: conversation messages must be objects with {role_key!r} and "
                                   f"{text_key!r} (got {str(m)[:80]})")
        text = m[text_key]
        if text is not None and not isinstance(text, str):
            raise TraceFormatError(f"{path}: a message's {text_key!r} must be text (a string), got "
                                   f"{type(text).__name__} {str(text)[:80]} in {str(m)[:120]}")
        out.append((_role(m[role_key]), text or "", m.get("timestamp")))
    return out


def load_sharegpt(path: str | Path, tokenizer: str = "auto", turns: str = "all",
                  max_conversations: int | None = None) -> TraceTable:
    """ShareGPT JSON (``id``, ``conversations`` of ``from``/``value``)."""
    path = Path(path)
    convs = (Conversation(None, None, _messages(r["conversations"], path, "from", "value"))
             for r in _records(path, ("conversations",), "sharegpt", limit=max_conversations))
    return conversations_to_table(convs, str(path), "sharegpt", tokenizer, turns)


def load_lmsys(path: str | Path, tokenizer: str = "auto", turns: str = "all",
               max_conversations: int | None = None) -> TraceTable:
    """LMSYS-Chat-1M parquet (``conversation_id``, ``model``, ``conversation``)."""
    path = Path(path)
    convs = (Conversation(r.get("model"), None, _messages(r["conversation"], path))
             for r in _records(path, ("conversation_id", "model", "conversation"), "lmsys",
                               limit=max_conversations))
    return conversations_to_table(convs, str(path), "lmsys", tokenizer, turns)


def load_arena(path: str | Path, tokenizer: str = "auto", turns: str = "all", side: str = "a",
               max_conversations: int | None = None) -> TraceTable:
    """Chatbot Arena conversations (``conversation_a``/``_b``, ``model_a``/``_b``, ``tstamp``)."""
    path = Path(path)
    if side not in ("a", "b", "both"):
        raise ValueError(f"side must be 'a', 'b' or 'both', got {side!r}")
    sides = ("a", "b") if side == "both" else (side,)

    def gen() -> Iterator[Conversation]:
        req = ("question_id", "tstamp") + tuple(f"{c}_{s}" for s in sides for c in ("model", "conversation"))
        for r in _records(path, req, "arena", limit=max_conversations):
            for s in sides:
                yield Conversation(r.get(f"model_{s}"), r.get("tstamp"), _messages(r[f"conversation_{s}"], path))

    return conversations_to_table(gen(), str(path), "arena", tokenizer, turns)


def load_wildchat(path: str | Path, tokenizer: str = "auto", turns: str = "all",
                  max_conversations: int | None = None) -> TraceTable:
    """WildChat / WildChat-1M parquet (``model``, ``timestamp``, ``conversation``)."""
    path = Path(path)
    files = _parquet_files(path) if (path.is_dir() or path.suffix == ".parquet") else [path]
    first = files[0]
    if first.suffix == ".parquet":
        import pyarrow.parquet as pq

        names = pq.ParquetFile(first).schema_arrow.names
    else:
        names = list(next(_records(first, (), "wildchat", limit=1)).keys())
    idcol = "conversation_hash" if "conversation_hash" in names else "conversation_id"
    convs = (Conversation(r.get("model"), r.get("timestamp"), _messages(r["conversation"], path))
             for r in _records(path, (idcol, "model", "timestamp", "conversation"), "wildchat",
                               limit=max_conversations))
    return conversations_to_table(convs, str(path), "wildchat", tokenizer, turns)
