"""The metrics scrape's stall of the client-observed path: vLLM 0.8.5's ``/metrics`` with LoRA labels.

The real runs' client reads the server's Prometheus endpoint every ~2 s (the ``ts_*`` gauges of
the validation tables; the calibration runs' gauge windows last 2.006-2.013 s). vLLM 0.8.5 keeps
its metrics in the API-server process and answers ``/metrics`` from that process's asyncio event
loop (``prometheus_client``'s exposition is synchronous), the same loop that reads new HTTP
requests, hands them to the engine core and streams every token back. While the exposition is
written the loop does nothing else: a request that arrives waits for the end of it, and a token
the engine core produced meanwhile reaches the client only then. The engine core, a separate
process, keeps stepping, so the engine's own schedule is unchanged.

What makes the exposition long with many adapters is the gauge ``vllm:lora_requests_info``: its
labels are the comma-joined names of the adapters with running and with waiting requests
(vLLM v1 ``PrometheusStatLogger.record``, ``LoRARequestStates.update_iteration_stats``), set
after every engine step. Every combination that ever occurs becomes its own time series and
stays in the registry, so each scrape writes every combination seen since the start. With few
adapters, or many requests per adapter, the combinations repeat (8 adapters: at most 2^8 sets;
16 adapters with ~90 running: all 16 almost always run); with dozens of adapters at a few
requests each, nearly every arrival, admission and finish makes a new one, and the stall grows
through the hour. The calibration runs' scrape cycle (``adapter_overhead_windows.csv``,
``window_s`` - 2 s, medians of the first and the last fifth of each run) grows the same way:
7-11 ms throughout with 1-64 adapters, 11 -> 14-16 ms with 96-160, 12 -> 19 ms with 192 and
23 -> 66 ms with 300 (``find_max_batch``), rising steadily through the run.

The model (:func:`client_times`):

* the set of adapters with waiting requests (arrived, first token not yet out) and the set with
  running ones (first token out, not finished), recorded at every change
  (:func:`label_times`): each pair not seen before is a new series;
* scrapes at ``t_0 = 0`` and ``t_{k+1} = t_k + B_k + period`` (the client sleeps ``period``
  after each answer); scrape ``k`` blocks ``[t_k, t_k + B_k)`` with ``B_k`` = seconds per
  series x the series created before ``t_k`` (:func:`stall_windows`);
* a request that arrives inside a stall enters at its end, which moves its whole engine
  timeline by the same amount (the engine runs without a queue where this matters); a first
  token or a finish that falls inside a stall reaches the client at its end
  (:func:`delay_past_stalls`). The front-end latency is added after;
* the tokens a request emits inside a stall reach its client as one streamed chunk when the steps
  that emitted them had at most 128 outputs (vLLM's output handler yields to the streams only
  between slices of 128 outputs of a step): the client's mean ITL counts one gap per chunk
  (:func:`merged_gaps`). Evidence: in the real runs without a queue, mean ITL / mean TPOT grows
  with the served adapters (1.00 with 16, 1.03-1.07 with 32-96, 1.08-1.15 with 128-320, where
  the stall grows), and is 0.97-1.00 with more than ~130 running requests at any adapter count;
  with the seconds per series fitted on P99 TTFT alone, the twin predicts the no-queue runs'
  ratio (results/validation/README.md, "Streamed chunks merged by the scrape stall").

What is not modelled: preempted requests going back to the waiting set (no queue, no
preemption where the stall matters), and the exposition's fixed part (the other metrics, ~10 ms
per scrape in the calibration runs, which the front-end latency already absorbs on average).
The seconds per series are fitted on the fit split (:mod:`twin.validation.scrape_stall`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from traces.arguments import is_real_number

#: The real client's scrape period (s): it sleeps this long after each answer (the calibration
#: runs' Prometheus windows last 2.006-2.013 s, median 2.009 s, of which ~10 ms is the scrape).
SCRAPE_PERIOD_S = 2.0

#: vLLM 0.8.5's ``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE``: AsyncLLM's output handler processes a step's
#: outputs in slices of this many requests and yields to the event loop between slices
#: (``vllm/v1/engine/async_llm.py``, ``_run_output_handler``; :func:`merged_gaps`)
OUTPUT_PROC_CHUNK_SIZE = 128


#: the shortest scrape period a run takes (s): a client scraping more often than every millisecond is no client
MIN_SCRAPE_PERIOD_S = 1e-3


def check_scrape(s_per_label: float, period_s: float) -> None:
    """``ValueError`` naming the bad setting (both must be finite; seconds per series >= 0, period > 0)."""
    if not (is_real_number(s_per_label) and math.isfinite(s_per_label) and s_per_label >= 0.0):
        raise ValueError(f"scrape_s_per_label {s_per_label!r}: give the scrape's seconds per label series, >= 0 "
                         f"(0: no scrape stall)")
    if not (is_real_number(period_s) and math.isfinite(period_s) and period_s >= MIN_SCRAPE_PERIOD_S):
        raise ValueError(f"scrape_period_s {period_s!r}: give the client's scrape period in seconds, >= "
                         f"{MIN_SCRAPE_PERIOD_S:g} (the stalls' cost grows as 1 / period: 1e-9 s did not finish)")


def label_times(arrival: np.ndarray, first_token: np.ndarray, finish: np.ndarray, adapter: np.ndarray,
                horizon: float) -> np.ndarray:
    """Sorted times (s) at which a (waiting adapters, running adapters) pair not seen before occurs.

    A request with an adapter (``adapter >= 0``) is waiting from its arrival to its first token
    and running from then to its finish (engine times; NaN or after ``horizon``: not yet). The
    sets are recorded after all changes at one instant (one engine step's outputs).

    The events are sorted by time (arrivals, then first tokens, then finishes at one instant); each
    adapter's waiting and running counts after every event are per-adapter cumulative sums, and only
    the events where a count passes through zero change the sets: the walk visits those alone (an
    overloaded hour has about a million events and a few thousand such changes). An instant without
    one leaves the pair of the instant before, already seen. A test compares it with the plain walk
    over every event."""
    n = len(arrival)
    idx = np.arange(n)
    adapter = np.asarray(adapter)
    has = (adapter >= 0) & (np.asarray(arrival) <= horizon)
    times, kinds, reqs = [], [], []
    for kind, t in enumerate((arrival, first_token, finish)):
        t = np.asarray(t, float)
        m = has & np.isfinite(t) & (t <= horizon)
        times.append(t[m])
        kinds.append(np.full(int(m.sum()), kind, np.int8))
        reqs.append(idx[m])
    t_all, k_all, r_all = np.concatenate(times), np.concatenate(kinds), np.concatenate(reqs)
    m = len(t_all)
    if not m:
        return np.zeros(0, float)
    order = np.lexsort((k_all, t_all))
    t_all, k_all, a_all = t_all[order], k_all[order], adapter[r_all[order]].astype(np.int64)
    # count changes: arrival +1 waiting; first token -1 waiting +1 running; finish -1 running
    d_wait = (k_all == 0).astype(np.int64) - (k_all == 1)
    d_run = (k_all == 1).astype(np.int64) - (k_all == 2)
    by_adapter = np.argsort(a_all, kind="stable")  # each adapter's events in time order
    a_sorted = a_all[by_adapter]
    group_start = np.flatnonzero(np.r_[True, a_sorted[1:] != a_sorted[:-1]])
    group = np.cumsum(np.r_[False, a_sorted[1:] != a_sorted[:-1]])

    def toggles(delta: np.ndarray) -> np.ndarray:
        """Events after which the adapter's count is zero where it was not, or the reverse."""
        c = np.cumsum(delta[by_adapter])
        c -= (c[group_start] - delta[by_adapter][group_start])[group]  # per adapter, from 0
        after = np.empty(m, np.int64)
        after[by_adapter] = c
        return (after > 0) != (after - delta > 0)

    w_flip, r_flip = toggles(d_wait), toggles(d_run)
    sel = np.flatnonzero(w_flip | r_flip)
    ts = t_all[sel]
    last_of_instant = np.r_[ts[1:] != ts[:-1], True].tolist()
    bits = a_all[sel].tolist()
    wf, rf = w_flip[sel].tolist(), r_flip[sel].tolist()
    wmask = rmask = 0
    seen: set[tuple[int, int]] = set()
    new: list[float] = []
    for j, t in enumerate(ts.tolist()):
        bit = 1 << bits[j]
        if wf[j]:
            wmask ^= bit
        if rf[j]:
            rmask ^= bit
        if last_of_instant[j]:
            key = (wmask, rmask)
            if key not in seen:
                seen.add(key)
                new.append(t)
    return np.asarray(new, float)


def stall_windows(new_label_t: np.ndarray, s_per_label: float, period_s: float,
                  until: float) -> tuple[np.ndarray, np.ndarray]:
    """Start and end times (s) of the scrapes up to ``until``: the first at 0, each next
    ``period_s`` after the previous one's end, each lasting ``s_per_label`` x the series
    created before its start (``new_label_t`` sorted)."""
    starts, ends = [], []
    t = 0.0
    while t <= until:
        b = s_per_label * int(np.searchsorted(new_label_t, t, side="left"))
        starts.append(t)
        ends.append(t + b)
        t = t + b + period_s
    return np.asarray(starts, float), np.asarray(ends, float)


def delay_past_stalls(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """``t`` moved to the end of the stall it falls in (``starts[k] <= t < ends[k]``), else kept."""
    t = np.asarray(t, float)
    k = np.searchsorted(starts, t, side="right") - 1
    kk = np.maximum(k, 0)
    inside = (k >= 0) & (t < ends[kk])
    return np.where(inside, ends[kk], t)


class ClientPath(NamedTuple):
    """The client-observed path of a run (:func:`client_path`): per request the first token and the
    finish as the client sees them (s), the stall's figures, the scrapes' start and end times and each
    request's shift (its arrival fell into a stall: its engine timeline moves by that much)."""

    first_token: np.ndarray
    finish: np.ndarray
    stats: dict[str, float]
    starts: np.ndarray
    ends: np.ndarray
    shift: np.ndarray | None


def client_path(arrival: np.ndarray, first_token: np.ndarray, finish: np.ndarray, adapter: np.ndarray,
                horizon: float, frontend_s: float, s_per_label: float,
                period_s: float = SCRAPE_PERIOD_S) -> ClientPath:
    """Client-observed first token and finish (s) of every request, the stall's figures and its windows.

    The engine times moved past the scrape stalls (the module docstring), plus ``frontend_s``.
    With ``s_per_label`` 0 this is exactly ``first_token + frontend_s, finish + frontend_s``, and
    there are no windows."""
    check_scrape(s_per_label, period_s)
    ft = np.asarray(first_token, float)
    fn = np.asarray(finish, float)
    none = np.zeros(0)
    if s_per_label == 0.0:
        if frontend_s == 0.0:  # the engine's own arrays, read only: no copy of two request columns
            return ClientPath(ft, fn, {}, none, none, None)
        return ClientPath(ft + frontend_s, fn + frontend_s, {}, none, none, None)
    labels = label_times(arrival, ft, fn, adapter, horizon)
    if not math.isfinite(horizon):  # a run to completion: scrapes until the last event
        ev = np.concatenate([np.asarray(arrival, float), ft, fn])
        ev = ev[np.isfinite(ev)]
        horizon = float(ev.max()) if len(ev) else 0.0
    starts, ends = stall_windows(labels, s_per_label, period_s, horizon)
    arr = np.asarray(arrival, float)
    shift = delay_past_stalls(arr, starts, ends) - arr
    with np.errstate(invalid="ignore"):
        ft_c = delay_past_stalls(ft + shift, starts, ends) + frontend_s
        fn_c = delay_past_stalls(fn + shift, starts, ends) + frontend_s
    stats = {"scrape_label_series": float(len(labels)), "scrape_stall_max_ms": float((ends - starts).max()) * 1000,
             "scrape_stall_share": float((ends - starts).sum()) / max(horizon, 1e-9)}
    return ClientPath(ft_c, fn_c, stats, starts, ends, shift)


def client_times(arrival: np.ndarray, first_token: np.ndarray, finish: np.ndarray, adapter: np.ndarray,
                 horizon: float, frontend_s: float, s_per_label: float,
                 period_s: float = SCRAPE_PERIOD_S) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Client-observed first token and finish (s) of every request, and the stall's figures
    (:func:`client_path` without its windows)."""
    p = client_path(arrival, first_token, finish, adapter, horizon, frontend_s, s_per_label, period_s)
    return p.first_token, p.finish, p.stats


def step_end_times(t_start: np.ndarray, t_end: np.ndarray, n_steps: np.ndarray,
                   run_ends: "dict[int, list[float]] | None" = None) -> np.ndarray:
    """The end time of every engine step from the recorder's segments (a segment of ``k`` steps
    from ``t_start`` to ``t_end``): a segment's last step ends at ``t_end`` exactly (the engine's
    clock there, where first tokens and finishes are stamped); the steps before it end at
    ``run_ends[i]`` (:meth:`twin.recorder.Recorder.run_step_ends`: the clock stepping one iteration at a
    time passes through, so a stall boundary between two steps counts the same tokens however the steps
    were grouped), else, for a segment without them, are spaced evenly."""
    k = np.asarray(n_steps, np.int64)
    if not len(k):
        return np.zeros(0)
    seg = np.repeat(np.arange(len(k)), k)
    j = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k) + 1  # 1..k within each segment
    t0, t1 = np.asarray(t_start, float)[seg], np.asarray(t_end, float)[seg]
    ends = t0 + (t1 - t0) * (j / k[seg])
    last = j == k[seg]
    ends[last] = t1[last]
    if run_ends:
        first = np.cumsum(k) - k  # each segment's first step
        for i, e in run_ends.items():
            ends[first[i]:first[i] + len(e)] = e
    return ends


def merged_gaps(first_token: np.ndarray, finish: np.ndarray, shift: np.ndarray | None, starts: np.ndarray,
                ends: np.ndarray, step_end: np.ndarray, step_outputs: np.ndarray,
                chunk_size: int = OUTPUT_PROC_CHUNK_SIZE) -> np.ndarray:
    """Per request: the inter-token gaps its client does not see, because tokens emitted during a
    scrape stall reach it merged into one streamed chunk.

    A request emits a token at every step end from its first token to its finish (engine times;
    ``step_end`` sorted, ``step_outputs`` the requests with a token in each step). While the API
    server's event loop writes ``/metrics``, the engine core keeps stepping and its outputs queue
    up; when the loop resumes, AsyncLLM's output handler (``vllm/v1/engine/async_llm.py``,
    ``_run_output_handler``) processes them back to back and puts each request's tokens into its
    ``RequestOutputCollector``, which merges what the stream has not taken yet. The handler
    yields to the event loop only between slices of ``VLLM_V1_OUTPUT_PROC_CHUNK_SIZE`` (128)
    outputs of one step, so the streams get to send in between only at steps with more outputs
    than that. A request's ``j`` tokens emitted inside a stall at steps of at most
    ``chunk_size`` outputs thus reach the client as one chunk: ``j - 1`` gaps fewer, their time
    folded into the chunk's gap (the gaps' sum, E2E - TTFT, is unchanged). The client's mean ITL
    (``benchmark_serving``: one ITL per chunk after the first) is ``sum(E2E - TTFT) / sum(output
    - 1 - merged)``. Requests whose first token or finish is not finite get 0; a preempted
    request is counted as emitting at every step of its life (no preemption where the stall
    matters: the module docstring)."""
    ft = np.asarray(first_token, float)
    fn = np.asarray(finish, float)
    n = len(ft)
    lost = np.zeros(n, np.int64)
    if not len(starts) or not len(step_end):
        return lost
    sh = np.zeros(n) if shift is None else np.asarray(shift, float)
    ok = np.isfinite(ft) & np.isfinite(fn) & np.isfinite(sh)
    small = (np.asarray(step_outputs) <= chunk_size).astype(np.int64)
    cum = np.concatenate([[0], np.cumsum(small)])  # small-step ends before index i
    step_end = np.asarray(step_end, float)
    idx = np.flatnonzero(ok)
    F, E, S = ft[idx], fn[idx], sh[idx]
    # only the stalls during which a step of at most chunk_size outputs ends can merge anything (in a
    # request's engine time a stall [s, e) is [s - S, e - S), S >= 0: look back by the largest shift)
    small_end = step_end[small.astype(bool)]
    back = float(S.max()) if len(S) else 0.0
    rel = np.flatnonzero(np.searchsorted(small_end, ends, side="left")
                         > np.searchsorted(small_end, np.asarray(starts) - back, side="left"))
    if not len(rel):
        return lost
    # those stalls that overlap the request's emitting life, in its own (shifted) engine time
    k_lo = np.searchsorted(ends, F + S, side="right")  # the first stall ending after F
    k_hi = np.searchsorted(starts, E + S, side="right") - 1  # the last one starting at or before E
    p_lo = np.searchsorted(rel, k_lo, side="left")
    cnt = np.maximum(np.searchsorted(rel, k_hi, side="right") - p_lo, 0)
    if not cnt.sum():
        return lost
    r = np.repeat(np.arange(len(idx)), cnt)
    k = rel[np.repeat(p_lo, cnt) + (np.arange(int(cnt.sum())) - np.repeat(np.cumsum(cnt) - cnt, cnt))]
    a = np.maximum(starts[k] - S[r], F[r])  # emissions in [a, b), and the finish itself when it is inside
    b = ends[k] - S[r]
    i_lo = np.searchsorted(step_end, a, side="left")
    i_hi = np.where(b > E[r], np.searchsorted(step_end, E[r], side="right"), np.searchsorted(step_end, b, side="left"))
    j = cum[np.maximum(i_hi, i_lo)] - cum[i_lo]  # emissions at steps of at most chunk_size outputs
    lost[idx] = np.bincount(r, weights=np.maximum(j - 1, 0), minlength=len(idx)).astype(np.int64)
    return lost
