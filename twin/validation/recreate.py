"""Re-creating one real run from its configuration alone (:func:`simulate_run`).

* the profile of the run's model (:mod:`twin.validation.profiles`);
* ``served_adapters`` adapters, ranks from ``ranks`` round-robin (``8-8-16``: adapter ``i``
  has rank ``ranks[i % 3]``); per-adapter Poisson rates from ``rates`` assigned round-robin and
  then shuffled independently of the ranks (the real client, ``benchmark_serving_by_time.py``);
* ``adapter_slots`` GPU slots (``max_loras``), ``max_cpu_loras`` CPU slots, ``max_lora_rank``;
* the engine settings of the runs (:func:`build_config`): chunked prefill with 2048 batched
  tokens, ``max_num_seqs`` 2048, default ``max_model_len``, prefix caching off;
* a 3600 s window: arrivals in ``[0, 3600)``, requests in flight at 3600 s are cancelled
  (unfinished, not counted as successful);
* the stalls of the client-observed path while the server writes its metrics for the client's
  scrape every 2 s (``spec.scrape_s_per_label``, :data:`twin.validation.specs.SCRAPE_S_PER_LABEL`,
  :mod:`twin.scrape_stall`);
* request lengths drawn from a ShareGPT-like distribution (the shared ``lengths/`` histograms
  under the real runs' filters) whose means match the run's prompt-pool means
  (``pool_mean_input_tokens`` / ``pool_mean_output_tokens``);
* vLLM's FCFS and LRU behind the real client's in-flight cap, adapters in the CPU tier from
  start-up (the registered scheduler ``fcfs+client-cap``, :mod:`policies.client_cap`);
* the requests' front-end path outside the engine (``spec.frontend_s``,
  :data:`twin.validation.specs.FRONTEND_LATENCY_S`): the client's TTFT and E2E include it.
* the serving path's host time per running request and step (``spec.serving_s_per_running``,
  :data:`twin.validation.specs.SERVING_S_PER_RUNNING`): every engine step includes it;
* the cost of the LoRA shrink's rank tiles beyond the first (``spec.rank_tile_cost``,
  :data:`twin.validation.specs.RANK_TILE_COST`): rank-32 slots' second tile.

**Offered load** (column ``load_basis`` of the per-run CSV). Where the run records
``requests_sent`` (the number of requests the client actually sent -- a fact about the run's
input), the twin draws exactly that many arrivals: per-adapter Poisson streams conditioned on
their total (multinomial adapter choice in proportion to the rates, uniform times); basis
``requests_sent``. Elsewhere it draws the nominal Poisson streams; basis ``nominal``. In the
overloaded runs the real client could not keep its schedule (``requests_sent`` down to 55 % of
nominal), so the nominal load would overstate what the server received.

**Start-up failures** (:func:`predict_startup`): the twin's own start-up check (the KV capacity
left after the weights and the LoRA slot buffers, from the profile, against one
``max_model_len`` request: :func:`twin.engine.check_startup`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from policies.client_cap import CLIENT_MAX_INFLIGHT
from traces.arrivals import assign_rates_round_robin, parse_arrival, per_adapter_arrivals
from traces.datadir import require
from traces.lengths import SHAREGPT_FILTER, ShareGPTLengths
from traces.workload import Workload
from twin.config import EngineConfig
from twin.requests import StartupError, check_startup
from twin.perf.profile import Profile
from twin.registry import make_cache, make_scheduler
from twin.simulate import simulate
from twin.validation.metrics import METRICS
from twin.validation.profiles import cached_profile
from twin.validation.specs import REAL_MAX_BATCHED_TOKENS, START_FAILURE_STATUSES, RunSpec

#: The registered scheduler that stands for the real runs' server and client.
SCHEDULER = "fcfs+client-cap"

_LENGTH_MODELS: dict[tuple[float, float, float], ShareGPTLengths] = {}


def sharegpt_model(mean_in: float, mean_out: float, corr: float = 0.0) -> ShareGPTLengths:
    """ShareGPT-like length model with the given means (cached per pair of means).

    Uses :func:`traces.lengths.sharegpt_like`'s model (the committed CDF knots); when those
    are not committed, builds the same model from the data directory's ``lengths/``
    histograms (:func:`sharegpt_from_histograms`), under the real runs' filters. ``corr``: the
    Gaussian-copula prompt-output coupling (:data:`twin.validation.specs.PROMPT_OUTPUT_CORR`).
    """
    key = (round(mean_in, 6), round(mean_out, 6), float(corr))
    m = _LENGTH_MODELS.get(key)
    if m is not None:
        return m
    try:
        base = ShareGPTLengths.from_json(filt=SHAREGPT_FILTER)
    except FileNotFoundError:
        base = sharegpt_from_histograms()
    m = base.solve(mean_in, mean_out)
    if corr:
        m = replace(m, prompt_output_corr=float(corr))
    _LENGTH_MODELS[key] = m
    return m


def _histogram_knots(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Piecewise-linear CDF knots through the bin edges of ``lengths/<name>``."""
    h = pd.read_csv(require(f"lengths/{name}"))
    x = np.concatenate(([h["bin_lo_tokens"].iloc[0]], h["bin_hi_tokens"].to_numpy(float)))
    F = np.concatenate(([0.0], np.cumsum(h["count_approx"].to_numpy(float))))
    return x, F / F[-1]


def sharegpt_from_histograms() -> ShareGPTLengths:
    """The ShareGPT-like model straight from the data directory's ``lengths/*_hist.csv``."""
    return ShareGPTLengths(_histogram_knots("sharegpt_prompt_hist.csv"), _histogram_knots("sharegpt_output_hist.csv"),
                           SHAREGPT_FILTER)


