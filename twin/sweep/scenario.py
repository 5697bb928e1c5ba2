"""One sweep run: re-create the published scenario for one configuration and simulate it.

This is the ONLY module of :mod:`twin.sweep` / :mod:`twin.configurator` that imports the
validation helpers (``twin validate`` re-creates the real runs; the sweep re-creates the same
kind of run for configurations nobody measured). When ``twin/validate.py`` moves to
``twin/validation/``, change the one import block below.

A run is the scenario of the published adapter twin: ``served`` adapters, per-adapter Poisson
rates from the rate triple round-robin (then shuffled), ranks from the rank triple round-robin,
ShareGPT-like lengths with the given means, a ``window_s`` arrival window with requests in flight
at its end cancelled, vLLM's start-up check, the real client's in-flight cap and CPU preload
(the ``fcfs+client-cap`` scheduler with LRU adapters), ``max_num_seqs`` 2048, chunked prefill with
2048 batched tokens.

**Run-level early stopping** (:func:`run_config` with ``early_stop=True``): the engine is built
the way :func:`twin.simulate.simulate` builds it and advanced in chunks of simulated time
(``engine.env.run(until=t)``; SimPy processes the same events in the same order, so a chunked run
is bit-identical to a whole one). Between chunks, an upper bound on the run's final total token
throughput is computed from public engine state (:func:`throughput_upper_bound`); as soon as it
is below ``ratio`` x the offered tokens the run is decided *starving* and stops. The bound is
always correct (see its docstring), so the early decision always equals the full run's; the
test ``tests/sweep/test_early_stop.py`` checks it on many seeded cases.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
import zlib
from typing import Any

import numpy as np

from twin.interfaces import explain_policy_failure
from twin.registry import make_cache, make_scheduler, resolve_policy
from twin.validation import (  # noqa: F401  (re-exported for the sweep and the configurator)
    CLIENT_MAX_INFLIGHT,
    START_FAILURE_STATUSES,
    WINDOW_S,
    RunSpec,
    build_config,
    build_workload,
    check_length_corr,
    load_real,
    profile_for_model,
    predict_startup,
    smape,
    smape_terms,
    spec_from_row,
)
from twin.perf.profile import load_profile
from twin.validation.recreate import sharegpt_model
from twin.sweep.workload_scenario import served_workload
import twin
from twin.requests import FINISHED
from twin.engine import Engine
from twin.engine_state import engine_setup, kv_at_startup, kv_capacity
from twin.requests import StartupError
from twin.metrics import summarize

#: The published scenario's policy: vLLM FCFS behind the client's in-flight cap, LRU adapters.
DEFAULT_POLICY = "fcfs+client-cap"
#: ShareGPT pool means of the published runs (input, output tokens).
DEFAULT_LENGTHS = (222.0, 197.0)
#: Throughput / offered share below which a run starves (the published optimum rule).
STARVE_RATIO = 0.9

_PROFILES: dict[str, Any] = {}
_PROFILE_HASH: dict[str, str] = {}


def get_profile(name: str | None):
    """The profile (cached per process)."""

    key = name or ""
    if key not in _PROFILES:
        _PROFILES[key] = load_profile(name)
    return _PROFILES[key]


def profile_hash(name: str | None) -> str:
    """Short SHA-256 of the profile's content (provenance of every row)."""
    key = name or ""
    if key not in _PROFILE_HASH:
        prof = get_profile(name)
        try:
            d = prof.to_dict()
        except Exception:  # noqa: BLE001
            d = prof.raw
        _PROFILE_HASH[key] = hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return _PROFILE_HASH[key]


def twin_version() -> str:
    try:
        from importlib.metadata import version

        return version("lora-twin")
    except Exception:  # noqa: BLE001

        return getattr(twin, "__version__", "unknown")


#: what :func:`twin.sweep.grid.scenario_key` appends for a policy other than the published one
POLICY_KEY_PART = "_policy_"


def workload_key(scenario_key: str) -> str:
    """The scenario key without its policy part: what decides the workload."""
    return scenario_key.split(POLICY_KEY_PART, 1)[0]


