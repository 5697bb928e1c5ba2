"""Per-request and per-step records, and the run summary.

Definitions (as vLLM's ``benchmark_serving`` computes them, over *finished* requests):

* TTFT = first token time - arrival; E2E = finish - arrival;
* the *client-observed* times add the run's front-end latency ``e.frontend_s`` (the request's path
  outside the engine, API server and client; :func:`twin.simulate.simulate`'s ``frontend_s``,
  default 0) to the first token and the finish: TTFT and E2E grow by it, TPOT and ITL do not;
* with ``e.scrape_s_per_label`` set, the client-observed times are also moved past the stalls of
  the server's metrics scrape (:mod:`twin.scrape_stall`): TTFT and E2E grow, and the client's
  TPOT and mean ITL follow the moved first token and finish;
* TPOT (per request) = (E2E - TTFT) / (output tokens - 1), requests with >= 2 tokens;
* ITL = time between consecutive tokens of a request. The mean ITL over all tokens of
  finished requests is ``sum(E2E - TTFT) / sum(output - 1)`` (exact); with the scrape stall, the
  client counts one gap per streamed chunk, and tokens a stall held back arrive as one chunk, so
  the denominator drops by the merged gaps (:func:`twin.scrape_stall.merged_gaps`;
  ``itl_merged_gap_share``). ITL percentiles come
  from the step durations weighted by the decode tokens each step emitted (all requests,
  plus the gaps after preemptions); this is exact for the token population of the run as the
  engine emits it (the chunks a scrape stall merges are not in them).
* queueing delay = first scheduled - arrival; load wait = time the request's own adapter
  load held its first step.
* adapter hit, per request: its adapter was resident (in a GPU slot, not still loading, not
  loaded by the step that admits the request) when the request was first admitted; ``adapter_hit_rate_requests`` is the share of admitted
  requests with an adapter that hit. ``adapter_hit_rate`` counts *activations* instead (an
  adapter joining a batch it was not in): hits / activations; a request whose adapter is
  already in the batch is no activation, so the request-level rate is the higher one.
* GPU busy fraction = time in engine steps (adapter loads on a step's path included) /
  simulated time; a continuously batching server steps whenever any request is in flight,
  so this is the share of time with work, not of compute capacity used.
* link utilization = time the host-to-GPU link carries adapter loads / simulated time.

Every summary key, with its unit, is listed in README.md ("Metrics").

The step records themselves (segments of identical decode steps) are kept by
:class:`twin.recorder.Recorder`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from twin.interfaces import policy_stats
from twin.requests import FINISHED, REJECT_REASONS, REJECTED
from twin.scrape_stall import client_path, merged_gaps, step_end_times

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    from twin.engine import Engine

def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """Quantile ``q`` of ``values`` repeated ``weights`` times (inverted-CDF definition)."""
    if len(values) == 0 or weights.sum() == 0:
        return float("nan")
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    cw = np.cumsum(w)
    idx = int(np.searchsorted(cw, q * cw[-1], side="left"))
    return float(v[min(idx, len(v) - 1)])


def outcomes(e: "Engine") -> np.ndarray:
    """Per request: 0 not arrived (at or after the horizon: the engine stops there before it takes in the arrivals
    due then), 1 finished, 2 rejected, 3 unfinished."""
    out = np.full(e.n, 3, np.int8)
    out[e.state == FINISHED] = 1
    out[e.state == REJECTED] = 2
    if e.horizon != float("inf"):
        out[e.arrival >= e.horizon] = 0
    else:
        out[e.arrival > e.env.now] = 0
    return out


def arrival_window(e: "Engine", oc: np.ndarray) -> float | None:
    """The span the arrivals were offered over (s): the horizon when the run has one, else the last arrival's time
    (a run without a horizon drains its queue after the last arrival; that tail offers nothing). A replayed trace's
    ``--rps`` is its mean rate over the trace's whole span, so the window it replays can offer more or less:
    ``offered_rps`` says what it did. None when the arrivals span no time (every request at t = 0, no horizon):
    a burst has no rate (a 1 s stand-in read as an offered load below the throughput)."""
    if e.horizon != float("inf"):
        w = float(e.horizon)
    else:
        arrived = e.arrival[oc != 0]
        w = float(arrived.max()) if len(arrived) else 0.0
    return w if w > 0 else None


OUTCOME_NAMES = np.array(["not_arrived", "finished", "rejected", "unfinished"], dtype=object)


def client_times(e: "Engine") -> tuple[np.ndarray, np.ndarray]:
    """Per request: the client-observed first token and finish (s). The engine's times plus the
    front-end latency ``e.frontend_s``, moved past the metrics scrape's stalls when
    ``e.scrape_s_per_label`` is set (:mod:`twin.scrape_stall`); computed once per run, together
    with the gaps the stalls merge into one streamed chunk (:func:`merged_gap_counts`)."""
    cached = getattr(e, "_client_times", None)
    if cached is not None:
        return cached
    p = client_path(e.arrival, e.first_token, e.finish, e.adapter, e.horizon, e.frontend_s,
                    e.scrape_s_per_label, e.scrape_period_s)
    e._client_times = (p.first_token, p.finish)
    e._scrape_stats = dict(p.stats)
    lost = None
    seg = e.rec.segments() if len(p.starts) else None
    if seg is not None:
        t0, t1, k, n_dec = seg
        lost = merged_gaps(e.first_token, e.finish, p.shift, p.starts, p.ends,
                           step_end_times(t0, t1, k, e.rec.run_step_ends(t0)), np.repeat(n_dec, k))
    e._merged_gaps = lost
    return e._client_times


def merged_gap_counts(e: "Engine") -> np.ndarray | None:
    """Per request: the inter-token gaps its client does not see because a scrape stall merged its
    tokens into one streamed chunk (:func:`twin.scrape_stall.merged_gaps`); None without the stall."""
    client_times(e)
    return e._merged_gaps


def requests_frame(e: "Engine") -> "pd.DataFrame":
    """One row per request of the workload with its outcome and latencies."""
    import pandas as pd

    oc = outcomes(e)
    ft_c, fn_c = client_times(e)  # client-observed times: the path outside the engine
    ttft = ft_c - e.arrival
    e2e = fn_c - e.arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(e.output > 1, (fn_c - ft_c) / (e.output - 1), np.nan)
    reason = np.array(REJECT_REASONS, dtype=object)[e.reject_reason]
    reason[oc == 0] = ""
    code = e._drop_code
    dropped = np.array(e.drop_reason_names, dtype=object)[code] if code is not None else np.full(e.n, "", object)
    return pd.DataFrame({
        "request_id": e.request_id,
        "arrival_s": e.arrival,
        "adapter_id": np.where(e.adapter >= 0, e.adapter_ids[np.maximum(e.adapter, 0)] if e.n_adapters else -1, -1),
        "adapter_rank": e.rank,
        "prompt_tokens": e.prompt,
        "output_tokens": e.output,
        "outcome": OUTCOME_NAMES[oc],
        "reject_reason": reason,
        "drop_reason": dropped,
        "first_scheduled_s": e.first_sched,
        "first_token_s": ft_c,
        "finish_s": fn_c,
        "ttft_s": ttft,
        "e2e_s": e2e,
        "tpot_s": tpot,
        "queue_s": e.first_sched - e.arrival,
        "load_wait_s": e.load_wait,
        "preemptions": e.preemptions,
        "tokens_emitted": e.emitted,
        "adapter_hit": adapter_hits(e),
    })


def dropped_requests(e: "Engine") -> dict[str, Any]:
    """``requests_dropped``: the unfinished requests that failed before the server's queue (e.g. at a client
    with an in-flight cap, ``fcfs+client-cap``; ``EngineView.drop_arrivals``), and ``drop_reasons``, their
    count by reason (empty when none)."""
    code = e._drop_code
    if code is None:
        return {"requests_dropped": 0, "drop_reasons": {}}
    counts = np.bincount(code, minlength=len(e.drop_reason_names))
    return {"requests_dropped": int(counts[1:].sum()),
            "drop_reasons": {why: int(c) for why, c in zip(e.drop_reason_names[1:], counts[1:].tolist()) if c}}


def adapter_hits(e: "Engine") -> "pd.arrays.BooleanArray":
    """Per request: True when its adapter was resident (in a GPU slot, not still loading, not loaded
    by the admitting step) at its first admission, False when it had to be loaded, NA when never admitted or without adapter."""
    import pandas as pd

    code = np.frombuffer(bytes(e.adapter_hit_code), np.uint8)
    return pd.arrays.BooleanArray(code == 1, code == 0)


def _stats(x: np.ndarray, prefix: str, out: dict[str, Any], scale: float = 1000.0) -> None:
    x = x[np.isfinite(x)]
    out[f"{prefix}_mean"] = float(np.mean(x)) * scale if len(x) else None
    for q in (50, 90, 99):
        out[f"{prefix}_p{q}"] = float(np.percentile(x, q)) * scale if len(x) else None


def summarize(e: "Engine", wall_s: float, ttft_slo_s: float | None = None,
              tbt_slo_s: float | None = None) -> dict[str, Any]:
    """The run summary (keys documented in README.md); numpy only, no per-request table."""
    oc = outcomes(e)
    fin = oc == 1
    arrived = int(np.count_nonzero(oc))
    window = e.horizon if e.horizon != float("inf") else float(e.env.now)
    # a run that spent no simulated time (every request at t = 0 and rejected; no request): its rates have no window
    # (None, not a 1 s stand-in that read as a run of 1 s)
    timed = window > 0
    n_fin = int(np.count_nonzero(fin))
    rej = oc == 2
    reasons = np.bincount(e.reject_reason[rej], minlength=len(REJECT_REASONS))
    s: dict[str, Any] = {
        "requests_arrived": arrived,
        "requests_finished": n_fin,
        "requests_rejected": int(np.count_nonzero(rej)),
        "requests_unfinished": int(np.count_nonzero(oc == 3)),
        "requests_not_arrived": int(np.count_nonzero(oc == 0)),
        "reject_reasons": {REJECT_REASONS[i]: int(c) for i, c in enumerate(reasons) if c},
        **dropped_requests(e),
        "simulated_s": float(window),
        "throughput_rps": n_fin / window if timed else None,
        "offered_rps": arrived / span if (span := arrival_window(e, oc)) else None if arrived else 0.0,
        "input_tok_s": float(e.prompt[fin].sum()) / window if timed else None,
        "output_tok_s": float(e.output[fin].sum()) / window if timed else None,
    }
    s["total_tok_s"] = s["input_tok_s"] + s["output_tok_s"] if timed else None
    ft_c, fn_c = client_times(e)  # client-observed first token and finish (the module docstring)
    arr, ft, fn, out = e.arrival[fin], ft_c[fin], fn_c[fin], e.output[fin]
    ttft = ft - arr
    _stats(ttft, "ttft_ms", s)
    multi = out > 1
    denom = float((out[multi] - 1).sum())
    lost = merged_gap_counts(e)
    if lost is not None:  # the client's chunks: gaps merged by the scrape stalls are one gap
        merged = float(lost[fin][multi].sum())
        s["itl_merged_gap_share"] = merged / denom if denom else 0.0
        denom -= merged
    s["itl_ms_mean"] = float((fn[multi] - ft[multi]).sum()) / denom * 1000 if denom else None
    d, w = e.rec.itl_samples()
    if e.gap_itl:
        d = np.concatenate([d, np.asarray(e.gap_itl)])
        w = np.concatenate([w, np.ones(len(e.gap_itl), np.int64)])
    for q in (50, 90, 99):
        v = weighted_quantile(d, w, q / 100)
        s[f"itl_ms_p{q}"] = v * 1000 if v == v else None
    tpot = (fn[multi] - ft[multi]) / (out[multi] - 1)
    _stats(tpot, "tpot_ms", s)
    _stats(fn - arr, "e2e_ms", s)
    _stats(e.first_sched[fin] - arr, "queue_ms", s)
    # the published adapter twin's TTFT: unfinished requests count as the window length
    sent = arrived - s["requests_rejected"]
    s["ttft_ms_incl_unfinished"] = (float(ttft.sum() * 1000 + (sent - n_fin) * window * 1000) / sent) if sent else None
    if ttft_slo_s is not None or tbt_slo_s is not None:
        ok = np.ones(n_fin, bool)
        if ttft_slo_s is not None:
            ok &= ttft <= ttft_slo_s
        if tbt_slo_s is not None:
            tp = np.where(out > 1, (fn - ft) / np.maximum(out - 1, 1), 0.0)
            ok &= tp <= tbt_slo_s
        s["slo_attainment"] = float(ok.sum()) / sent if sent else None  # (no request sent: none met or missed them)
        s["goodput_rps"] = float(ok.sum()) / window if timed else None
        s["ttft_slo_s"], s["tbt_slo_s"] = ttft_slo_s, tbt_slo_s
    s.update(e._scrape_stats)  # the scrape stall's figures, when it is modelled
    ad = e.adapters
    s["adapter_activations"] = int(ad.activations)
    s["adapter_hit_rate"] = (ad.hits / ad.activations) if ad.activations else None
    code = np.frombuffer(bytes(e.adapter_hit_code), np.uint8)
    hits, misses = int(np.count_nonzero(code == 1)), int(np.count_nonzero(code == 2))
    s["adapter_hit_rate_requests"] = hits / (hits + misses) if hits + misses else None
    s["adapter_loads"] = int(ad.loads_cpu + ad.loads_disk)
    s["adapter_loads_from_cpu"] = int(ad.loads_cpu)
    s["adapter_loads_from_disk"] = int(ad.loads_disk)
    s["adapter_reloads_in_batch"] = int(ad.reloads)  # of adapter_loads: vLLM's activation order (policies/lru.py)
    s["adapter_evictions"] = int(ad.evictions)
    s["link_gb"] = e.link.bytes_moved / 1e9
    s["link_utilization"] = min(1.0, e.link.busy_s / window) if timed else None
    s["disk_utilization"] = min(1.0, ad.disk.busy_by(window) / window) if timed else None
    s["gpu_busy_fraction"] = min(1.0, e.rec.busy_time() / window) if timed else None
    s["preemptions"] = int(e.rec.preemptions)
    s["engine_steps"] = int(e.rec.n_steps)
    s["step_segments"] = int(e.rec.n_segments)
    s["kv_capacity_tokens"] = int(e.kv_tokens)
    # the extensions' and the policies' counters (twin/extensions.py); without extensions, the policies'
    # alone (a plug-in's counters were dropped on the default path)
    extra = e.extensions.stats() if e.extensions is not None else {**policy_stats(e.cache), **policy_stats(e.scheduler)}
    if extra:
        clash = sorted(str(k) for k in extra if k in s or k in ("policy", "system", "scheduler", "cache", "profile"))
        if clash:  # (a policy's stats() replaced the run's own requests_arrived, policy, ... without a word)
            raise ValueError(f"a policy's or extension's stats() returns {', '.join(clash)}, which would replace the "
                             f"run's own summary field(s); give its counters other names (e.g. prefixed with the "
                             f"policy's name)")
        s.update(extra)
    s["wall_s"] = float(wall_s)
    s["x_realtime"] = float(window / wall_s) if wall_s > 0 else None
    return s