def build_workload(spec: RunSpec) -> tuple[Workload, str]:
    """The run's workload: per-adapter Poisson arrivals in the window (or the spec's other ``arrival``
    process, a sweep's) and ShareGPT-like lengths.

    Returns ``(workload, load_basis)``; see the module docstring for the offered load."""
    rng = np.random.default_rng(spec.seed)
    n_ad = spec.served
    ranks = np.asarray(spec.ranks, np.int64)[np.arange(n_ad) % len(spec.ranks)]
    ad_rate = assign_rates_round_robin(spec.rates, n_ad, rng, shuffle=True)
    process = parse_arrival(spec.arrival)
    if process.kind != "poisson":  # a sweep's bursty per-adapter streams (the real runs' client sent Poisson)
        if spec.requests_sent is not None:
            raise ValueError(f"run {spec.run_id}: arrival process {process.name} with a sent-request count; only "
                             f"Poisson streams are re-created conditioned on the count a real run sent")
        t, ids = per_adapter_arrivals(ad_rate, spec.window_s, process, rng)
        basis = "nominal"
    elif spec.requests_sent is not None:
        # per-adapter Poisson streams conditioned on their total = requests_sent
        n = int(round(spec.requests_sent))
        ids = rng.choice(n_ad, size=n, p=ad_rate / ad_rate.sum())
        basis = "requests_sent"
    else:
        counts = rng.poisson(ad_rate * spec.window_s)
        ids = np.repeat(np.arange(n_ad, dtype=np.int64), counts)
        basis = "nominal"
    if process.kind == "poisson":
        t = rng.uniform(0.0, spec.window_s, size=ids.size)
        order = np.argsort(t, kind="stable")
        t, ids = t[order], ids[order].astype(np.int64)
    p, o = sharegpt_model(spec.mean_in, spec.mean_out, spec.length_corr).sample(t.size, rng)
    wl = Workload.from_arrays(t, p, o, ids, ranks[ids],
                              meta={"source": "validation", "run": spec.run_id, "load_basis": basis})
    return wl, basis


def build_config(spec: RunSpec) -> EngineConfig:
    """The engine settings of the real runs (see the module docstring)."""
    return EngineConfig(max_num_batched_tokens=REAL_MAX_BATCHED_TOKENS, max_num_seqs=spec.max_num_seqs, block_size=16,
                        enable_lora=True, max_loras=spec.slots, max_cpu_loras=max(spec.cpu_slots, spec.slots),
                        max_lora_rank=spec.max_rank, max_model_len=None, served_adapters=spec.served)


def predict_startup(spec: RunSpec, profile: Profile) -> tuple[bool, int, str]:
    """The twin's start-up check for the run: ``(starts, kv_tokens, message)``."""
    kv = int(profile.kv_capacity_tokens(spec.slots, spec.max_rank))
    try:
        check_startup(kv, profile.model.max_model_len, spec.slots, spec.max_rank)
    except StartupError as e:
        return False, kv, str(e)
    return True, kv, ""


def _time_averages(steps: pd.DataFrame, window_s: float, block_size: int, kv_tokens: int) -> dict[str, float]:
    """Mean running requests and KV usage over the window (idle time counts as 0), like the real
    runs' gauges; empty when the engine never stepped."""
    busy = float(steps["duration_s"].sum()) if len(steps) else 0.0
    if busy <= 0:
        return {}
    return {"twin_mean_running": float((steps["batch_size"] * steps["duration_s"]).sum()) / window_s,
            "twin_mean_kv_usage": float((steps["kv_blocks_used"] * steps["duration_s"]).sum()) * block_size / (
                window_s * max(kv_tokens, 1))}


def simulate_run(spec: RunSpec, profile_name: str | None = None,
                 client_cap: int | None = CLIENT_MAX_INFLIGHT, preload_cpu: bool = True) -> dict[str, Any]:
    """Re-create one run; returns the twin's figures (``twin_<metric>``) and run facts."""
    prof = cached_profile(profile_name)
    out: dict[str, Any] = {"run_id": spec.run_id, "profile": prof.name, "seed": spec.seed}
    ok, kv, msg = predict_startup(spec, prof)
    out["twin_kv_tokens"] = kv
    out["twin_starts"] = ok
    if not ok:
        out["twin_status"] = "start_failure"
        return out
    if spec.real_status in START_FAILURE_STATUSES:  # a failure the twin misses: nothing served to compare with
        out["twin_status"] = "starts"
        return out
    t0 = time.perf_counter()
    wl, basis = build_workload(spec)
    cfg = build_config(spec)
    sched = make_scheduler(SCHEDULER, client_cap=client_cap, preload_cpu=preload_cpu)
    res = simulate(wl, prof, cfg, scheduler_obj=sched, cache_obj=make_cache("lru"), horizon_s=spec.window_s,
                   record_steps=True, frontend_s=spec.frontend_s, scrape_s_per_label=spec.scrape_s_per_label,
                   serving_s_per_running=spec.serving_s_per_running, rank_tile_cost=spec.rank_tile_cost)
    s = res.summary
    out.update(_time_averages(res.steps, spec.window_s, cfg.block_size, s["kv_capacity_tokens"]))
    out.update(twin_status="ok", load_basis=basis, twin_requests=len(wl), twin_finished=s["requests_finished"],
               twin_unfinished=s["requests_unfinished"], twin_rejected=s["requests_rejected"],
               twin_client_failed=sched.n_dropped, client_cap=client_cap or 0,
               twin_preemptions=s["preemptions"], twin_adapter_loads=s["adapter_loads"],
               twin_engine_steps=s["engine_steps"], sim_wall_s=time.perf_counter() - t0)
    for m in METRICS:
        v = s.get(m.twin)
        out[f"twin_{m.name}"] = float(v) if v is not None else np.nan
    return out