def run_seed(scenario_key: str, served: int, seed: int) -> int:
    """The seed of a run: a hash of the scenario's workload key (the key without its policy,
    :func:`workload_key`), the served adapters and the seed index.

    Independent of the slots, of the policy and of the executor, so every slot value and every
    policy of a scenario sees the same workload for a given number of served adapters (common random
    numbers: a policy comparison compares policies, not draws; before stop 51 each policy drew its
    own requests) and a run gives the same result whoever runs it."""
    return zlib.crc32(f"{workload_key(scenario_key)}|served={served}|seed={seed}".encode()) & 0x7FFFFFFF


def make_spec(scenario: dict[str, Any], served: int, slots: int, max_rank: int, seed: int,
              window_s: float, cpu_slots: int | None = None, max_num_seqs: int = 2048) -> RunSpec:
    mean_in, mean_out = scenario.get("lengths") or DEFAULT_LENGTHS
    key = scenario["key"]
    return RunSpec(run_id=f"{key}/_{slots}_{served}_{max_rank}_/seed{seed}", model=str(scenario.get("model", "")),
                   ranks=[int(r) for r in scenario["ranks"]], rates=[float(r) for r in scenario["rates"]],
                   served=int(served), slots=int(slots), max_rank=int(max_rank),
                   cpu_slots=int(cpu_slots if cpu_slots else served), max_num_seqs=int(max_num_seqs),
                   mean_in=float(mean_in), mean_out=float(mean_out), requests_sent=None, window_s=float(window_s),
                   seed=run_seed(key, served, seed), length_corr=float(scenario.get("length_corr", 0.0)),
                   arrival=str(scenario.get("arrival") or "poisson"))


def check_engine_overrides(task: dict[str, Any]) -> None:
    """The grid's ``[configs.engine]`` overrides give a configuration vLLM accepts at every
    (slots, served) pair of ``task`` (:meth:`twin.config.EngineConfig.validate`, the check
    :func:`run_config` would fail on in every run); otherwise an error naming the override."""
    engine = task.get("engine") or {}
    if not engine:
        return
    for g in task["slots"]:
        for n in task["served"]:
            if g > n:
                continue
            cfg = dataclasses.replace(build_config(make_spec(task["scenario"], n, g, task["max_rank"], task["seed"],
                                                             task["window_s"])), **engine)
            try:
                cfg.validate()
            except ValueError as e:
                raise ValueError(f"grid [configs.engine] {engine}: {e} (at {g} slots, {n} served adapters)") from None


def run_server(scenario: dict[str, Any], served: int, slots: int, max_rank: int, seed: int, window_s: float,
               profile: str | None, policy: str | None, engine_overrides: dict[str, Any] | None,
               cpu_slots: int | None = None) -> dict[str, Any]:
    """What one configuration of a scenario runs on: ``prof`` (the scenario's profile, with the grid's adapter
    targets), ``spec``, ``cfg`` (with the grid's engine overrides), ``sched`` / ``cache``, and the engine's own
    ``eng_cfg`` / ``eng_prof`` (:func:`twin.engine_state.engine_setup`: the policy's block size, tensor parallelism,
    paged adapters), which the start-up check and the early-stop bound read."""
    prof = scenario_profile(profile, scenario)
    if (engine_overrides or {}).get("lora_targets") is not None:
        # the adapters' modules: bytes, slot buffers and compute (simulate() applies them; the sweep builds its
        # Engine itself and ran the profile's targets whatever the grid said)
        prof = prof.with_lora_targets(engine_overrides["lora_targets"])
    spec = make_spec(scenario, served, slots, max_rank, seed, window_s, cpu_slots)
    cfg = build_config(spec)
    if engine_overrides:
        cfg = dataclasses.replace(cfg, **engine_overrides)
    sched, cache = _policy_objects(policy)
    eng_cfg, eng_prof = engine_setup(cfg, prof, cache)
    return {"prof": prof, "spec": spec, "cfg": cfg, "sched": sched, "cache": cache, "eng_cfg": eng_cfg,
            "eng_prof": eng_prof}


