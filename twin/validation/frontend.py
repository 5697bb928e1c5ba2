"""The requests' front-end latency outside the engine, from the fit split's runs without a queue.

What the real client measures as TTFT is the time from just before it sends the HTTP request to
the first streamed chunk it reads (vLLM's ``benchmark_serving``). Besides the engine's part (the
wait for the running step to end, the prefill steps; :mod:`twin.engine`), that holds the
request's path outside the engine in vLLM 0.8.5 v1: the client's request, the API server's
parsing and tokenisation, the hand-over to the engine-core process (ZMQ), and on the way back the
engine core's output, the API server's detokenisation and the streamed chunk. Every token takes
the way back, so the client's ITL does not see it; TTFT and E2E do
(:func:`twin.simulate.simulate`'s ``frontend_s``, :mod:`twin.metrics`).

Where the server never queued, the twin's engine TTFT is ~7 ms short of the real mean TTFT at
every load (0.5-15.6 req/s) while its decode ITL matches (within +2..+10 %): an additive term per
request, not a per-token or per-step one. The real P99 is also ~10 ms above the twin's there, not
the several-fold a prefill cost per prompt token would give (the P99 request has a ~4x longer
prompt than the mean one).

:func:`fit_frontend_latency` fits the one constant this identifies (seconds): the median, over
the ``dt_modelling`` (fit split) runs whose waiting-queue gauge never left 0 and with at most
:data:`MAX_SERVED` served adapters, of real mean TTFT - the twin's mean TTFT without the term.
Runs with more served adapters are left out: their real TTFT has a tail the twin does not model
(P99 3-9x the median from 32 served adapters on, against ~1.9x up to 16), which would be read
as front-end time. The fit runs without the metrics scrape's stall (:mod:`twin.scrape_stall`),
which is fitted after it with this latency fixed (:mod:`twin.validation.scrape_stall`); with the
stall on, the same median is 7.23 ms (the stall adds ~0.3 ms to the mean of these runs). The
``ml_test`` runs are not read. The value the validation uses is
:data:`twin.validation.specs.FRONTEND_LATENCY_S`; ``python -m twin.validation.frontend``
recomputes it (about a minute).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from twin.validation.runner import run_validation
from twin.validation.specs import default_real_csv, load_real

FIT_SOURCE = "dt_modelling"
#: runs whose TTFT is front-end + engine alone: at most this many served adapters (see the docstring)
MAX_SERVED = 16


def frontend_fit_runs(real: pd.DataFrame) -> pd.DataFrame:
    """The fit-split runs that identify the front-end latency: ok, never queued, <= MAX_SERVED adapters."""
    return real[(real["source"] == FIT_SOURCE) & (real["status"] == "ok") & (real["ts_max_waiting"] == 0)
                & (real["served_adapters"] <= MAX_SERVED) & real["mean_ttft_ms"].notna()]


def fit_frontend_latency(real_csv: str | os.PathLike | None = None, jobs: int = 1) -> dict[str, Any]:
    """The front-end latency (s): median over :func:`frontend_fit_runs` of real mean TTFT - the
    twin's mean TTFT re-created with ``frontend_s = 0`` and no scrape stall (everything else as
    ``twin validate``)."""
    real_csv = real_csv or default_real_csv()
    runs = frontend_fit_runs(load_real(real_csv))
    if len(runs) < 5:
        raise ValueError(f"only {len(runs)} {FIT_SOURCE} runs without a queue and <= {MAX_SERVED} served "
                         f"adapters in {real_csv}; need at least 5")
    res = run_validation(real_csv, peer_csv=False, jobs=jobs, run_ids=runs["run_id"], frontend_s=0.0,
                         scrape_s_per_label=0.0)
    r = res.runs[res.runs["twin_status"] == "ok"]
    diff_ms = (r["real_ttft_mean"] - r["twin_ttft_mean"]).to_numpy(float)
    med_ms = (r["real_ttft_median"] - r["twin_ttft_median"]).to_numpy(float)
    p99_ms = (r["real_ttft_p99"] - r["twin_ttft_p99"]).to_numpy(float)
    itl_ratio = (r["twin_itl"] / r["real_itl"]).to_numpy(float)
    return {"frontend_s": float(np.median(diff_ms)) / 1000, "runs": int(len(r)), "unit": "s",
            "mean_ttft_gap_ms": sorted(np.round(diff_ms, 2).tolist()),
            "median_ttft_gap_ms_median": float(np.median(med_ms)), "p99_ttft_gap_ms_median": float(np.median(p99_ms)),
            "twin_over_real_itl": [float(np.min(itl_ratio)), float(np.max(itl_ratio))]}


if __name__ == "__main__":  # pragma: no cover - a one-off fit, printed
    import json

    print(json.dumps(fit_frontend_latency(), indent=2))
