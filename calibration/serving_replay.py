"""Replay the published 600 s serving runs through the twin (a calibration-side check).

``scheduler_overhead.csv`` (calibration data, not the validation set) holds 788 real 600 s runs
of vLLM serving LoRA adapters: per-adapter Poisson arrivals, a fixed-length dataset (250-token
prompts, 231-token outputs: :data:`calibration.fitting.vllm085.SERVING_RUN_PROMPT_TOKENS`),
adapter slots 8-448 and 8-512 served adapters, with the real number of CPU->GPU adapter loads,
completed requests and mean ITL. The profile's step costs are fitted on some of them (see
:func:`calibration.fitting.vllm085.serving_run_lora_obs`); the *number of adapter loads* is
fitted on none, so it checks the twin's adapter-slot mechanics: which adapter a new one evicts,
and when (:meth:`twin.adapters.AdapterMemory.activation_reloads`).

``replay_serving_runs`` simulates the chosen runs once per variant of the LRU policy (vLLM's
activation order on / off) and returns one row per run; :func:`summary` scores each variant
(mean |log(twin/real)| of the loads, and the published twin's SMAPE convention for completed
requests and mean ITL). ``twin calibrate replay`` prints it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibration.fitting.vllm085 import SERVING_RUN_OUTPUT_TOKENS, SERVING_RUN_PROMPT_TOKENS
from traces.datadir import require
from traces.workload import Workload
from twin.config import EngineConfig
from twin.perf.profile import load_profile
from twin.registry import make_cache, make_scheduler
from twin.simulate import simulate

WINDOW_S = 600.0


def select_runs(table: pd.DataFrame, every: int = 1, only_swapping: bool = True) -> pd.DataFrame:
    """Per-adapter-rate runs (the fixed-length workload), every ``every``-th; with ``only_swapping``
    those serving more adapters than slots (the runs where adapters are loaded while serving)."""
    t = table[(table["rate_mode"] == "per_adapter_rate")]
    if only_swapping:
        t = t[t["served_adapters"] > t["adapter_slots"]]
    return t.reset_index(drop=True).iloc[::max(int(every), 1)]


def _workload(N: int, rate: float, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    counts = rng.poisson(rate * WINDOW_S, size=N)
    ids = np.repeat(np.arange(N, dtype=np.int64), counts)
    t = rng.uniform(0.0, WINDOW_S, ids.size)
    o = np.argsort(t, kind="stable")
    n = ids.size
    return Workload.from_arrays(t[o], np.full(n, int(SERVING_RUN_PROMPT_TOKENS)),
                                np.full(n, int(SERVING_RUN_OUTPUT_TOKENS)), ids[o], np.full(n, 8),
                                meta={"source": "serving_replay"})


def replay_serving_runs(table: pd.DataFrame, profile: str | None = None, seed: int = 1,
                        variants: tuple[bool, ...] = (False, True)) -> pd.DataFrame:
    """Simulate each run of ``table`` (rows of scheduler_overhead.csv) with vLLM's FCFS and LRU,
    once per ``activation_order_reloads`` value in ``variants``. The scheduler is the registered
    ``fcfs+client-cap`` (:mod:`policies.client_cap`) without a cap: vLLM's FCFS on a server whose
    served adapters are in the CPU tier from start-up."""
    prof = load_profile(profile)
    rows: list[dict[str, Any]] = []
    for _, r in table.iterrows():
        G, N, rate = int(r["adapter_slots"]), int(r["served_adapters"]), float(r["rate_req_s"])
        wl = _workload(N, rate, seed)
        # these servers started with up to 448 slots, so they did not use Llama-3.1's 128k default
        # max_model_len (the start-up check would refuse): 4096 holds every request of the dataset
        cfg = EngineConfig(max_num_batched_tokens=2048, max_num_seqs=2048, enable_lora=True, max_loras=G,
                           max_cpu_loras=N, max_lora_rank=8, served_adapters=N, max_model_len=4096)
        out: dict[str, Any] = {"slots": G, "served": N, "rate_per_adapter": rate,
                               "real_mean_waiting": float(r["mean_waiting"]),
                               "real_loads": float(r["loads_cpu_to_gpu_after_startup"]),
                               "real_completed": float(r["completed_requests"]),
                               "real_itl_ms": float(r["mean_itl_ms"])}
        for on in variants:
            cache = make_cache("lru")
            cache.activation_order_reloads = on
            # vLLM's FCFS, no client cap, every served adapter in the CPU tier from start-up
            sched = make_scheduler("fcfs+client-cap", client_cap=None, preload_cpu=True)
            s = simulate(wl, prof, cfg, scheduler_obj=sched, cache_obj=cache, horizon_s=WINDOW_S,
                         record_steps=False).summary
            k = "order" if on else "plain"
            # the real count excludes the start-up activations, which leave min(N, G) adapters resident
            loads = int(s["adapter_loads"])
            out[f"{k}_loads"] = float(loads - min(N, G, loads))
            out[f"{k}_completed"] = float(s["requests_finished"])
            out[f"{k}_itl_ms"] = float(s["itl_ms_mean"] or np.nan)
        rows.append(out)
    return pd.DataFrame(rows)


def summary(runs: pd.DataFrame) -> dict[str, Any]:
    """Per variant: mean |log((twin+1)/(real+1))| of the loads, median twin/real load ratio, and
    100*mean(|t-r|/(t+r)) of completed requests and mean ITL."""
    out: dict[str, Any] = {"runs": int(len(runs))}
    for k in ("plain", "order"):
        if f"{k}_loads" not in runs:
            continue
        tl, rl = runs[f"{k}_loads"].to_numpy(float), runs["real_loads"].to_numpy(float)
        sm = lambda t, r: float(np.nanmean(np.abs(t - r) / (np.abs(t) + np.abs(r))) * 100)  # noqa: E731
        out[k] = {"loads_mean_abs_log_ratio": float(np.mean(np.abs(np.log((tl + 1) / (rl + 1))))),
                  "loads_median_ratio": float(np.median((tl + 1) / (rl + 1))),
                  "completed_smape": sm(runs[f"{k}_completed"].to_numpy(float), runs["real_completed"].to_numpy(float)),
                  "itl_smape": sm(runs[f"{k}_itl_ms"].to_numpy(float), runs["real_itl_ms"].to_numpy(float))}
    return out


def read_table(data_dir: str | Path | None = None) -> pd.DataFrame:
    return pd.read_csv(require("calibration/vllm085_h100/scheduler_overhead.csv", data_dir))