def startup_failure(task: dict[str, Any], served: int, slots: int) -> str | None:
    """Why vLLM would not start the engine :func:`run_config` builds for ``(served, slots)`` of ``task``
    (:func:`run_server`), or None."""
    srv = run_server(task["scenario"], served, slots, task["max_rank"], task["seed"], task["window_s"],
                     task["profile"], task["scenario"].get("policy"), task.get("engine") or None)
    try:
        kv_at_startup(srv["eng_cfg"], srv["eng_prof"], int(task["max_rank"]))
    except StartupError as e:
        return str(e)
    return None


def check_some_config_starts(tasks: list[dict[str, Any]]) -> None:
    """At least one (slots, max LoRA rank) configuration of ``tasks`` passes vLLM's start-up check
    (:func:`startup_failure`, the check :func:`run_config` records a ``start_failure`` on); otherwise an error naming
    the first failure, before any run (the sweep would hold nothing but start failures)."""
    if not tasks:
        return
    prof = get_profile(tasks[0]["profile"])
    seen: set[tuple] = set()
    first = ""
    for t in tasks:
        served = max(t["served"])
        for g in t["slots"]:
            key = (g, t["max_rank"], json.dumps(t.get("engine") or {}, sort_keys=True, default=str),
                   t["scenario"].get("policy"))
            if g > served or key in seen:
                continue
            seen.add(key)
            msg = startup_failure(t, served, g)
            if msg is None:
                return
            first = first or f"at {g} slots of max LoRA rank {t['max_rank']}: {msg.split('. ')[0]}"
    raise ValueError(f"grid: no configuration passes vLLM's start-up check with profile {prof.name}, so every run "
                     f"would be a start failure ({first}); give smaller [configs] slots or [scenarios] ranks "
                     f"(max_lora_rank), or a profile of a GPU with more memory")


def _policy_objects(policy: str | None):
    """(scheduler, cache, preload) for a policy name: the published one or any registered preset."""
    if policy in (None, "", DEFAULT_POLICY, "validation"):
        return (make_scheduler("fcfs+client-cap", client_cap=CLIENT_MAX_INFLIGHT, preload_cpu=True),
                make_cache("lru"))
    s, c, _ = resolve_policy(policy, None, None)
    return s, c


def check_lengths(lengths: list[list[float]], length_corr: float = 0.0) -> None:
    """Every (mean input, mean output) pair of a grid can be drawn from the ShareGPT-like length
    model under the real runs' filters (:func:`twin.validation.recreate.sharegpt_model`), with the
    grid's prompt-output coupling ``length_corr``; otherwise an error naming the reachable range,
    before any run (every run of the scenario would fail building its workload)."""
    for pair in lengths:
        if len(pair) != 2 or not all(math.isfinite(float(v)) and float(v) > 0 for v in pair):
            raise ValueError(f"grid lengths {pair!r}: expected [mean input tokens, mean output tokens], both > 0")
        try:
            sharegpt_model(float(pair[0]), float(pair[1]), float(length_corr))
        except FileNotFoundError:
            return  # no length model here at all: every run reports it
        except ValueError as e:
            raise ValueError(f"grid lengths {[float(v) for v in pair]}: {e}; pick means within that range") from None


# --------------------------------------------------------------------------- bounds
_RMAX: dict[tuple, float] = {}


