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
  (:func:`delay_past_stalls`). The front-end latency is added after.

What is not modelled: preempted requests going back to the waiting set (no queue, no
preemption where the stall matters), and the exposition's fixed part (the other metrics, ~10 ms
per scrape in the calibration runs, which the front-end latency already absorbs on average).
The seconds per series are fitted on the fit split (:mod:`twin.validation.scrape_stall`).
"""

from __future__ import annotations

import math

import numpy as np

#: The real client's scrape period (s): it sleeps this long after each answer (the calibration
#: runs' Prometheus windows last 2.006-2.013 s, median 2.009 s, of which ~10 ms is the scrape).
SCRAPE_PERIOD_S = 2.0


def check_scrape(s_per_label: float, period_s: float) -> None:
    """``ValueError`` naming the bad setting (both must be finite; seconds per series >= 0, period > 0)."""
    if not (math.isfinite(s_per_label) and s_per_label >= 0.0):
        raise ValueError(f"scrape_s_per_label {s_per_label!r}: give the scrape's seconds per label series, >= 0 "
                         f"(0: no scrape stall)")
    if not (math.isfinite(period_s) and period_s > 0.0):
        raise ValueError(f"scrape_period_s {period_s!r}: give the client's scrape period in seconds, > 0")


def label_times(arrival: np.ndarray, first_token: np.ndarray, finish: np.ndarray, adapter: np.ndarray,
                horizon: float) -> np.ndarray:
    """Sorted times (s) at which a (waiting adapters, running adapters) pair not seen before occurs.

    A request with an adapter (``adapter >= 0``) is waiting from its arrival to its first token
    and running from then to its finish (engine times; NaN or after ``horizon``: not yet). The
    sets are recorded after all changes at one instant (one engine step's outputs)."""
    n = len(arrival)
    idx = np.arange(n)
    has = (np.asarray(adapter) >= 0) & (np.asarray(arrival) <= horizon)
    times, kinds, reqs = [], [], []
    for kind, t in enumerate((arrival, first_token, finish)):
        t = np.asarray(t, float)
        m = has & np.isfinite(t) & (t <= horizon)
        times.append(t[m])
        kinds.append(np.full(int(m.sum()), kind, np.int8))
        reqs.append(idx[m])
    t_all, k_all, r_all = np.concatenate(times), np.concatenate(kinds), np.concatenate(reqs)
    order = np.lexsort((k_all, t_all))
    t_all, k_all, a_all = t_all[order], k_all[order], np.asarray(adapter)[r_all[order]]
    waiting: dict[int, int] = {}
    running: dict[int, int] = {}
    wmask = rmask = 0
    seen: set[tuple[int, int]] = set()
    new: list[float] = []
    m = len(t_all)
    i = 0
    while i < m:
        t = t_all[i]
        while i < m and t_all[i] == t:
            a, kind = int(a_all[i]), k_all[i]
            bit = 1 << a
            if kind == 0:  # arrival: waiting
                waiting[a] = waiting.get(a, 0) + 1
                wmask |= bit
            elif kind == 1:  # first token: waiting -> running
                waiting[a] -= 1
                if not waiting[a]:
                    wmask &= ~bit
                running[a] = running.get(a, 0) + 1
                rmask |= bit
            else:  # finish
                running[a] -= 1
                if not running[a]:
                    rmask &= ~bit
            i += 1
        key = (wmask, rmask)
        if key not in seen:
            seen.add(key)
            new.append(float(t))
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


def client_times(arrival: np.ndarray, first_token: np.ndarray, finish: np.ndarray, adapter: np.ndarray,
                 horizon: float, frontend_s: float, s_per_label: float,
                 period_s: float = SCRAPE_PERIOD_S) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Client-observed first token and finish (s) of every request, and the stall's figures.

    The engine times moved past the scrape stalls (the module docstring), plus ``frontend_s``.
    With ``s_per_label`` 0 this is exactly ``first_token + frontend_s, finish + frontend_s``."""
    check_scrape(s_per_label, period_s)
    ft = np.asarray(first_token, float)
    fn = np.asarray(finish, float)
    if s_per_label == 0.0:
        if frontend_s == 0.0:  # the engine's own arrays, read only: no copy of two request columns
            return ft, fn, {}
        return ft + frontend_s, fn + frontend_s, {}
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
    return ft_c, fn_c, stats
