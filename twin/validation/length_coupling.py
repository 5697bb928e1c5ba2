"""The prompt-output length coupling of the real runs' request pool, from their KV gauges.

The real runs record the running requests and the KV-cache usage together (Prometheus gauges,
``ts_mean_running``, ``ts_mean_kv_usage``). Where the server has no queue and the KV cache is
far from full, their ratio -- KV tokens held per running request -- depends on the request
lengths only: a request holds ``p + g`` tokens while it decodes its ``g``-th token, for ``o``
steps, so the time average over running requests is

    kv_per_running = E[o (p + (o + 1) / 2)] / E[o] + b,

with ``b = (block_size - 1) / 2`` tokens of the last, partly filled KV block (vLLM allocates
16-token blocks). With the independent ShareGPT marginals the twin uses (means matched to the
run's prompt pool, ~223 / 196) this is ~440 tokens, and the twin's own gauges read 439; the
real runs read ~360 at every load (``results/validation/README.md``). The per-request means
match the real runs (real output tokens per finished request 194 vs pool mean 196), so the
marginals are not the cause: long prompts come with short answers in ShareGPT conversations.

:func:`fit_prompt_output_corr` fits the one constant this identifies, the Gaussian-copula
correlation ``rho`` between prompt and output length (dimensionless;
:class:`traces.lengths.ShareGPTLengths`, ``prompt_output_corr``), to the median of the
``dt_modelling`` (fit split) runs without a queue and with mean KV usage below 0.5; the
``ml_test`` runs are not read. The value used by the validation is
:data:`twin.validation.recreate.PROMPT_OUTPUT_CORR`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import brentq

from traces.lengths import ShareGPTLengths
from twin.perf.profile import Profile

BLOCK_SIZE = 16
#: mean unfilled tokens of a request's last KV block (tokens)
BLOCK_ROUNDING_TOKENS = (BLOCK_SIZE - 1) / 2
#: runs whose gauges measure the lengths alone: no queue, KV cache at most half full
LIGHT_MAX_WAITING = 1.0
LIGHT_MAX_KV_USAGE = 0.5
FIT_SOURCE = "dt_modelling"


def real_kv_per_running(real: pd.DataFrame, profile: Profile) -> pd.Series:
    """KV tokens per running request of each light ``dt_modelling`` run: mean KV usage x the
    KV capacity of its (slots, max rank) from the profile / mean running requests."""
    r = real[(real["source"] == FIT_SOURCE) & (real["status"] == "ok") & (real["ts_mean_running"] > 0)
             & (real["ts_mean_waiting"] < LIGHT_MAX_WAITING) & (real["ts_mean_kv_usage"] < LIGHT_MAX_KV_USAGE)]
    cap = np.array([profile.kv_capacity_tokens(int(g), int(m)) for g, m in zip(r["adapter_slots"],
                                                                                 r["max_lora_rank"])], float)
    return pd.Series(r["ts_mean_kv_usage"].to_numpy(float) * cap / r["ts_mean_running"].to_numpy(float),
                     index=r.index, name="real_kv_tokens_per_running")


def model_kv_per_running(model: ShareGPTLengths, rho: float, n: int = 200_000, seed: int = 0) -> float:
    """``E[o (p + (o + 1)/2)] / E[o] + b`` of ``model`` with coupling ``rho`` (tokens), from
    ``n`` seeded draws (the same draws for every ``rho``: a smooth function of it)."""
    m = ShareGPTLengths(model.knots_in, model.knots_out, model.filt, model.method, model.par_in, model.par_out, rho)
    p, o = m.sample(n, np.random.default_rng(seed))
    p, o = p.astype(float), o.astype(float)
    return float((o * (p + (o + 1) / 2)).sum() / o.sum() + BLOCK_ROUNDING_TOKENS)


def fit_prompt_output_corr(real: pd.DataFrame, profile: Profile, model: ShareGPTLengths) -> dict[str, Any]:
    """``rho`` that makes :func:`model_kv_per_running` equal the median real KV tokens per running
    request of the light ``dt_modelling`` runs (root-finding on one monotone function)."""
    kv = real_kv_per_running(real, profile)
    if len(kv) < 5:
        raise ValueError(f"only {len(kv)} light {FIT_SOURCE} runs with gauges; need at least 5")
    target = float(np.median(kv))
    f = lambda r: model_kv_per_running(model, r) - target  # noqa: E731
    lo, hi = -0.9, 0.5
    if f(lo) > 0 or f(hi) < 0:
        raise ValueError(f"real KV tokens per running request {target:.0f} is out of the model's reach "
                         f"({f(lo) + target:.0f}..{f(hi) + target:.0f})")
    rho = float(brentq(f, lo, hi, xtol=1e-4))
    return {"rho": rho, "runs": int(len(kv)), "real_median_tokens": target,
            "independent_tokens": model_kv_per_running(model, 0.0), "unit": "dimensionless (Gaussian copula)"}
