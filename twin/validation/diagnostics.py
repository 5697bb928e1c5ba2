"""Diagnostics of the twin's internal state against the real runs' gauges.

:func:`diagnostics` compares the twin's time-averaged running requests and KV tokens per
running request with the real runs' Prometheus gauges; :func:`step_at_real_mix` evaluates the
profile's step (:meth:`twin.perf.profile.Profile.step_s`, the engine's own formula) at each
KV-saturated real run's mean step composition, which separates the step model's error from the
twin's dynamics; :func:`itl_over_tpot` sets the client's mean ITL beside its mean TPOT (merged
streamed chunks); :func:`saturated_throughput_by_share` gives the twin's throughput error of the
KV-saturated runs by served adapters per GPU slot.
(``python -m twin.validation.crossings PER_RUN_CSV`` prints it from a validation pass's ``per_run.csv``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from twin.perf.profile import Profile
from twin.scrape_stall import OUTPUT_PROC_CHUNK_SIZE
from twin.validation.light_mix import light_summary, step_at_light_mix
from twin.validation.profiles import cached_profile
from twin.validation.specs import spec_from_row

#: A run whose mean KV usage reaches this is KV-saturated (:func:`step_at_real_mix`).
SATURATED_KV_USAGE = 0.9

_STEP_MIX_COLUMNS = {"ts_mean_kv_usage", "ts_mean_running", "ts_mean_waiting", "input_tok_s", "output_tok_s",
                     "twin_kv_tokens", "real_itl", "rates", "served_adapters", "adapter_slots", "max_lora_rank",
                     "pool_mean_input_tokens", "pool_mean_output_tokens"}


#: Ranges of blocked waiting requests (``W x max(1 - G/N, 0)``) of :func:`_saturated_summary`: (name, from, below)
BLOCKED_WAITING_BINS = (("blocked < 1,000", 0.0, 1e3), ("blocked 1,000-15,000", 1e3, 1.5e4),
                        ("blocked >= 15,000", 1.5e4, float("inf")))


def _step_at_mix(r: pd.Series, prof: Profile) -> dict[str, Any]:
    """One saturated run's mean step composition and the profile's step there."""
    spec = spec_from_row(r)
    itl = float(r["real_itl"]) / 1000.0
    G, n = spec.slots, spec.served
    share = spec.adapter_rates / spec.adapter_rates.sum()
    R, W = float(r["ts_mean_running"]), float(r["ts_mean_waiting"])
    A = min(float(G), float(np.sum(1.0 - (1.0 - share) ** R)))
    pre = float(r.get("ts_preemptions", np.nan))
    pre = pre if math.isfinite(pre) else 0.0  # not recorded: no recompute term
    rec = pre / spec.window_s * (spec.mean_in + spec.mean_out / 2)
    D = float(r["output_tok_s"]) * itl
    P = (float(r["input_tok_s"]) + rec) * itl
    C = float(r["ts_mean_kv_usage"]) * float(r["twin_kv_tokens"])
    step = prof.step_s(prefill_tokens=P, n_dec=D, ctx_tokens=C, n_req=R, active=A, max_rank=spec.max_rank,
                       slots=G, running=R, waiting=W, served=n)
    return {"run_id": r["run_id"], "slots": G, "running": R, "prefill_tokens": P, "decode_tokens": D,
            "context_tokens": C, "adapters": A, "blocked_waiting": W * max(1.0 - G / n, 0.0) if n > 0 else 0.0,
            "model_step_ms": step * 1000.0,
            "real_itl_ms": itl * 1000.0, "ratio": itl / step}


def step_at_real_mix(runs: pd.DataFrame, prof: Profile) -> pd.DataFrame:
    """The profile's step at each KV-saturated real run's own mean step composition.

    Separates the step model's error from the twin's dynamics (running batch, preemptions,
    request lengths): in a run whose KV cache stays full (mean usage >= 0.9) every step decodes
    the running batch and admits what KV frees, so steps are alike and the mean step is the
    model at the mean composition (checked on the twin's own steps: 88.04 ms at its mean mix
    against its mean step of 88.06 ms in the 16-slot / 32-adapter rate-3.2 run). Per step, from
    the real run's figures with ``itl`` its mean ITL (every running decode gets one token per
    step, so the ITL is the step): ``D = output_tok_s * itl`` decode tokens,
    ``P = (input_tok_s + recompute) * itl`` prefill tokens (``recompute`` = preemptions per
    second x (mean prompt + half the mean output) tokens), ``C`` = mean KV usage x the KV
    capacity, ``R`` running and ``W`` waiting (the gauges), ``A`` = the expected distinct
    adapters among ``R`` requests drawn at the adapters' rates, at most the slots. The step is
    :meth:`twin.perf.profile.Profile.step_s` of that composition. Returns one row per run with
    ``model_step_ms``, ``real_itl_ms`` and their ``ratio``, and ``blocked_waiting``: the waiting requests
    whose adapter cannot get a slot, ``W x max(1 - G/N, 0)`` (the v1 scheduler walks past them every step;
    the scheduler form's ``k_blocked`` input).
    """
    if not _STEP_MIX_COLUMNS <= set(runs.columns):
        return pd.DataFrame()
    sat = runs[(runs["ts_mean_kv_usage"] >= SATURATED_KV_USAGE) & runs["real_itl"].notna()]
    return pd.DataFrame([_step_at_mix(r, prof) for _, r in sat.iterrows()])


def _saturated_summary(mix: pd.DataFrame) -> dict[str, Any]:
    """Medians of :func:`step_at_real_mix`'s ratio, overall, by slot range and by blocked waiting requests
    (with the median gap, real ITL - model step, in ms)."""
    G, Wb = mix["slots"], mix["blocked_waiting"]
    gap = mix["real_itl_ms"] - mix["model_step_ms"]
    bins = {f"slots {lo + 1}-{hi}": (G > lo) & (G <= hi) for lo, hi in ((0, 32), (32, 96), (96, 448))}
    wb_bins = {name: (Wb >= lo) & (Wb < hi) for name, lo, hi in BLOCKED_WAITING_BINS}
    return {"runs": int(len(mix)), "median": float(mix["ratio"].median()),
            "median_gap_ms": float(gap.median()),
            "by_slots": {k: {"runs": int(m.sum()), "median": float(mix.loc[m, "ratio"].median())}
                         for k, m in bins.items() if m.any()},
            "by_blocked_waiting": {k: {"runs": int(m.sum()), "median": round(float(mix.loc[m, "ratio"].median()), 4),
                                       "median_gap_ms": round(float(gap[m].median()), 2)}
                                   for k, m in wb_bins.items() if m.any()},
            "note": "real mean ITL over the profile's step (scheduler + backbone + LoRA) evaluated at the "
                    "run's mean step composition, KV-saturated runs only (see step_at_real_mix)"}


#: Ranges of served adapters per GPU slot (``N / G``) of :func:`saturated_throughput_by_share`: (name, above,
#: up to); the first holds the runs whose every served adapter has a slot (nothing waits for a slot)
SERVED_PER_SLOT_BINS = (("N/G = 1", 0.0, 1.0), ("N/G 1-1.5", 1.0, 1.5), ("N/G 1.5-2", 1.5, 2.0),
                        ("N/G 2-4", 2.0, 4.0), ("N/G > 4", 4.0, float("inf")))
_SPLITS = (("fit", "dt_modelling"), ("test", "ml_test"))


def saturated_throughput_by_share(runs: pd.DataFrame) -> dict[str, Any]:
    """The twin's throughput error (twin / real - 1, %) of the KV-saturated real runs (mean KV usage >=
    :data:`SATURATED_KV_USAGE`), medians per split by served adapters per slot ``N / G``
    (:data:`SERVED_PER_SLOT_BINS`), and, for ``N = G``, by slots.

    In a saturated run the throughput is the server's capacity at its own mix, so the error reads the
    step model and the engine's dynamics there. The twin errs in a slope across ``N / G``: where every served
    adapter has a slot, a many-slot twin is slower than the server; where most waiting requests are blocked
    for a slot (``N >> G``), faster (issue 17: results/validation/README.md). Empty without the columns."""
    need = {"source", "served_adapters", "adapter_slots", "ts_mean_kv_usage", "real_throughput", "twin_throughput"}
    if not need <= set(runs.columns):
        return {}
    r = runs[(runs["ts_mean_kv_usage"] >= SATURATED_KV_USAGE) & (runs["real_throughput"] > 0)
             & runs["twin_throughput"].notna() & (runs["adapter_slots"] > 0)]
    err = (r["twin_throughput"] / r["real_throughput"] - 1.0) * 100.0
    share = r["served_adapters"] / r["adapter_slots"]
    out: dict[str, Any] = {}
    for split, src in _SPLITS:
        m = r["source"] == src
        if not m.any():
            continue
        rows = {}
        for name, lo, hi in SERVED_PER_SLOT_BINS:
            b = m & (share > lo) & (share <= hi)
            if b.any():
                rows[name] = {"runs": int(b.sum()), "median_pct": round(float(err[b].median()), 2)}
        one = m & (share == 1.0)
        by_slots = {int(g): {"runs": int((one & (r["adapter_slots"] == g)).sum()),
                             "median_pct": round(float(err[one & (r["adapter_slots"] == g)].median()), 2)}
                    for g in sorted(r.loc[one, "adapter_slots"].unique())}
        out[split] = {"by_served_per_slot": rows, "at_one_per_slot_by_slots": by_slots}
    if out:
        out["note"] = ("twin / real throughput - 1 (%), medians, KV-saturated runs (real mean KV usage >= "
                       f"{SATURATED_KV_USAGE:g}); N served adapters, G GPU slots")
    return out


def itl_over_tpot(runs: pd.DataFrame, max_running: float = OUTPUT_PROC_CHUNK_SIZE) -> dict[str, Any]:
    """Mean ITL / mean TPOT, real and twin, medians over ``runs`` by served adapters, for the runs with
    at most ``max_running`` running requests (real gauge) and for the others.

    The client counts one ITL per streamed chunk and TPOT per token, so the ratio exceeds 1 where
    tokens reach the client merged: where the metrics scrape's stall grows with the served adapters
    and the steps have at most 128 outputs (:func:`twin.scrape_stall.merged_gaps`). Empty without the
    columns."""
    need = {"real_itl", "real_tpot", "twin_itl", "twin_tpot", "served_adapters", "ts_mean_running"}
    if not need <= set(runs.columns):
        return {}
    r = runs[(runs["real_tpot"] > 0) & (runs["twin_tpot"] > 0)]
    real, twin = r["real_itl"] / r["real_tpot"], r["twin_itl"] / r["twin_tpot"]
    out: dict[str, Any] = {}
    for part, m in ((f"running <= {max_running:g}", r["ts_mean_running"] <= max_running),
                    (f"running > {max_running:g}", r["ts_mean_running"] > max_running)):
        rows = {}
        n = r["served_adapters"]
        for lo, hi in ((0, 16), (16, 64), (64, 128), (128, 10 ** 6)):
            b = m & (n > lo) & (n <= hi)
            if b.any():
                name = f"served {lo + 1}-{hi}" if hi < 10 ** 6 else f"served > {lo}"
                rows[name] = {"runs": int(b.sum()), "real_median": round(float(real[b].median()), 4),
                              "twin_median": round(float(twin[b].median()), 4)}
        if rows:
            out[part] = rows
    if out:
        out["note"] = ("mean ITL / mean TPOT, medians: above 1 where the client receives merged chunks "
                       "(twin/scrape_stall.py, merged_gaps)")
    return out


def diagnostics(runs: pd.DataFrame, profile_name: str | None = None, serving_s_per_running: float = 0.0,
                rank_tile_cost: float | None = None) -> dict[str, Any]:
    """Internal state, twin against the real runs' Prometheus gauges (time averages over the hour):
    mean running requests and KV tokens held per running request (real: mean KV usage x the KV
    capacity, which the profile reproduces within ~1 % of the probes). Medians over scored runs.
    With a profile, also :func:`step_at_real_mix` (the step model at the KV-saturated runs' own
    step composition, with the serving path's host time ``serving_s_per_running`` and the rank tile
    cost ``rank_tile_cost`` the runs were re-created with) and
    :func:`twin.validation.light_mix.step_at_light_mix` (the same step against the real TPOT of the
    runs without a queue, per split)."""
    sc = runs[runs["scored"]]
    out: dict[str, Any] = {}
    need = {"ts_mean_running", "twin_mean_running", "ts_mean_kv_usage", "twin_mean_kv_usage", "twin_kv_tokens"}
    if not len(sc) or not need <= set(sc.columns):
        return out
    if profile_name is not None:
        prof = cached_profile(profile_name).with_serving_host(serving_s_per_running)
        prof = prof if rank_tile_cost is None else prof.with_rank_tile_cost(rank_tile_cost)
        mix = step_at_real_mix(sc, prof)
        if len(mix):
            out["saturated_runs_real_itl_over_model_step_at_real_mix"] = _saturated_summary(mix)
        light = step_at_light_mix(sc, prof)
        if len(light):
            out["light_runs_real_tpot_over_model_step_at_real_mix"] = {
                split: light_summary(light[light["source"] == src]) for split, src in
                (("fit", "dt_modelling"), ("test", "ml_test")) if (light["source"] == src).any()}
    busy = sc[(sc["ts_mean_running"] > 1) & (sc["twin_mean_running"] > 1)]
    if len(busy):
        real_kv = busy["ts_mean_kv_usage"] * busy["twin_kv_tokens"] / busy["ts_mean_running"]
        twin_kv = busy["twin_mean_kv_usage"] * busy["twin_kv_tokens"] / busy["twin_mean_running"]
        out["kv_tokens_per_running_request"] = {"real_median": float(real_kv.median()),
                                                "twin_median": float(twin_kv.median()), "runs": int(len(busy))}
        out["mean_running_twin_over_real_median"] = float((busy["twin_mean_running"]
                                                           / busy["ts_mean_running"]).median())
    ratio = itl_over_tpot(sc)
    if ratio:
        out["itl_over_tpot"] = ratio
    by_share = saturated_throughput_by_share(sc)
    if by_share:
        out["saturated_throughput_error_by_served_per_slot"] = by_share
    return out

