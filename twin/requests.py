"""The request table: per-request columns, states, rejection rules and the start-up check.

The engine's step loop (:mod:`twin.engine`) reads and writes these columns; this module
holds everything about requests that does not depend on the step loop:

* the workload columns (arrival, prompt, output, adapter as a dense index, rank), each as a
  memoryview of the workload's own array (``*_a``: fast scalar reads from Python, no copy;
  :func:`as_column`) with a numpy view;
* the outcome columns (first scheduled, first token, finish; ``array.array`` of NaN) and the sparse facts
  (adapter-load wait, preemption counts, last token before a preemption);
* :class:`RequestState` and the rejection rules vLLM applies at arrival
  (:data:`REJECT_REASONS`), with the prefix counts of the requests that join the queue;
* :func:`check_startup` / :class:`StartupError`: vLLM refuses to start when the KV cache
  cannot hold one ``max_model_len`` request.
"""

from __future__ import annotations

import math
import os
from array import array
from enum import IntEnum
from typing import Any

import numpy as np

from traces.schema import (COLUMNS, FILE_MINIMUM as COLUMN_MINIMUM, NO_RANK_COLUMN, REQUIRED_FILE_COLUMNS as REQUIRED_COLUMNS,
                           WorkloadError, too_large)
from twin.config import MAX_SIM_SECONDS, ConfigError


class RequestState(IntEnum):
    """States kept in ``RequestTable.state`` (waiting and running are derived from the engine's queues)."""

    PENDING = 0
    FINISHED = 3
    REJECTED = 4


PENDING, FINISHED, REJECTED = RequestState.PENDING, RequestState.FINISHED, RequestState.REJECTED

#: why a request was rejected at arrival (index = ``RequestTable.reject_reason``; 0: accepted)
REJECT_REASONS = ("", "prompt + output exceed max_model_len", "request can never fit in the KV cache",
                  "unknown adapter (not served)", "adapter rank exceeds max_lora_rank",
                  "LoRA request but LoRA is disabled",
                  # the S-LoRA engine's HTTP-server checks (twin/slora_engine.py)
                  "prompt longer than the S-LoRA server's max prompt length",
                  "prompt + output exceed the S-LoRA server's max request length",
                  "prompt + output + 1 exceed S-LoRA's max_total_token_num",
                  "request and its adapter can never fit S-LoRA's pool",
                  "prompt longer than S-LoRA's batch_max_tokens (one prefill mini-batch)")
#: why a request that arrived failed before the server's queue when a policy that drops arrivals
#: (``EngineView.drop_arrivals``) gives no reason (the requests table's ``drop_reason``)
DEFAULT_DROP_REASON = "dropped before the queue by the scheduler (drop_arrivals)"
#: the option that sets the limit behind a rejection reason (what the console output points to)
REJECT_OPTIONS = {"prompt + output exceed max_model_len": "--max-model-len",
                  "request can never fit in the KV cache": "--kv-tokens / --gpu-mem-gb",
                  "unknown adapter (not served)": "--adapters",
                  "adapter rank exceeds max_lora_rank": "--max-lora-rank",
                  "prompt longer than the S-LoRA server's max prompt length": "--slora-max-prompt-len",
                  "prompt + output exceed the S-LoRA server's max request length": "--slora-max-total-len",
                  "prompt + output + 1 exceed S-LoRA's max_total_token_num": "--max-total-tokens",
                  "request and its adapter can never fit S-LoRA's pool": "--max-total-tokens",
                  "prompt longer than S-LoRA's batch_max_tokens (one prefill mini-batch)":
                      "--slora-batch-max-tokens"}


def with_option(reason: str) -> str:
    """A rejection reason with the option that sets its limit: ``prompt longer than ... [--slora-max-prompt-len]``."""
    opt = REJECT_OPTIONS.get(reason)
    return f"{reason} [{opt}]" if opt else reason


WORKLOAD_COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "adapter_id", "adapter_rank")


class StartupError(ConfigError):
    """The server would refuse to start with this configuration (as vLLM does)."""