def max_token_rate(profile, cfg) -> float:
    """An upper bound on the tokens per second the engine can compute (prefill + decode).

    A step computes ``T <= max(max_num_batched_tokens, max_num_seqs)`` tokens and lasts at least
    the profile's step time for ``T`` tokens with no context, no waiting requests and the fewest
    adapters (every component of the step-time model is non-negative and non-decreasing in
    context, waiting and running requests, active adapters and decode rows: the probes below take
    the minimum over the splits and adapter counts anyway). The bound is ``max_T T / step_min(T)``."""
    slots = int(cfg.max_loras)
    rank = int(cfg.max_lora_rank or 0)
    served = int(cfg.served_adapters or slots)
    tmax = int(max(cfg.max_num_batched_tokens, cfg.max_num_seqs))
    key = (profile.name, id(profile), slots, rank, served, tmax)
    if key in _RMAX:
        return _RMAX[key]
    best = 0.0
    ts = sorted(set([1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 513, 768, 1024, 1536, 2048, tmax]
                    + list(range(1, tmax + 1, 97))))
    for T in ts:
        if T > tmax:
            continue
        mins = []
        for active in (0, 1):
            for P, D in ((T, 0), (0, T), (T - 1, 1) if T > 1 else (T, 0)):
                n_req = max(D + (1 if P else 0), 1)
                mins.append(profile.step_s(P, D, 0, n_req, active, rank, slots, 0, 0, served))
        d = min(mins)
        if d <= 0:
            return math.inf
        best = max(best, T / d)
    _RMAX[key] = best
    return best


def throughput_upper_bound(eng, window_s: float, r_max: float, tokens: np.ndarray, unfinishable: np.ndarray | None = None) -> float:
    """An always-correct upper bound (tokens) on the finished tokens the run will have at its end,
    from the engine's state at ``eng.env.now = t``:

    ``F(t) + sum(tokens of running requests) + rho * (r_max * (W - t) + one step past W)``.

    Why it holds: a request counts ``p + o`` tokens when it finishes (also in the step that ends
    just past the window, at most one step). A request finishing after ``t`` either runs at ``t``
    (counted in full in the second term: the step in progress at ``t`` only holds running
    requests) or is admitted after ``t``, so all its ``p + o - 1`` computed tokens (prefill and
    decodes; a preempted request recomputes) are computed after ``t``: at most ``r_max`` per second
    (:func:`max_token_rate`), and ``p + o <= rho (p + o - 1)`` with ``rho = m / (m - 1)``, ``m``
    the smallest ``p + o`` of the requests not finished. Requests that failed at the client
    (``unfinishable``) never finish and are left out of the running term (they never run)."""

    t = float(eng.env.now)
    state = eng.state
    fin = state == FINISHED
    F = float(tokens[fin].sum())
    run_ids = list(eng.running)
    R = float(tokens[run_ids].sum()) if run_ids else 0.0
    rest = ~fin
    if unfinishable is not None:
        rest &= ~unfinishable
    if not rest.any():
        return F
    m = float(tokens[rest].min())
    rho = m / (m - 1.0) if m > 1 else 2.0
    tmax = float(max(eng.config.max_num_batched_tokens, eng.config.max_num_seqs))
    budget = r_max * max(window_s - t, 0.0) + tmax
    remaining = float(tokens[rest].sum()) - R  # cannot finish more than exists
    return F + R + min(rho * budget, max(remaining, 0.0))


# --------------------------------------------------------------------------- the window's cut
def unloaded_request_s(profile, lengths: tuple[float, float] | list[float] = DEFAULT_LENGTHS, length_corr: float = 0.0,
                       slots: int = 1, max_rank: int = 8, served: int = 1, n: int = 4000) -> float:
    """The time a request of the scenario's pool takes with the engine to itself (the profile's step times: one
    prefill step of the mean prompt, then one decode step per output token at the mean context), weighted by its
    tokens: ``t_prefill + t_decode * E[(p + o) o] / E[p + o]`` over ``n`` lengths drawn (a fixed seed) from the
    pool's length model (:func:`twin.validation.recreate.sharegpt_model`; the mean output tokens when no model is
    at hand). A run's window ``W`` cancels the requests still running at its end, so about ``unloaded_request_s /
    W`` of the offered tokens go uncounted even in an unloaded run (the tokens of the requests that arrived in the
    last ``unloaded_request_s``; queueing under load only adds to it): :func:`twin.sweep.grid.window_cut`."""
    mean_in, mean_out = float(lengths[0]), float(lengths[1])
    try:
        p, o = sharegpt_model(mean_in, mean_out, float(length_corr)).sample(int(n), np.random.default_rng(0))
        p, o = np.asarray(p, float), np.asarray(o, float)
        out_weighted = float(((p + o) * o).sum() / (p + o).sum())
    except (FileNotFoundError, ValueError):  # (no length model here: the grid's own check reports it)
        out_weighted = mean_out
    rank, slots, served = int(max_rank), max(int(slots), 1), max(int(served), 1)
    prefill = profile.step_s(int(round(mean_in)), 0, 0, 1, 1, rank, slots, 1, 0, served)
    decode = profile.step_s(0, 1, int(round(mean_in + mean_out)), 1, 1, rank, slots, 1, 0, served)
    return float(prefill + decode * out_weighted)


