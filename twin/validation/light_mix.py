"""The profile's step in the real runs without a queue, against their mean TPOT (issue 17).

Where no request waits, a run's steps are of two kinds: decode steps of the running batch, and steps
that also prefill an arriving prompt (a share ``lambda x TPOT`` of them, ``lambda`` the request rate).
The client's mean TPOT is the engine's time per output token; unlike the mean ITL it does not depend
on how the tokens were chunked on the way (the scrape stall merges chunks where the steps are
small, :func:`twin.scrape_stall.merged_gaps`). So :func:`step_at_light_mix` evaluates the profile's
step (:meth:`twin.perf.profile.Profile.step_s`, the engine's own formula) at each such run's own
mean composition, from its gauges: ``R`` running requests (all decoding), ``A`` the expected
distinct adapters among them at the adapters' rates (at most the slots), ``C`` = mean KV usage x the
KV capacity, and steps with a prefill of the pool's mean prompt weighted by their share. It
separates the step model from the twin's dynamics: in these runs the twin's running batch follows
its own step (Little's law), so a step priced too high shows up amplified in its TPOT and TTFT.
Nothing is fitted here; :mod:`twin.validation.light_step` is the command line.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from twin.perf.profile import Profile
from twin.validation.specs import spec_from_row

#: A run without a queue: mean waiting requests (gauge) below this ...
LIGHT_MAX_WAITING = 1.0
#: ... and mean KV usage below this (no preemption).
LIGHT_MAX_KV_USAGE = 0.5
#: Slot ranges of the summary.
SLOT_BINS = ((0, 16), (16, 32), (32, 64), (64, 128), (128, 512))

_COLUMNS = {"ts_mean_running", "ts_mean_waiting", "ts_mean_kv_usage", "input_tok_s", "real_tpot", "rates",
            "served_adapters", "adapter_slots", "max_lora_rank", "pool_mean_input_tokens", "pool_mean_output_tokens"}


def light_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The runs without a queue (gauges: mean waiting < 1, mean KV usage < 0.5) with a TPOT."""
    if not _COLUMNS <= set(runs.columns):
        return runs.iloc[0:0]
    return runs[(runs["ts_mean_waiting"] < LIGHT_MAX_WAITING) & (runs["ts_mean_kv_usage"] < LIGHT_MAX_KV_USAGE)
                & (runs["real_tpot"] > 0) & (runs["ts_mean_running"] > 0)]


def _step_at_light_mix(r: pd.Series, prof: Profile) -> dict[str, Any]:
    spec = spec_from_row(r)
    G, n = spec.slots, spec.served
    share = spec.adapter_rates / spec.adapter_rates.sum()
    R, W = float(r["ts_mean_running"]), float(r["ts_mean_waiting"])
    A = min(float(G), float(np.sum(1.0 - (1.0 - share) ** R)))
    tpot = float(r["real_tpot"]) / 1000.0
    rate = float(r["input_tok_s"]) / spec.mean_in  # requests per second
    f = min(1.0, rate * tpot)  # share of the steps that prefill a prompt
    C = float(r["ts_mean_kv_usage"]) * float(prof.kv_capacity_tokens(G, spec.max_rank))
    D = max(int(round(R)), 1)
    P = int(round(spec.mean_in))
    decode = prof.step_s(0, D, C, D, A, spec.max_rank, G, R, W, n)
    prefill = prof.step_s(P, D - 1, C, D, A, spec.max_rank, G, R, W, n)
    step = (1.0 - f) * decode + f * prefill
    return {"run_id": r.get("run_id", ""), "source": r.get("source", ""), "slots": G, "served": n, "running": R,
            "adapters": A, "prefill_share": f, "model_step_ms": step * 1000.0, "real_tpot_ms": tpot * 1000.0,
            "ratio": tpot / step}


def step_at_light_mix(runs: pd.DataFrame, prof: Profile) -> pd.DataFrame:
    """One row per run without a queue: the profile's step at its mean composition, its real mean
    TPOT and ``ratio`` = real TPOT / model step (below 1: the model is too slow)."""
    light = light_runs(runs)
    return pd.DataFrame([_step_at_light_mix(r, prof) for _, r in light.iterrows()])


def light_summary(mix: pd.DataFrame) -> dict[str, Any]:
    """Medians of :func:`step_at_light_mix`'s ratio overall and by slot range, and the SMAPE (published
    convention) of the model step against the real TPOT."""
    if not len(mix):
        return {}
    G = mix["slots"]
    m, y = mix["model_step_ms"], mix["real_tpot_ms"]
    out: dict[str, Any] = {"runs": int(len(mix)), "median": round(float(mix["ratio"].median()), 4),
                           "smape": round(float(100 * np.mean(np.abs(m - y) / (np.abs(m) + np.abs(y)))), 3),
                           "by_slots": {}}
    for lo, hi in SLOT_BINS:
        b = (G > lo) & (G <= hi)
        if b.any():
            out["by_slots"][f"slots {lo + 1}-{hi}"] = {"runs": int(b.sum()),
                                                       "median": round(float(mix.loc[b, "ratio"].median()), 4)}
    out["note"] = ("real mean TPOT over the profile's step (scheduler + backbone + LoRA, steps with a prefill at "
                   "their share) at the run's mean composition, runs without a queue (see step_at_light_mix)")
    return out