def check_startup(kv_tokens: int, max_model_len: int, slots: int, max_rank: int) -> None:
    """vLLM refuses to start when the KV cache cannot hold one ``max_model_len`` request."""
    if kv_tokens < max_model_len:
        raise StartupError(
            f"the KV cache left after the weights and {slots} LoRA slots of max rank {max_rank} holds "
            f"{kv_tokens} tokens, less than one max_model_len={max_model_len} request; vLLM would refuse to "
            f"start. Lower --slots or the max LoRA rank, lower max_model_len, or use a GPU with more memory")


def as_column(code: str, values: Any) -> memoryview:
    """A column for fast scalar reads and writes from Python: a memoryview of ``values`` as a
    contiguous float64 (``code`` "d") or int64 (otherwise) numpy array. No copy when ``values``
    already is one (the engine reads the workload's columns in place and never writes them: a
    read-only source gives a read-only view); indexing a memoryview is as fast as an
    ``array.array`` and numpy views of it (``np.frombuffer``) share its memory."""
    return memoryview(np.ascontiguousarray(values, dtype=np.float64 if code == "d" else np.int64))


def zeros_column(n: int) -> memoryview:
    """An int64 column of ``n`` zeros for scalar access (see :func:`as_column`). ``np.zeros``
    asks the OS for zeroed pages, so only the pages that are written cost anything: a column
    indexed by request touches only the requests that reach that code (unlike an
    ``array.array``, which writes all of its memory up front)."""
    return memoryview(np.zeros(n, np.int64))


def _view(a: "array | memoryview", dtype: type) -> np.ndarray:
    return np.frombuffer(a, dtype) if len(a) else np.zeros(0, dtype)