def scenario_profile(profile: str | None, scenario: dict[str, Any]):
    """The profile a run of ``scenario`` steps with: ``profile`` with the grid's serving-path host time
    (:attr:`twin.sweep.grid.GridSpec.serving_us`) and rank-tile cost (:attr:`~twin.sweep.grid.GridSpec.rank_tile_cost`)."""
    prof = get_profile(profile)
    if scenario.get("serving_us"):  # the serving path's host time (GridSpec.serving_us)
        prof = prof.with_serving_host(float(scenario["serving_us"]) * 1e-6)
    if scenario.get("rank_tile_cost") is not None:  # the LoRA shrink's rank tiles (GridSpec.rank_tile_cost)
        prof = prof.with_rank_tile_cost(float(scenario["rank_tile_cost"]))
    return prof


# --------------------------------------------------------------------------- one run
def run_config(scenario: dict[str, Any], served: int, slots: int, max_rank: int, *, seed: int = 0,
               window_s: float = WINDOW_S, profile: str | None = None, policy: str | None = None,
               early_stop: bool = False, ratio: float = STARVE_RATIO, chunk_s: float | None = None,
               ttft_slo_s: float | None = None, tbt_slo_s: float | None = None,
               engine_overrides: dict[str, Any] | None = None, cpu_slots: int | None = None) -> dict[str, Any]:
    """Simulate one configuration of a scenario; returns one result row (see :data:`ROW_COLUMNS`).

    With ``early_stop``, the run stops as soon as the upper bound on its throughput falls below
    ``ratio`` x offered (``early_stop`` True in the row; ``total_tok_s`` is then NaN and
    ``tok_s_upper`` holds the bound at the stop). An exception raised in a hook of the policy's scheduler or
    cache (a plug-in preset's) is raised as a :class:`twin.interfaces.PolicyError` naming the policy, the hook and
    the original error (chained), as :func:`twin.simulate.simulate` does; the walk records it in the row's
    ``error``."""

    srv = run_server(scenario, served, slots, max_rank, seed, window_s, profile, policy, engine_overrides, cpu_slots)
    prof, spec, cfg, sched, cache = srv["prof"], srv["spec"], srv["cfg"], srv["sched"], srv["cache"]
    row: dict[str, Any] = {"served_adapters": int(served), "adapter_slots": int(slots), "max_lora_rank": int(max_rank),
                           "seed": int(seed), "run_seed": int(spec.seed), "profile": prof.name,
                           "profile_hash": profile_hash(profile), "twin_version": twin_version(),
                           "early_stop": False, "status": "ok", "startup_reason": "", "walk_ratio": float(ratio)}
    # vLLM's start-up check on the engine this run builds: the grid's engine overrides (max_model_len, tensor
    # parallelism, kv_capacity_tokens, ...) and the policy's block size and paged adapters included
    try:
        row["kv_tokens"] = kv_at_startup(srv["eng_cfg"], srv["eng_prof"], int(max_rank))
    except StartupError as e:
        row.update(status="start_failure", startup_reason=str(e), wall_s=0.0,
                   kv_tokens=kv_capacity(srv["eng_cfg"], srv["eng_prof"], int(max_rank)))
        return row
    t0 = time.perf_counter()
    c0 = time.process_time()
    if scenario.get("workload"):  # a workload file's requests (twin/sweep/workload_scenario.py)
        wl = served_workload(scenario, served, seed, window_s)
    else:
        wl, _ = build_workload(spec)
    df = wl.df
    arr = df["arrival_s"].to_numpy()
    tokens = (df["prompt_tokens"].to_numpy() + df["output_tokens"].to_numpy()).astype(np.float64)
    in_window = arr < window_s  # (an arrival at the window's end has not arrived: twin.metrics.outcomes)
    offered_tok = float(tokens[in_window].sum())
    row["requests"] = int(in_window.sum())
    row["offered_tok_s"] = offered_tok / window_s
    try:  # a policy hook that raises (a plug-in preset's): named with its policy and hook, as in twin run
        eng = Engine(wl, prof, cfg, sched, cache, horizon_s=window_s, record_steps=False)
        stopped = False
        # the bound counts every token a request admitted later computes after now: not so where history KV supplies
        # part of a prompt (prefix reuse), so such a run is run in full
        if early_stop and not (eng.config.prefix_caching or getattr(cache, "prefix_kv", False)):
            r_max = max_token_rate(eng.profile, eng.config)  # (the engine's: tensor parallel, paged adapters)
            step = chunk_s or max(window_s / 40.0, 1.0)
            target = ratio * offered_tok
            t = step
            dropped = getattr(sched, "dropped", None)
            while t < window_s:
                eng.env.run(until=t)
                if not eng.proc.is_alive:
                    break
                unf = np.frombuffer(dropped, np.uint8).astype(bool) if dropped is not None and len(dropped) else None
                ub = throughput_upper_bound(eng, window_s, r_max, tokens, unf)
                if ub < target:
                    stopped = True
                    row.update(early_stop=True, early_stop_t=float(eng.env.now), tok_s_upper=ub / window_s,
                               total_tok_s=math.nan, throughput_ratio=math.nan, starving=True,
                               tok_s_at_stop=float(tokens[eng.state == _finished_code()].sum()) / window_s)
                    break
                t += step
        if not stopped:
            if eng.proc.is_alive:
                eng.env.run(until=eng.proc)
            eng.finalize()
            s = summarize(eng, time.perf_counter() - t0, ttft_slo_s, tbt_slo_s)
            row.update(total_tok_s=s["total_tok_s"], input_tok_s=s["input_tok_s"], output_tok_s=s["output_tok_s"],
                       throughput_rps=s["throughput_rps"], requests_finished=s["requests_finished"],
                       requests_unfinished=s["requests_unfinished"], requests_rejected=s["requests_rejected"],
                       ttft_ms_mean=s["ttft_ms_mean"], ttft_ms_p50=s["ttft_ms_p50"], ttft_ms_p99=s["ttft_ms_p99"],
                       itl_ms_mean=s["itl_ms_mean"], itl_ms_p99=s["itl_ms_p99"], tpot_ms_mean=s["tpot_ms_mean"],
                       ttft_ms_incl_unfinished=s["ttft_ms_incl_unfinished"],
                       slo_attainment=s.get("slo_attainment", math.nan),
                       adapter_loads=s["adapter_loads"], preemptions=s["preemptions"], engine_steps=s["engine_steps"])
            row["client_failed"] = int(getattr(sched, "n_dropped", 0))
            row["throughput_ratio"] = (row["total_tok_s"] / row["offered_tok_s"] if row["offered_tok_s"] > 0
                                       else math.nan)
            # (the labels' own test, tp >= ratio x offered: a run exactly at the line passes both)
            row["starving"] = (not row["total_tok_s"] >= ratio * row["offered_tok_s"]) if row["offered_tok_s"] > 0 \
                else False
    except Exception as e:
        err = explain_policy_failure(e, (sched, cache))
        if err is None:
            raise
        raise err from e
    row["wall_s"] = time.perf_counter() - t0
    row["cpu_s"] = time.process_time() - c0  # CPU time of this process (wall_s also counts waiting for a core)
    return row


def _finished_code() -> int:

    return FINISHED
