"""The metrics scrape's seconds per LoRA label series, fitted on the fit split's runs without a queue.

With no queue, the real P99 TTFT is ~1.9x the median up to 16 served adapters, at any load
(0.5-15.6 req/s, 1-99 running), but 4.2-4.6x at 32 adapters, 6.4-8.1x at 64 and 9.7x at 128,
all at the low per-adapter rates (0.1/0.05/0.025 req/s; 1.9-7.5 req/s in all). Over these
runs (``dt_modelling``, ``ts_max_waiting`` 0) the P99 excess over the twin's engine follows
the served adapters (Spearman 0.96) and the twin's count of distinct LoRA label series
(0.95), not the total rate (0.23) nor the mean running batch (0.28): 16 adapters at 15.6 req/s
and ~90 running have no tail, 32 adapters at 1.9 req/s and ~6 running do. It is not adapter
loading (16 or 32 slots at 32 adapters give the same P99). The mechanism that follows the
adapter combinations and not the load is the server's metrics exposition
(:mod:`twin.scrape_stall`).

:func:`fit_scrape_stall` fits its one constant, the seconds per label series, with
``scipy.optimize.curve_fit``: it re-creates the 18 runs once with the engine alone (front-end
latency as ``twin validate``, no stall), then fits the model's P99 TTFT of every run
(:func:`twin.scrape_stall.client_times` on the engine's per-request times; the engine run does
not depend on the constant) to the real P99, relative errors. The ``ml_test`` runs are not
read. The value the validation uses is :data:`twin.validation.specs.SCRAPE_S_PER_LABEL`;
``python -m twin.validation.scrape_stall`` recomputes it (about a minute).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import curve_fit

from policies.client_cap import CLIENT_MAX_INFLIGHT
from twin.registry import make_cache, make_scheduler
from twin.scrape_stall import SCRAPE_PERIOD_S, client_times, label_times
from twin.simulate import simulate
from twin.validation.profiles import cached_profile
from twin.validation.recreate import SCHEDULER, build_config, build_workload
from twin.validation.specs import FRONTEND_LATENCY_S, default_real_csv, load_real, spec_from_row

FIT_SOURCE = "dt_modelling"


def scrape_fit_runs(real: pd.DataFrame) -> pd.DataFrame:
    """The fit-split runs that identify the stall: ok, never queued (``ts_max_waiting`` 0), P99 TTFT recorded."""
    return real[(real["source"] == FIT_SOURCE) & (real["status"] == "ok") & (real["ts_max_waiting"] == 0)
                & real["p99_ttft_ms"].notna()]


def engine_times(row: pd.Series, profile_name: str | None = None) -> dict[str, Any]:
    """One run re-created as ``twin validate`` does, without the stall: per-request engine times."""
    spec = spec_from_row(row, scrape_s_per_label=0.0)
    wl, _ = build_workload(spec)
    res = simulate(wl, cached_profile(profile_name), build_config(spec),
                   scheduler_obj=make_scheduler(SCHEDULER, client_cap=CLIENT_MAX_INFLIGHT, preload_cpu=True),
                   cache_obj=make_cache("lru"), horizon_s=spec.window_s, record_steps=False,
                   serving_s_per_running=spec.serving_s_per_running, rank_tile_cost=spec.rank_tile_cost)
    e = res.engine
    return {"arrival": e.arrival.copy(), "first_token": e.first_token.copy(), "finish": e.finish.copy(),
            "adapter": e.adapter.copy(), "horizon": spec.window_s}


def client_ttft_ms(t: dict[str, Any], s_per_label: float, frontend_s: float = FRONTEND_LATENCY_S) -> np.ndarray:
    """Client TTFT (ms) of the requests finished within the window, with the stall at ``s_per_label``."""
    ft, fn, _ = client_times(t["arrival"], t["first_token"], t["finish"], t["adapter"], t["horizon"], frontend_s,
                             s_per_label, SCRAPE_PERIOD_S)
    ok = np.isfinite(t["finish"]) & (t["finish"] <= t["horizon"])
    return (ft[ok] - t["arrival"][ok]) * 1000


def fit_scrape_stall(real_csv: str | os.PathLike | None = None, profile_name: str | None = None) -> dict[str, Any]:
    """Seconds per label series: ``curve_fit`` of the runs' P99 TTFT (relative errors)."""
    real_csv = real_csv or default_real_csv()
    runs = scrape_fit_runs(load_real(real_csv))
    if len(runs) < 5:
        raise ValueError(f"only {len(runs)} {FIT_SOURCE} runs without a queue in {real_csv}; need at least 5")
    times = [engine_times(r, profile_name) for _, r in runs.iterrows()]
    y = runs["p99_ttft_ms"].to_numpy(float)

    def p99_us(idx: np.ndarray, us_per_label: float) -> np.ndarray:
        return np.array([np.percentile(client_ttft_ms(times[int(i)], us_per_label * 1e-6), 99) for i in idx])

    idx = np.arange(len(times), dtype=float)
    (us,), cov = curve_fit(p99_us, idx, y, p0=[5.0], sigma=y, epsfcn=0.0025)
    before, after = p99_us(idx, 0.0), p99_us(idx, us)
    labels = [len(label_times(t["arrival"], t["first_token"], t["finish"], t["adapter"], t["horizon"])) for t in times]
    smape = lambda p: float(np.mean(np.abs(p - y) / (np.abs(p) + np.abs(y))) * 100)  # noqa: E731 -- published convention
    table = pd.DataFrame({"run_id": runs["run_id"].to_numpy(), "served": runs["served_adapters"].to_numpy(),
                          "label_series": labels, "real_p99_ms": y, "twin_p99_ms_without": before.round(1),
                          "twin_p99_ms_with": after.round(1)})
    return {"s_per_label": float(us) * 1e-6, "us_per_label": float(us), "us_per_label_sd": float(np.sqrt(cov[0, 0])),
            "runs": int(len(runs)), "unit": "s per label series",
            "p99_smape_without": smape(before), "p99_smape_with": smape(after),
            "runs_table": table.to_dict(orient="records")}


if __name__ == "__main__":  # pragma: no cover - a one-off fit, printed
    import json

    print(json.dumps(fit_scrape_stall(), indent=2))