def read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a`` (the array itself, possibly the caller's workload column, keeps its
    flags): the workload's columns a policy reads through :class:`twin.interfaces.EngineView` cannot be
    written by mistake (``engine.adapter[lo:hi] = 0`` changed a run's results silently)."""
    v = a.view()
    v.flags.writeable = False
    return v


def _check_clock(arrival: np.ndarray) -> None:
    """The arrivals (sorted) lie within the clock a run may simulate (arrivals at 1e15 s ran, with TTFT 0: at that
    magnitude a float clock loses the steps' milliseconds)."""
    if len(arrival) and arrival[-1] > MAX_SIM_SECONDS:
        raise ValueError(f"workload column 'arrival_s': the last request arrives at {float(arrival[-1]):g} s, beyond "
                         f"the {MAX_SIM_SECONDS:g} s (about 3 years) a run may simulate; shift or rescale the arrivals")


def workload_columns(workload: Any) -> dict[str, np.ndarray]:
    """Numpy columns of a :class:`~traces.workload.Workload` or of a mapping of columns (checked here
    as :func:`traces.workload.validate` checks a table: the schema's columns only, one value per request,
    integers where the schema has them, the bounds, one rank per adapter, distinct ids).

    A Workload's table is checked again, as a mapping is (the same messages): it is validated when built, but
    ``wl.df`` can be changed afterwards (``wl.df.loc[2, "arrival_s"] = np.nan`` hung the run, a negative
    ``prompt_tokens`` finished, reversed arrivals ran with wrong TTFTs). The checks are vectorised (a few passes
    over each column: about 10-15 ms for 1.3 million requests, against seconds of simulation)."""
    if hasattr(workload, "df"):
        df = workload.df
        cols = {c: df[c].to_numpy() for c in COLUMNS if c in df.columns}  # (columns added to the table are ignored)
        try:
            return _checked_columns(cols, "the workload's table")
        except ValueError as e:  # (a Workload's table passed these checks when built: it was changed since)
            raise type(e)(f"{e} (this Workload's table, wl.df, was changed after it was built; fix it, or build the "
                          f"workload again: Workload(wl.df) checks and sorts it)") from None
    if isinstance(workload, (str, os.PathLike)):
        raise TypeError(f"workload: got the path {str(workload)!r}; read the file first: "
                        f"traces.workload.Workload.load({str(workload)!r}) (.parquet, .csv or .jsonl)")
    if not hasattr(workload, "keys"):
        raise TypeError(f"workload: got {type(workload).__name__}; give a traces.workload.Workload (e.g. "
                        f"Workload.from_arrays(...)) or a mapping of numpy columns with arrival_s, prompt_tokens and "
                        f"output_tokens")
    keys = [str(k) for k in workload.keys()]
    missing = [c for c in REQUIRED_COLUMNS if c not in keys]
    if missing:
        raise WorkloadError(f"workload: the mapping of columns lacks {', '.join(missing)} (has "
                            f"{', '.join(keys) or 'none'}); give arrival_s, prompt_tokens and output_tokens, one "
                            f"value per request")
    unknown = [k for k in keys if k not in COLUMNS]
    if unknown:  # (a misspelt optional column, e.g. prefix_token, would be ignored)
        raise WorkloadError(f"workload: unknown column(s) {', '.join(unknown)}; the workload columns are "
                            f"{', '.join(COLUMNS)}")
    return _checked_columns(dict(workload), "the mapping of columns")


def _checked_columns(cols: dict[str, Any], what: str) -> dict[str, np.ndarray]:
    """The checks of :func:`workload_columns` on ``cols`` (``what`` names the source in the message of a missing
    column); the defaults are added for the optional columns the engine reads."""
    missing = [c for c in REQUIRED_COLUMNS if c not in cols]
    if missing:
        raise WorkloadError(f"workload: {what} lacks {', '.join(missing)} (has {', '.join(map(str, cols)) or 'none'}); "
                            f"give arrival_s, prompt_tokens and output_tokens, one value per request")
    n = len(cols["arrival_s"])
    # (the defaults are built only for the columns that are missing)
    ids_given = "request_id" in cols
    if not ids_given:
        cols["request_id"] = np.arange(n, dtype=np.int64)
    if "adapter_id" not in cols:
        cols["adapter_id"] = np.full(n, -1, np.int64)
    rank_given = "adapter_rank" in cols
    if not rank_given:
        cols["adapter_rank"] = np.zeros(n, np.int64)
    for col in cols:  # every column: n values (an optional column of another length was ignored)
        v = cols[col] = np.asarray(cols[col])
        if v.ndim != 1 or len(v) != n or (n and v.dtype.kind not in ("iuf" if col == "arrival_s" else "iu")):
            raise WorkloadError(f"workload column {col!r}: give {n} {'numbers' if col == 'arrival_s' else 'integers'}"
                                f" (one per request, as arrival_s), got shape {v.shape} of dtype {v.dtype}")
    if not n:
        return cols
    arr = np.asarray(cols["arrival_s"], np.float64)
    # sorted, finite, >= 0: one comparison pass (a NaN compares false, so sorted arrivals hold none, and an
    # infinity can only be first or last)
    ordered = n < 2 or bool((arr[1:] >= arr[:-1]).all())
    if not (ordered and math.isfinite(arr[0]) and math.isfinite(arr[-1]) and arr[0] >= 0):
        if not (np.isfinite(arr).all() and arr.min() >= 0):
            raise ValueError("workload column 'arrival_s' must be finite and >= 0 (seconds from the start)")
        raise ValueError("workload arrays must be sorted by arrival_s")
    _check_clock(arr)
    ids = cols["request_id"]
    ids_up = n < 2 or bool((ids[1:] > ids[:-1]).all())  # increasing ids (the usual case): distinct, min the first
    lows = {}
    for col, v in cols.items():
        if col == "arrival_s":
            continue
        problem = too_large(col, v)  # (before any cast: a uint64 value >= 2**63 would wrap to a negative one)
        if problem:
            raise WorkloadError(problem)
        lows[col] = low = int(v[0] if col == "request_id" and ids_up else v.min())
        if low < COLUMN_MINIMUM[col]:
            row = int(np.argmax(v < COLUMN_MINIMUM[col]))
            raise ValueError(f"workload column {col!r} must be >= {COLUMN_MINIMUM[col]} (row {row} has {v[row]})")
    rank = cols["adapter_rank"]
    aid = cols["adapter_id"]
    top = int(aid.max())
    if top >= 0:
        if not rank_given:
            raise WorkloadError(f"workload: {NO_RANK_COLUMN.format(what=what)}")
        if lows["adapter_rank"] < 1 and ((aid >= 0) & (rank < 1)).any():
            raise ValueError("workload column 'adapter_rank': requests with an adapter (adapter_id >= 0) need "
                             "adapter_rank >= 1")
        # one rank per adapter: each request's rank against the rank a table of the adapters keeps for it (one
        # scatter and one gather, O(n), no sort); base-model requests (-1) share the table's last entry, and their
        # mismatches are masked out
        a_ids, size = aid, top + 2
        if top >= 4 * n + (1 << 16):  # sparse ids (10**12 asked numpy for a 7 TiB table): dense ones
            a_ids = np.unique(aid, return_inverse=True)[1].reshape(-1) - (1 if lows["adapter_id"] < 0 else 0)
            size = int(a_ids.max()) + 2
        first = np.zeros(size, rank.dtype)
        first[a_ids] = rank  # (one of each adapter's ranks: all of them when they agree)
        other = first.take(a_ids) != rank
        if other.any():
            first[a_ids[::-1]] = rank[::-1]  # (the last write wins: the first request's rank, for the message)
            other = (first.take(a_ids) != rank) & (aid >= 0)
            if other.any():
                i = int(other.argmax())
                raise WorkloadError(f"workload: adapter {aid[i]} appears with ranks {first[a_ids[i]]} and "
                                    f"{rank[i]}; one rank per adapter")
    if ids_given and not ids_up:  # distinct ids (increasing ones need no check; small ones a presence count)
        if int(ids.max()) < 4 * n + (1 << 16):
            dup = int(np.bincount(ids.astype(np.int64, copy=False)).max()) > 1  # (ids >= 0: checked above)
        else:
            dup = np.unique(ids).size != n
        if dup:
            raise WorkloadError("workload column 'request_id' has duplicates; give each request its own id (or "
                                "leave the column out: the row order)")
    return cols


def workload_column(workload: Any, name: str, n: int) -> np.ndarray | None:
    """An optional column (e.g. ``conversation_id``) of a workload, or None when it has none."""
    if hasattr(workload, "df"):
        return workload.df[name].to_numpy() if name in workload.df.columns else None
    try:
        v = workload[name]
    except (KeyError, TypeError):
        return None
    return np.asarray(v) if len(v) == n else None


def dense_adapter_ids(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct adapter ids ``>= 0`` of ``raw`` and each request's index among them
    (-1 without an adapter): ``np.unique`` and ``np.searchsorted``, computed with a presence
    table over the ids when they are small (a linear pass instead of two sorts; same arrays)."""
    has = raw >= 0
    every = bool(has.all())  # every request names an adapter (the usual case): no masks
    pos = raw if every else raw[has]
    if len(pos) and int(pos.max()) < 4 * len(raw) + (1 << 16):
        present = np.zeros(int(pos.max()) + 1, bool)
        present[pos] = True
        used = np.flatnonzero(present).astype(np.int64)
        rank = np.cumsum(present, dtype=np.int64) - 1
        if every:
            return used, rank[raw]
        dense = np.full(len(raw), -1, np.int64)
        dense[has] = rank[pos]
        return used, dense
    used = np.unique(pos)
    return used, np.where(has, np.searchsorted(used, raw), -1).astype(np.int64)


class RequestTable:
    """Per-request columns of one run (see the module docstring)."""

    #: :meth:`apply_rejection_rules` accepts every request at once when the maxima show no rule
    #: can refuse one (False: the masks every time; a test checks both give the same columns)
    decide_from_maxima = True

    def __init__(self, workload: Any) -> None:
        cols = workload_columns(workload)
        self.n = n = len(cols["arrival_s"])
        self.arrival_a = as_column("d", cols["arrival_s"])
        self.prompt_a = as_column("q", cols["prompt_tokens"])
        self.output_a = as_column("q", cols["output_tokens"])
        self.arrival = read_only(_view(self.arrival_a, np.float64))
        self.prompt = read_only(_view(self.prompt_a, np.int64))
        self.output = read_only(_view(self.output_a, np.int64))
        self.request_id = read_only(np.asarray(cols["request_id"], np.int64))
        raw_adapter = np.asarray(cols["adapter_id"], np.int64)
        raw_rank = np.asarray(cols["adapter_rank"], np.int64)
        # adapters: dense ids 0..A-1 for the adapters the workload uses
        used, dense = dense_adapter_ids(raw_adapter)
        self.adapter_ids = read_only(used)
        self.adapter_a = as_column("q", dense)
        self.adapter = read_only(_view(self.adapter_a, np.int64))
        ranks = np.zeros(len(used), np.int64)
        if len(used):
            if int(dense.min()) >= 0:  # (every request names an adapter: no masks)
                ranks[dense] = raw_rank
            else:
                ranks[dense[raw_adapter >= 0]] = raw_rank[raw_adapter >= 0]
        self.adapter_rank = read_only(ranks)
        self.rank = read_only(raw_rank)
        self.n_adapters = len(used)
        # outcomes (written once per event)
        self.state = np.zeros(n, np.int8)   # RequestState values
        self.reject_reason = np.zeros(n, np.int8)
        nan = array("d", [np.nan])
        self.first_sched_a = nan * n
        self.first_token_a = nan * n
        self.finish_a = nan * n
        self.first_sched = _view(self.first_sched_a, np.float64)
        self.first_token = _view(self.first_token_a, np.float64)
        self.finish = _view(self.finish_a, np.float64)
        # sparse per-request facts (few requests have them)
        self.load_wait_d: dict[int, float] = {}     # adapter-load wait on the critical path
        self.preempt_d: dict[int, int] = {}         # preemption counts
        self.last_token_d: dict[int, float] = {}    # last token time of preempted requests
        self.seen = bytearray(n)                    # admitted at least once
        # prefix counts of requests that join the waiting queue (not rejected)
        self.ok_cum: "range | memoryview" = range(n + 1)  # every request accepted (until the rules say)

    def apply_rejection_rules(self, max_model_len: int, block_size: int, total_blocks: int,
                              served_adapters: int | None, enable_lora: bool, max_lora_rank: int,
                              adapter_blocks: np.ndarray | None = None) -> None:
        """Mark the requests vLLM would refuse (they are counted when they arrive).

        ``adapter_blocks`` (unified pool): KV blocks of each dense adapter; a request and its
        adapter must then fit in the pool together. Updates ``state`` and ``reject_reason`` in
        place and sets ``ok_cum``, the prefix counts of the accepted requests (a ``range`` when
        every request is accepted)."""
        total = self.prompt + self.output
        if self.decide_from_maxima and self.n and adapter_blocks is None:
            # the usual case, decided from maxima: no rule can refuse any request
            longest = int(total.max())
            if (longest <= max_model_len and -(-(longest - 1) // block_size) <= total_blocks
                    and (served_adapters is None or not self.n_adapters
                         or int(self.adapter_ids.max()) < served_adapters)
                    and (not self.n_adapters if not enable_lora else int(self.rank.max()) <= max_lora_rank)):
                self.reject_reason[:] = 0
                self.state[:] = PENDING
                self.ok_cum = range(self.n + 1)  # (the prefix counts of all: an index is its count)
                return
        reason = np.zeros(self.n, np.int8)
        reason[total > max_model_len] = 1
        need_blocks = -(-(total - 1) // block_size)
        reason[(reason == 0) & (need_blocks > total_blocks)] = 2
        has = self.adapter >= 0
        if served_adapters is not None:
            raw = np.where(has, self.adapter_ids[np.maximum(self.adapter, 0)] if self.n_adapters else -1, -1)
            reason[(reason == 0) & has & (raw >= served_adapters)] = 3
        if enable_lora:
            reason[(reason == 0) & has & (self.rank > max_lora_rank)] = 4
        else:
            reason[(reason == 0) & has] = 5
        if adapter_blocks is not None and self.n:
            ab = np.asarray(list(adapter_blocks) + [0], np.int64)[np.where(has, self.adapter, -1)]
            reason[(reason == 0) & (need_blocks + ab > total_blocks)] = 2
        self.set_rejections(reason)

    def set_rejections(self, reason: np.ndarray) -> None:
        """Record each request's rejection reason (0: accepted), its state, and ``ok_cum``, the
        prefix counts of the accepted requests (a column here, whatever the reasons)."""
        self.reject_reason[:] = reason
        self.state[:] = PENDING
        self.state[reason > 0] = REJECTED
        self.ok_cum = zeros_column(self.n + 1)
        np.cumsum(reason == 0, out=np.frombuffer(self.ok_cum, np.int64)[1:])
